package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/hibiken/asynq"

	"github.com/redis/go-redis/v9"
	"github.com/zclaim/zclaim"
	"github.com/zclaim/zclaim/internal/proc"
)

// Scenario 6 (-only instructions; needs valgrind): Redis' own instructions
// per operation, counted by callgrind on a redis-server of its own. The
// operations run one after another, so the count does not follow how busy
// the machine is: within about 2% from run to run of the same code for
// the middleware's rows, up to 9% for the rows that claim (a count over
// more jobs, with the server's counters zeroed after the load, tells a
// small change apart better). It counts user-space instructions only (the
// kernel's network work is not in it), so it compares versions of a path,
// not paths with different round trips.
func instructionsScenario() {
	if _, err := exec.LookPath("valgrind"); err != nil {
		progress("instructions: valgrind is not on PATH; skipped")
		return
	}
	const n = 1000
	queue := ns("instr") // the asynq queue of the dispatched jobs, on the bench's Redis
	// scheduleN fills a schedule with count due jobs, each with a type and
	// a queue as the dispatcher needs; scheduleDue with more than 2n claims
	// of 32 take. The setup is counted in both runs, and its count moves a
	// little from server to server (a sorted set's levels are random): no
	// larger than an operation needs.
	scheduleN := func(count int) func(ctx context.Context, rdb *redis.Client) error {
		return func(ctx context.Context, rdb *redis.Client) error {
			b, err := zclaim.NewBroker(rdb, zclaim.BrokerOptions{Lease: time.Minute})
			if err != nil {
				return err
			}
			jobs := make([]zclaim.Job, count)
			for j := range jobs {
				jobs[j] = zclaim.Job{ID: "j" + strconv.Itoa(j), RunAt: time.Now().Add(-time.Second), Type: "t", Queue: queue}
			}
			return b.Schedule(ctx, jobs...)
		}
	}
	scheduleDue := scheduleN(32*2*n + 256)
	ops := []struct {
		name  string
		jobs  int                                                // jobs per operation: the count is per job
		setup func(ctx context.Context, rdb *redis.Client) error // the same for n and 2n
		run   func(ctx context.Context, rdb *redis.Client, k int) error
	}{
		{"Idempotency Begin + Complete, one new key", 1, nil, func(ctx context.Context, rdb *redis.Client, k int) error {
			i, err := zclaim.NewIdempotency(rdb, zclaim.IdempotencyOptions{})
			if err != nil {
				return err
			}
			for j := range k {
				e, err := i.Begin(ctx, "k"+strconv.Itoa(j))
				if err != nil {
					return err
				}
				if err := e.Complete(ctx); err != nil {
					return err
				}
			}
			return nil
		}},
		{"asynq's dequeue of a task (v0.26's script), per task", 1, pendingN(queue, 2*n), dequeueOp(queue, "")},
		{"the same through the store's AsynqClient: dequeue.lua, asynq's writes and the task's holder mark, per task",
			1, pendingN(queue, 2*n), dequeueOp(queue, zclaim.DefaultIdempotencyPrefix)},
		{"floor of Begin + Complete: plain SET NX GET, then SET", 1, nil, func(ctx context.Context, rdb *redis.Client, k int) error {
			for j := range k {
				key := "k" + strconv.Itoa(j)
				if err := rdb.SetArgs(ctx, key, "run 1 2", redis.SetArgs{Mode: "NX", Get: true, TTL: time.Hour}).Err(); err != nil && err != redis.Nil {
					return err
				}
				if err := rdb.Set(ctx, key, "done", time.Hour).Err(); err != nil {
					return err
				}
			}
			return nil
		}},
		{"two scripts that only return, with Begin's and Complete's keys and arguments (2 keys each; 1 argument, then 3)", 1, nil,
			func(ctx context.Context, rdb *redis.Client, k int) error {
				s := redis.NewScript("return 1")
				for j := range k {
					keys := []string{"k" + strconv.Itoa(j), "b"}
					if err := s.Run(ctx, rdb, keys, "0123456789abcdef").Err(); err != nil {
						return err
					}
					if err := s.Run(ctx, rdb, keys, "run 1787991500000000 1787991505000", "0123456789abcdef", 1787991505000).Err(); err != nil {
						return err
					}
				}
				return nil
			}},
		{"Broker.Claim of 32 + AckMany, per job (jobs with a type and queue)", 32, scheduleDue, func(ctx context.Context, rdb *redis.Client, k int) error {
			b, err := zclaim.NewBroker(rdb, zclaim.BrokerOptions{Lease: time.Minute})
			if err != nil {
				return err
			}
			for range k {
				cs, err := b.Claim(ctx, 32)
				if err != nil {
					return err
				}
				if _, err := b.AckMany(ctx, cs...); err != nil {
					return err
				}
			}
			return nil
		}},
		{"Dispatcher: batch claim + settle, per job (asynq on another server)", 32, scheduleDue, dispatchOp(queue, false)},
		{"the same, with an OnDispatch hook (claims read due times)", 32, scheduleDue, dispatchOp(queue, true)},
		{"asynq Client.Enqueue of the task a dispatcher sends (TaskID, Retention, queue), per task", 1, nil,
			func(ctx context.Context, rdb *redis.Client, k int) error {
				ac := asynq.NewClientFromRedisClient(rdb)
				for j := range k {
					if _, err := ac.EnqueueContext(ctx, asynq.NewTask("t", nil), asynq.TaskID("p"+strconv.Itoa(j)),
						asynq.Retention(91*time.Second), asynq.Queue(queue)); err != nil {
						return err
					}
				}
				return nil
			}},
		{"the dispatcher's two scripts alone: claim.lua of 100 ids + finish.lua, per job", 10,
			scheduleN(100*2*n/10 + 100), batchScriptsOp},
		{"the same scripts, of jobs written as ids (a plain ZADD, as a migrated producer writes them)", 10,
			zaddN(100*2*n/10 + 100), batchScriptsOp},
		{"table 1's in-flight script (ZRANGEBYSCORE, ZREM, ZADD to an in-flight ZSet) of 100, per job", 10,
			zaddN(100*2*n/10 + 100), inflightOp},
		{"Broker.Claim of 100, per job: jobs written as ids (a plain ZADD)", 10, zaddN(100*2*n/10 + 100), claimOp},
		{"Broker.Claim of 100, per job: jobs written by Schedule with a type and a queue", 10,
			scheduleN(100*2*n/10 + 100), claimOp},
	}
	var rows [][]string
	for _, op := range ops {
		progress("instructions: %s", op.name)
		// The difference between 2n and n operations leaves out start-up,
		// connection set-up and script loading.
		runs := func(k int) func(context.Context, *redis.Client) error {
			return func(ctx context.Context, rdb *redis.Client) error {
				if op.setup != nil {
					if err := op.setup(ctx, rdb); err != nil {
						return err
					}
				}
				return op.run(ctx, rdb, k)
			}
		}
		one, err1 := callgrindRedis(runs(n))
		two, err2 := callgrindRedis(runs(2 * n))
		if err1 != nil || err2 != nil {
			progress("instructions: %v %v", err1, err2)
			return
		}
		per := float64(two-one) / float64(n*op.jobs)
		rows = append(rows, []string{op.name, fmt.Sprintf("%.1fk", per/1000)})
	}
	table("6. Redis instructions per operation (callgrind)", []string{"operation", "instructions"}, rows,
		"Counted by `valgrind --tool=callgrind` on a redis-server serving the operations one after another: within about 2% from run to run of the same code on one VM (up to 8% from one VM to another) for Begin + Complete, the floors and the dequeues; the rows that claim move by up to 9% between runs of the same code, and the Dispatcher's rows have batches as large as its pace lets them be. Its scripts alone take 100 jobs a batch. The AsynqClient's dequeues take up to 8 tasks a call, as an asynq server's would here. "+
			"The row of asynq's own Enqueue counts the task's writes. "+
			"User-space only: compare versions of one path with it, not paths with different round trips.")
}

