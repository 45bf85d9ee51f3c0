package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/zclaim/zclaim"
)

// The roles run as separate OS processes, started by the orchestrator with
// -role NAME. They talk to the main Redis through the orchestrator's proxy
// (so that it can cut their connections) and to the sink directly.

const (
	brokerLease = 2 * time.Second
	idemLease   = 2 * time.Second
)

type roleFlags struct {
	redis, sink, key, queue, log string
	jobs                         int
	over                         time.Duration
	wait                         int    // WaitReplicas
	cluster                      string // Redis Cluster nodes, comma-separated: -redis is ignored
	shards                       int    // BrokerOptions.Shards
}

func parseRole(args []string) roleFlags {
	fs := flag.NewFlagSet("role", flag.ExitOnError)
	var f roleFlags
	fs.StringVar(&f.redis, "redis", "", "main Redis (through the proxy)")
	fs.StringVar(&f.sink, "sink", "", "sink Redis")
	fs.StringVar(&f.key, "key", "", "schedule key")
	fs.StringVar(&f.queue, "queue", "", "asynq queue")
	fs.StringVar(&f.log, "log", "", "producer log")
	fs.IntVar(&f.jobs, "jobs", 0, "jobs to produce")
	fs.DurationVar(&f.over, "over", 0, "produce over this long")
	fs.IntVar(&f.wait, "wait", 0, "replicas every write waits for (WaitReplicas)")
	fs.StringVar(&f.cluster, "cluster", "", "Redis Cluster nodes, comma-separated (instead of -redis)")
	fs.IntVar(&f.shards, "shards", 1, "shards of the schedule")
	fs.Parse(args)
	return f
}

func mainClient(f roleFlags) redis.UniversalClient {
	if f.cluster != "" {
		return redis.NewClusterClient(&redis.ClusterOptions{Addrs: strings.Split(f.cluster, ","), MaxRetries: 2,
			DialTimeout: 500 * time.Millisecond, ReadTimeout: time.Second, WriteTimeout: time.Second, PoolSize: 32})
	}
	return redis.NewClient(&redis.Options{Addr: f.redis, MaxRetries: 2, DialTimeout: 500 * time.Millisecond,
		ReadTimeout: time.Second, WriteTimeout: time.Second, PoolSize: 32})
}

