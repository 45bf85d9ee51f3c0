// Command example runs the whole zclaim flow: order reminders scheduled in
// a Redis sorted set, two dispatchers moving them into asynq the moment
// they are due, and an asynq server whose handler is wrapped in the
// idempotency middleware. It injects what the library exists for (a job
// scheduled twice, a duplicate asynq task, a worker that crashes holding
// claims) and ends with a summary. It exits 1 if any job ran twice, ran
// early, or was lost.
//
//	go run ./example                 # in-process Redis, nothing to set up
//	REDIS_URL=redis://localhost:6379 go run ./example
//	go run ./example -naive          # the racy ZRANGEBYSCORE+ZREM poller, for contrast
//	go run ./example -metrics localhost:2112   # and curl localhost:2112/metrics
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/zclaim/zclaim"
)

// config is what the flags set.
type config struct {
	jobs     int
	spread   time.Duration
	naive    bool
	deadline time.Duration
	metrics  string        // serve /metrics here while it runs
	hold     time.Duration // and this long after (0: until interrupted)
}

func main() { os.Exit(realMain(os.Args[1:], os.Stdout, os.Getenv("REDIS_URL"))) }

// realMain runs the example and returns the exit code: 0 when every job ran
// once, on time; 1 when not; 2 on a setup error.
func realMain(args []string, w io.Writer, redisURL string) int {
	fs := flag.NewFlagSet("example", flag.ContinueOnError)
	var cfg config
	fs.IntVar(&cfg.jobs, "jobs", 1000, "order reminders to schedule")
	fs.DurationVar(&cfg.spread, "over", 3*time.Second, "the reminders fall due evenly over this time")
	fs.BoolVar(&cfg.naive, "naive", false, "run the racy ZRANGEBYSCORE-then-ZREM poller instead")
	fs.DurationVar(&cfg.deadline, "timeout", 15*time.Second, "give up after this long")
	fs.StringVar(&cfg.metrics, "metrics", "", "serve Prometheus metrics at http://ADDR/metrics while it runs (ADDR such as localhost:2112)")
	fs.DurationVar(&cfg.hold, "hold", 0, "with -metrics: keep serving this long after the run (0: until Ctrl-C or SIGTERM)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	rdb, where, stop, err := connect(redisURL)
	if err != nil {
		fmt.Fprintln(os.Stderr, "example:", err)
		return 2
	}
	defer stop()
	fmt.Fprintln(w, where)

	var b [4]byte
	rand.Read(b[:])
	ns := "zclaim-example-" + hex.EncodeToString(b[:]) // keys and queue of this run only
	defer cleanup(rdb, ns)

	var ok bool
	if cfg.naive {
		ok, err = runNaive(w, rdb, ns, cfg)
	} else {
		ok, err = run(w, rdb, ns, cfg)
	}
	switch {
	case err != nil:
		fmt.Fprintln(os.Stderr, "example:", err)
		return 2
	case !ok:
		return 1
	}
	return 0
}

// connect uses redisURL, or starts an in-process Redis when it is empty.
func connect(redisURL string) (*redis.Client, string, func(), error) {
	if redisURL != "" {
		opt, err := redis.ParseURL(redisURL)
		if err != nil {
			return nil, "", nil, fmt.Errorf("REDIS_URL: %w", err)
		}
		rdb := redis.NewClient(opt)
		if err := rdb.Ping(context.Background()).Err(); err != nil {
			rdb.Close()
			return nil, "", nil, fmt.Errorf("Redis at %s: %w", opt.Addr, err)
		}
		return rdb, "using the Redis at " + opt.Addr + " (REDIS_URL)", func() { rdb.Close() }, nil
	}
	mr, err := miniredis.Run()
	if err != nil {
		return nil, "", nil, fmt.Errorf("in-process Redis: %w", err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	return rdb, "using an in-process Redis (miniredis); set REDIS_URL=redis://host:6379 to use a real one",
		func() { rdb.Close(); mr.Close() }, nil
}

// reminder is the payload of one job.
type reminder struct {
	Job   string `json:"job"`   // the job id: the unit of idempotency
	Order int    `json:"order"` // the business data
	DueUS int64  `json:"due"`   // due time in Unix µs, to check for early starts
}

type tally struct {
	mu         sync.Mutex
	runs       map[string]int
	dispatched map[string]bool
	early      int
	handleLags []time.Duration
	enqLags    []time.Duration
}

func (t *tally) handled() int { t.mu.Lock(); defer t.mu.Unlock(); return len(t.runs) }

func run(w io.Writer, rdb *redis.Client, ns string, cfg config) (bool, error) {
	ctx, cancel := context.WithTimeout(context.Background(), cfg.deadline)
	defer cancel()
	quiet := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))

	key := "zclaim:{" + ns + "}"
	queue := ns
	// Default options: a claim is leased for 30 s, and the dispatchers
	// renew the leases of the claims they are still working on.
	broker, err := zclaim.NewBroker(rdb, zclaim.BrokerOptions{Key: key, Logger: quiet})
	if err != nil {
		return false, err
	}
	idem, err := zclaim.NewIdempotency(rdb, zclaim.IdempotencyOptions{
		Prefix: key + ":run:",
		Lease:  5 * time.Second,
		Key: func(_ context.Context, t *asynq.Task) (string, error) { // the job in the payload
			var r reminder
			if err := json.Unmarshal(t.Payload(), &r); err != nil {
				return "", err
			}
			return r.Job, nil
		},
		Logger: quiet,
	})
	if err != nil {
		return false, err
	}
	defer idem.Close() // after the server's Shutdown (deferred below): sends the Completes it holds

	// Jobs late by design (claimed by a worker that crashes) are left out
	// of the lag figures.
	const numCrashed = 5
	late := map[string]bool{}
	for i := range numCrashed {
		late[newJob(queue, cfg.jobs+i, time.Time{}).ID] = true
	}

	// The asynq server: the handler sends the reminder (here: records it).
	tl := &tally{runs: map[string]int{}, dispatched: map[string]bool{}}
	var suppressed atomic.Int64
	type ranKey struct{}
	mux := asynq.NewServeMux()
	mux.Use(func(next asynq.Handler) asynq.Handler { // counts deliveries the middleware skipped
		return asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
			ran := new(bool)
			err := next.ProcessTask(context.WithValue(ctx, ranKey{}, ran), t)
			if err == nil && !*ran {
				suppressed.Add(1)
			}
			return err
		})
	}, idem.Middleware())
	mux.HandleFunc("order:reminder", func(ctx context.Context, t *asynq.Task) error {
		*ctx.Value(ranKey{}).(*bool) = true
		now, err := rdb.Time(ctx).Result()
		if err != nil {
			return err
		}
		var r reminder
		json.Unmarshal(t.Payload(), &r)
		tl.mu.Lock()
		defer tl.mu.Unlock()
		tl.runs[r.Job]++
		lag := now.Sub(time.UnixMicro(r.DueUS))
		if lag < 0 {
			tl.early++
		}
		if !late[r.Job] {
			tl.handleLags = append(tl.handleLags, lag)
		}
		return nil
	})
	srv := asynq.NewServerFromRedisClient(idem.AsynqClient(), asynq.Config{ // each run's Complete goes with asynq's done
		Queues:                   map[string]int{queue: 1},
		Concurrency:              20,
		TaskCheckInterval:        10 * time.Millisecond, // asynq's idle loop sleeps up to 1.5 s by default
		DelayedTaskCheckInterval: 100 * time.Millisecond,
		IsFailure:                zclaim.IsFailure,
		RetryDelayFunc:           zclaim.RetryDelay,
		LogLevel:                 asynq.ErrorLevel,
	})
	if err := srv.Start(mux); err != nil {
		return false, err
	}
	defer srv.Shutdown()

	// The schedule: reminders due evenly over -over, from 200 ms from now.
	now, err := rdb.Time(ctx).Result()
	if err != nil {
		return false, err
	}
	start := now.Add(200 * time.Millisecond)
	jobs := make([]zclaim.Job, cfg.jobs)
	for i := range jobs {
		at := start.Add(time.Duration(i) * cfg.spread / time.Duration(cfg.jobs)).Truncate(time.Millisecond)
		jobs[i] = newJob(queue, i, at)
	}
	if err := broker.Schedule(ctx, jobs...); err != nil {
		return false, err
	}

	// A worker that crashes (another process, whose claims are leased for
	// 1 s): it claims five reminders due now and dies without acking.
	// Recovery puts them back after their lease.
	worker, err := zclaim.NewBroker(rdb, zclaim.BrokerOptions{Key: key, Lease: time.Second, Logger: quiet})
	if err != nil {
		return false, err
	}
	var crashed []zclaim.Job
	for i := range numCrashed {
		crashed = append(crashed, newJob(queue, cfg.jobs+i, now.Add(-time.Second).Truncate(time.Millisecond)))
	}
	if err := broker.Schedule(ctx, crashed...); err != nil {
		return false, err
	}
	if _, err := worker.Claim(ctx, len(crashed)); err != nil { // ... and never acks
		return false, err
	}

	// Two dispatchers. asynq keeps no finished task (TaskRetention -1):
	// every handler runs under the middleware, whose records skip an
	// occurrence dispatched again after it finished.
	ac := asynq.NewClientFromRedisClient(rdb)
	recovered := map[string]bool{} // crashed claims run again (under tl.mu)
	again := 0                     // other claims dispatched again, their lease lapsed first (under tl.mu)
	dispatchers := make([]*zclaim.Dispatcher, 2)
	var wg sync.WaitGroup
	for i := range dispatchers {
		d, err := zclaim.NewDispatcher(broker, ac, zclaim.DispatcherOptions{
			TaskRetention:    -1,
			RecoveryInterval: 100 * time.Millisecond,
			Logger:           quiet,
			OnDispatch: func(c zclaim.JobInfo, lag time.Duration, err error) {
				tl.mu.Lock()
				defer tl.mu.Unlock()
				switch {
				case c.Attempt > 1 && late[c.ID] && err == nil:
					recovered[c.ID] = true
				case c.Attempt > 1 && !late[c.ID]:
					again++
				}
				if !late[c.ID] && !tl.dispatched[c.ID] {
					tl.enqLags = append(tl.enqLags, lag)
				}
				tl.dispatched[c.ID] = true
			},
		})
		if err != nil {
			return false, err
		}
		dispatchers[i] = d
		wg.Add(1)
		go func() { defer wg.Done(); d.Run(ctx) }()
	}

	if cfg.metrics != "" {
		stop, err := serveMetrics(w, cfg, broker, dispatchers, idem)
		if err != nil {
			return false, err
		}
		defer stop()
	}

	// Duplicates: a second producer schedules 20 reminders again after they
	// ran, at the same due times (the same occurrences, whose completed
	// tasks asynq still holds: TaskID conflicts), and 20 more reach asynq as
	// tasks with ids of their own (the middleware's key, the job in the
	// payload, skips them).
	go func() {
		time.Sleep(200*time.Millisecond + cfg.spread/2)
		broker.Schedule(ctx, jobs[:20]...)
		for _, j := range jobs[20:40] {
			ac.EnqueueContext(ctx, asynq.NewTask(j.Type, j.Payload), asynq.Queue(queue))
		}
	}()

	total := cfg.jobs + len(crashed)
	began := time.Now()
	inspector := asynq.NewInspectorFromRedisClient(rdb)
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	for done := false; !done; {
		select {
		case <-ctx.Done():
			fmt.Fprintln(w, "timed out")
			done = true
		case <-tick.C:
			st, _ := broker.Stats(ctx)
			var sent int64
			for _, d := range dispatchers {
				sent += d.Stats().Enqueued
			}
			fmt.Fprintf(w, "%5.1fs  scheduled %4d  in flight %2d  dispatched %4d  handled %4d/%d\n",
				time.Since(began).Seconds(), st.Scheduled, st.Inflight, sent, tl.handled(), total)
			qi, err := inspector.GetQueueInfo(queue)
			settled := err == nil && qi.Pending+qi.Active+qi.Retry+qi.Scheduled == 0
			done = tl.handled() == total && st.Scheduled == 0 && st.Inflight == 0 && settled &&
				time.Since(began) > cfg.spread/2+500*time.Millisecond
		}
	}
	cancel()
	wg.Wait()

	var ds zclaim.DispatcherStats
	for _, d := range dispatchers {
		s := d.Stats()
		ds.Enqueued += s.Enqueued
		ds.Conflicts += s.Conflicts
	}
	tl.mu.Lock()
	defer tl.mu.Unlock()
	twice := 0
	for _, n := range tl.runs {
		if n > 1 {
			twice++
		}
	}
	missing := total - len(tl.runs)
	fmt.Fprintf(w, "\n| %-44s | %10s |\n|%s|%s|\n", "", "", strings.Repeat("-", 46), strings.Repeat("-", 12))
	row := func(k string, v any) { fmt.Fprintf(w, "| %-44s | %10v |\n", k, v) }
	row("scheduled", total)
	row("dispatched into asynq", ds.Enqueued)
	row("handled", len(tl.runs))
	row("handled more than once (must be 0)", twice)
	row("lost (must be 0)", missing)
	row("duplicates suppressed by the middleware", suppressed.Load())
	row("duplicates settled as asynq TaskID conflicts", ds.Conflicts)
	row("crashed claims recovered and run", len(recovered))
	row("other claims dispatched again (lease lapsed)", again)
	p50, p99, mx := pct(tl.enqLags)
	row("dispatch lag p50 (due -> enqueued, on time)", p50)
	row("dispatch lag p99", p99)
	row("dispatch lag max", mx)
	p50, p99, mx = pct(tl.handleLags)
	row("handler start lag p50 (by Redis TIME)", p50)
	row("handler start lag p99", p99)
	row("handler start lag max", mx)
	row("early starts (must be 0)", tl.early)
	return twice == 0 && missing == 0 && tl.early == 0, nil
}