// zaddN adds count due ids to the default schedule, as a producer's plain
// ZADD does.
func zaddN(count int) func(ctx context.Context, rdb *redis.Client) error {
	return func(ctx context.Context, rdb *redis.Client) error {
		due := float64(time.Now().Add(-time.Second).Unix())
		zs := make([]redis.Z, count)
		for j := range zs {
			zs[j] = redis.Z{Score: due, Member: "j" + strconv.Itoa(j)}
		}
		return rdb.ZAdd(ctx, zclaim.DefaultKey, zs...).Err()
	}
}

// claimOp takes k/10 claims of 100 due jobs with Broker.Claim, leaving
// them in flight.
func claimOp(ctx context.Context, rdb *redis.Client, k int) error {
	b, err := zclaim.NewBroker(rdb, zclaim.BrokerOptions{Lease: time.Hour})
	if err != nil {
		return err
	}
	for range k / 10 {
		cs, err := b.Claim(ctx, 100)
		if err != nil {
			return err
		}
		if len(cs) != 100 {
			return fmt.Errorf("a claim of 100 took %d", len(cs))
		}
	}
	return nil
}

// inflightOp runs table 1's in-flight script k/10 times on 100 due ids,
// leaving them in its in-flight ZSet.
func inflightOp(ctx context.Context, rdb *redis.Client, k int) error {
	keys := []string{zclaim.DefaultKey, zclaim.DefaultKey + ":inflight"}
	for range k / 10 {
		ids, err := inflightLua.Run(ctx, rdb, keys, 100).StringSlice()
		if err != nil {
			return err
		}
		if len(ids) != 100 {
			return fmt.Errorf("the in-flight script took %d of 100", len(ids))
		}
	}
	return nil
}