func jsonLogger() *slog.Logger {
	return slog.New(slog.NewJSONHandler(os.Stdout, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

func until(ctx context.Context) context.Context {
	ctx, _ = signal.NotifyContext(ctx, syscall.SIGTERM, os.Interrupt)
	return ctx
}

// producer schedules f.jobs jobs over f.over, each due 0–2 s after it is
// scheduled, and logs each id and due time after Redis accepted it.
func producer(f roleFlags) {
	ctx := until(context.Background())
	rdb := mainClient(f)
	b, err := zclaim.NewBroker(rdb, zclaim.BrokerOptions{Key: f.key, WaitReplicas: f.wait, Shards: f.shards,
		Logger: slog.Default()}) // to the role's .err file
	if err != nil {
		panic(err)
	}
	out, err := os.Create(f.log)
	if err != nil {
		panic(err)
	}
	w := bufio.NewWriter(out)
	const batch = 20
	step := f.over / time.Duration(max(1, f.jobs/batch))
	for i := 0; i < f.jobs && ctx.Err() == nil; i += batch {
		var jobs []zclaim.Job
		for j := i; j < min(i+batch, f.jobs); j++ {
			due := time.Now().Add(time.Duration(rand.IntN(2000)) * time.Millisecond).Truncate(time.Millisecond)
			p, _ := json.Marshal(payload{Due: due.UnixMicro()})
			jobs = append(jobs, zclaim.Job{ID: "job-" + strconv.Itoa(j), RunAt: due, Type: "chaos", Payload: p, Queue: f.queue})
		}
		for ctx.Err() == nil {
			if err := b.Schedule(ctx, jobs...); err == nil {
				break
			}
			time.Sleep(50 * time.Millisecond) // Redis restarting or cut off: try again (Schedule replaces)
		}
		for _, j := range jobs {
			fmt.Fprintf(w, "%s %d\n", j.ID, j.RunAt.UnixMicro())
		}
		time.Sleep(step)
	}
	w.Flush()
	out.Sync()
	out.Close()
}

type payload struct {
	Due int64 `json:"due"` // Unix µs
}

// dispatcher runs a zclaim Dispatcher until killed.
func dispatcher(f roleFlags) {
	ctx := until(context.Background())
	rdb := mainClient(f)
	b, err := zclaim.NewBroker(rdb, zclaim.BrokerOptions{Key: f.key, Lease: brokerLease, Logger: jsonLogger(), WaitReplicas: f.wait, Shards: f.shards,
		Backoff: func(a int) time.Duration { return time.Duration(50+rand.IntN(200)) * time.Millisecond }})
	if err != nil {
		panic(err)
	}
	// As in the README's Faster: tasks enqueued through an asynq client on
	// an autopipelined go-redis client, and none kept once finished
	// (TaskRetention -1): the workers' middleware skips an occurrence
	// dispatched again.
	d, err := zclaim.NewDispatcher(b, asynq.NewClientFromRedisClient(autopipelined(rdb)), zclaim.DispatcherOptions{TaskRetention: -1,
		RecoveryInterval: 200 * time.Millisecond, EnqueueTimeout: time.Second, MaxWait: 200 * time.Millisecond,
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		panic(err)
	}
	d.Run(ctx)
}

// autopipelined is rdb's autopipelined client (rdb where it has none).
func autopipelined(rdb redis.UniversalClient) redis.UniversalClient {
	var ap *redis.AutoPipeliner
	var err error
	switch c := rdb.(type) {
	case *redis.Client:
		ap, err = c.AutoPipeline()
	case *redis.ClusterClient:
		ap, err = c.AutoPipeline()
	default:
		return rdb
	}
	if err != nil {
		panic(err)
	}
	return ap
}

// sinkScript applies a side effect once per key, fenced by token:
// a token lower than one seen for the key is stale; a key applied already
// is a duplicate. It records every attempt and early starts by its TIME.
// KEYS[1] applied (key -> token)  KEYS[2] max token seen  KEYS[3] attempts  KEYS[4] counters
// KEYS[5] the times of re-runs (Unix µs), a list
// KEYS[6] how late first runs more than a second after their due time came
// (µs), a list
// ARGV key, token (-1: a worker without the middleware, which has none),
// due (Unix µs). Returns "applied", "dup" or "stale".
var sinkScript = redis.NewScript(`
local key, tok, due = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
if now < due then redis.call('HINCRBY', KEYS[4], 'early', 1) end
if redis.call('HINCRBY', KEYS[3], key, 1) > 1 then
  redis.call('RPUSH', KEYS[5], now)
elseif now - due > 1000000 then
  redis.call('RPUSH', KEYS[6], now - due)
end
local seen = tonumber(redis.call('HGET', KEYS[2], key) or '0')
if tok >= 0 and tok < seen then redis.call('HINCRBY', KEYS[4], 'stale', 1) return 'stale' end
redis.call('HSET', KEYS[2], key, ARGV[2])
if redis.call('HEXISTS', KEYS[1], key) == 1 then redis.call('HINCRBY', KEYS[4], 'dup', 1) return 'dup' end
redis.call('HSET', KEYS[1], key, ARGV[2])
redis.call('HINCRBY', KEYS[4], 'applied', 1)
return 'applied'`)

var sinkKeys = []string{"sink:applied", "sink:maxtoken", "sink:attempts", "sink:counters", "sink:reruns", "sink:late"}

// worker runs an asynq server whose handler applies a side effect to the
// sink, wrapped in the idempotency middleware; plain, without it (a server
// of a rolling deploy that has not taken zclaim up yet), on a client of
// its own.
func worker(f roleFlags, plain bool) {
	ctx := until(context.Background())
	rdb := mainClient(f)
	sink := redis.NewClient(&redis.Options{Addr: f.sink})
	idem, err := zclaim.NewIdempotency(rdb, zclaim.IdempotencyOptions{Prefix: f.key + ":run:", Lease: idemLease, WaitReplicas: f.wait,
		Logger: slog.Default()}) // to the role's .err file
	if err != nil {
		panic(err)
	}
	mux := asynq.NewServeMux()
	if !plain {
		mux.Use(idem.Middleware())
	}
	mux.HandleFunc("chaos", func(ctx context.Context, t *asynq.Task) error {
		token := int64(-1)
		if e, ok := zclaim.ExecutionFromContext(ctx); ok {
			token = e.Token
		}
		job, _ := zclaim.JobFromTask(t) // the sink keeps one application per job id
		var p payload
		if err := json.Unmarshal(t.Payload(), &p); err != nil {
			return err
		}
		time.Sleep(time.Duration(rand.IntN(40)) * time.Millisecond) // work before the side effect
		res, err := sinkScript.Run(context.WithoutCancel(ctx), sink, sinkKeys, job.ID, token, p.Due).Text()
		if err != nil {
			return err
		}
		if res == "stale" {
			return fmt.Errorf("sink refused a stale token: %w", zclaim.ErrLeaseLost)
		}
		// Work after it: a SIGKILL here is a crash between the side effect
		// and Complete, which re-runs the handler (the sink refuses the key).
		time.Sleep(time.Duration(rand.IntN(40)) * time.Millisecond)
		return nil
	})
	client := idem.AsynqClient() // as the quick start's: Complete with asynq's done
	if plain {
		client = rdb
	}
	srv := asynq.NewServerFromRedisClient(client, asynq.Config{
		Queues:                   map[string]int{f.queue: 1},
		Concurrency:              10,
		TaskCheckInterval:        10 * time.Millisecond,
		DelayedTaskCheckInterval: 200 * time.Millisecond,
		IsFailure:                zclaim.IsFailure,
		RetryDelayFunc: func(n int, err error, t *asynq.Task) time.Duration {
			if errors.Is(err, zclaim.ErrInProgress) {
				return zclaim.RetryDelay(n, err, t)
			}
			return time.Duration(200+rand.IntN(800)) * time.Millisecond
		},
		ShutdownTimeout: time.Second,
		LogLevel:        asynq.FatalLevel,
	})
	if err := srv.Start(mux); err != nil {
		panic(err)
	}
	<-ctx.Done()
	srv.Shutdown()
	idem.Close() // as the quick start's: tasks taken ahead go back
}