func newJob(queue string, i int, at time.Time) zclaim.Job {
	id := fmt.Sprintf("order-%d:reminder", 700+i)
	p, _ := json.Marshal(reminder{Job: id, Order: 700 + i, DueUS: at.UnixMicro()})
	return zclaim.Job{ID: id, RunAt: at, Type: "order:reminder", Payload: p, Queue: queue}
}

func pct(d []time.Duration) (p50, p99, max time.Duration) {
	if len(d) == 0 {
		return
	}
	d = slices.Clone(d)
	slices.Sort(d)
	r := func(x time.Duration) time.Duration { return x.Round(100 * time.Microsecond) }
	return r(d[len(d)/2]), r(d[len(d)*99/100]), r(d[len(d)-1])
}

// runNaive polls the set the way many home-grown pollers do: read the due
// members, then remove them, in two requests. Eight pollers on the same jobs.
func runNaive(w io.Writer, rdb *redis.Client, ns string, cfg config) (bool, error) {
	ctx := context.Background()
	key := "zclaim:{" + ns + "}:naive"
	now := time.Now()
	zs := make([]redis.Z, cfg.jobs)
	for i := range zs {
		zs[i] = redis.Z{Score: float64(now.Add(-time.Second).UnixMilli()) / 1000, Member: fmt.Sprintf("order-%d:reminder", 700+i)}
	}
	if err := rdb.ZAdd(ctx, key, zs...).Err(); err != nil {
		return false, err
	}
	var mu sync.Mutex
	runs := map[string]int{}
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				due := fmt.Sprintf("%f", float64(time.Now().UnixMilli())/1000)
				ids, err := rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Min: "-inf", Max: due, Count: 10}).Result()
				if err != nil || len(ids) == 0 {
					return
				}
				for _, id := range ids {
					rdb.ZRem(ctx, key, id) // the result is not checked: the race
					mu.Lock()
					runs[id]++
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	twice, extra := 0, 0
	for _, n := range runs {
		if n > 1 {
			twice++
			extra += n - 1
		}
	}
	fmt.Fprintf(w, "naive poller, 8 workers, %d due jobs: %d ran more than once (%.0f%%), %d extra runs\n",
		cfg.jobs, twice, 100*float64(twice)/float64(cfg.jobs), extra)
	fmt.Fprintln(w, "(zclaim claims in one Lua script: go run ./example)")
	return true, nil
}

// cleanup deletes this run's keys and forgets its asynq queue (a real
// Redis may be shared).
func cleanup(rdb *redis.Client, ns string) {
	ctx := context.Background()
	iter := rdb.Scan(ctx, 0, "*{"+ns+"}*", 1000).Iterator()
	for iter.Next(ctx) {
		rdb.Del(ctx, iter.Val())
	}
	rdb.SRem(ctx, "asynq:queues", ns)
}