// dispatchOp dispatches 32k jobs (64k for k = 2n) into asynq, with or
// without an OnDispatch hook, through an asynq client of the bench's
// Redis.
func dispatchOp(queue string, hook bool) func(ctx context.Context, rdb *redis.Client, k int) error {
	return func(ctx context.Context, rdb *redis.Client, k int) error {
		b, err := zclaim.NewBroker(rdb, zclaim.BrokerOptions{Lease: time.Minute})
		if err != nil {
			return err
		}
		ac := asynq.NewClient(asynq.RedisClientOpt{Addr: redisAddr})
		defer ac.Close()
		defer func() {
			admin := newClient(1)
			dropKeys(admin, queue)
			admin.SRem(context.Background(), "asynq:queues", queue)
			admin.Close()
		}()
		opts := zclaim.DispatcherOptions{RecoveryInterval: -1}
		if hook {
			opts.OnDispatch = func(zclaim.JobInfo, time.Duration, error) {}
		}
		d, err := zclaim.NewDispatcher(b, ac, opts)
		if err != nil {
			return err
		}
		dctx, stop := context.WithCancel(ctx)
		ran := make(chan struct{})
		go func() { d.Run(dctx); close(ran) }()
		for s := d.Stats(); s.Enqueued+s.Conflicts+s.Dead < int64(32*k); s = d.Stats() {
			time.Sleep(time.Millisecond)
		}
		stop()
		<-ran
		return nil
	}
}

// asynqDequeue is asynq v0.26's dequeue script (internal/rdb).
var asynqDequeue = redis.NewScript(`
if redis.call("EXISTS", KEYS[2]) == 0 then
	local id = redis.call("RPOPLPUSH", KEYS[1], KEYS[3])
	if id then
		local key = ARGV[2] .. id
		redis.call("HSET", key, "state", "active")
		redis.call("HDEL", key, "pending_since")
		redis.call("ZADD", KEYS[4], ARGV[1], id)
		return redis.call("HGET", key, "msg")
	end
end
return nil`)

// pendingN enqueues count tasks of type "t" into queue on the counted
// server, each with an occurrence's TaskID, as a dispatcher names them.
func pendingN(queue string, count int) func(ctx context.Context, rdb *redis.Client) error {
	return func(ctx context.Context, rdb *redis.Client) error {
		ac := asynq.NewClientFromRedisClient(rdb)
		due := time.Date(2026, 12, 1, 8, 0, 0, 0, time.UTC)
		for j := range count {
			if _, err := ac.EnqueueContext(ctx, asynq.NewTask("t", nil), asynq.Queue(queue),
				asynq.TaskID(zclaim.OccurrenceID("order-"+strconv.Itoa(j), due))); err != nil {
				return err
			}
		}
		return nil
	}
}

// dequeueOp dequeues k tasks of queue as asynq's processor does: on the
// plain client (prefix ""), or through the AsynqClient of a store of
// prefix.
func dequeueOp(queue, prefix string) func(ctx context.Context, rdb *redis.Client, k int) error {
	return func(ctx context.Context, rdb *redis.Client, k int) error {
		var c redis.UniversalClient = rdb
		if prefix != "" {
			// A lease long enough that the tasks taken ahead stay (Close is
			// not called) on the counted server.
			i, err := zclaim.NewIdempotency(rdb, zclaim.IdempotencyOptions{Prefix: prefix, Lease: time.Hour, DisableTakeover: true})
			if err != nil {
				return err
			}
			c = i.AsynqClient()
		}
		p := "asynq:{" + queue + "}:"
		keys := []string{p + "pending", p + "paused", p + "active", p + "lease"}
		for range k {
			if err := asynqDequeue.Run(ctx, c, keys, time.Now().Add(30*time.Second).Unix(), p+"t:").Err(); err != nil {
				return err
			}
		}
		return nil
	}
}

// callgrindRedis runs work against a redis-server under callgrind and
// returns the instructions the server executed in all.
func callgrindRedis(work func(context.Context, *redis.Client) error) (int64, error) {
	dir, err := os.MkdirTemp("", "zclaim-callgrind-")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(dir)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	port := strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
	l.Close()
	out := filepath.Join(dir, "callgrind.out")
	cmd := exec.Command("valgrind", "--tool=callgrind", "--callgrind-out-file="+out,
		"redis-server", "--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", dir,
		// Its timer work grows with wall time, which callgrind stretches:
		// a rare timer, and hash tables rehashed only as commands touch them.
		"--hz", "1", "--activerehashing", "no")
	proc.DieWithParent(cmd)
	if err := cmd.Start(); err != nil {
		return 0, err
	}
	// No retries: SHUTDOWN closes the connection, and a retry would dial a
	// server that is gone.
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:" + port, ReadTimeout: time.Minute, MaxRetries: -1})
	defer rdb.Close()
	ctx := context.Background()
	for i := 0; ; i++ { // wait on the port first: go-redis logs each failed dial
		if c, err := net.Dial("tcp", "127.0.0.1:"+port); err == nil {
			c.Close()
			if rdb.Ping(ctx).Err() == nil {
				break
			}
		}
		if i > 300 {
			cmd.Process.Kill()
			cmd.Wait()
			return 0, fmt.Errorf("redis-server under valgrind did not start")
		}
		time.Sleep(100 * time.Millisecond)
	}
	werr := work(ctx, rdb)
	rdb.Shutdown(ctx) // the server exits; callgrind writes its counts
	cmd.Wait()
	if werr != nil {
		return 0, werr
	}
	data, err := os.ReadFile(out)
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "summary: "); ok {
			return strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		}
	}
	return 0, fmt.Errorf("no summary in the callgrind output")
}

// batchScriptsOp claims k/10 batches of 100 due jobs with the
// dispatcher's scripts (dispatcherScripts): unlike dispatchOp, whose
// claims are as large as its pace lets them be, every claim takes 100
// jobs, so the count is exact.
func batchScriptsOp(ctx context.Context, rdb *redis.Client, k int) error {
	claimSettle, err := dispatcherScripts(zclaim.DefaultKey)
	if err != nil {
		return err
	}
	for range k / 10 {
		if err := claimSettle(ctx, rdb, 100); err != nil {
			return err
		}
	}
	return nil
}

// dispatcherScripts returns what does a dispatcher's Redis work on the
// schedule key (one with a hash tag, whose keys are key + ":inflight" and
// so on): claim.lua takes up to max due ids under one lease, as the
// dispatcher claims, and finish.lua settles them all as done. The scripts
// are read from the working tree: run the bench from the repository's root.
func dispatcherScripts(key string) (func(ctx context.Context, rdb *redis.Client, max int) error, error) {
	read := func(name string) (string, error) {
		b, err := os.ReadFile(name)
		return string(b), err
	}
	hist, err0 := read("lua/history.lua")
	pre, err1 := read("lua/prelude.lua")
	claim, err2 := read("claim.lua")
	finish, err3 := read("lua/finish.lua")
	if err := errors.Join(err0, err1, err2, err3); err != nil {
		return nil, err
	}
	pre = hist + "\n" + pre
	claimS, finishS := redis.NewScript(pre+"\n"+claim), redis.NewScript(pre+"\n"+finish)
	claimKeys := []string{key, key + ":inflight", key + ":tokens", key + ":jobs", key + ":runs", key + ":batches"}
	finishKeys := []string{key, key + ":batches", key + ":jobs", key + ":runs", key + ":dead", key + ":deadinfo"}
	return func(ctx context.Context, rdb *redis.Client, max int) error {
		r, err := claimS.Run(ctx, rdb, claimKeys, max, 60000, 1, "batch-ids").Slice()
		if err != nil {
			return err
		}
		first, _ := r[1].(int64)
		if first == 0 {
			return fmt.Errorf("nothing due to claim")
		}
		jobs, _ := r[4].(string)
		n := 0 // "<len>:<id><len>:<record>" a job (prelude.lua)
		for rest := jobs; rest != ""; n++ {
			for range 2 {
				l, after, _ := strings.Cut(rest, ":")
				size, err := strconv.Atoi(l)
				if err != nil || size > len(after) {
					return fmt.Errorf("a batch's jobs that do not parse: %q", rest)
				}
				rest = after[size:]
			}
		}
		// No job's history (finish.lua's m = 0): its two scripts' own work.
		return finishS.Run(ctx, rdb, finishKeys, 1, 3, key+":notice", 0, 0, fmt.Sprintf("%d:%d", first, n), 0).Err()
	}, nil
}
