package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/zclaim/zclaim"
	"github.com/zclaim/zclaim/internal/proc"
	"github.com/zclaim/zclaim/internal/redisproc"
)

// workerEnv makes the bench binary a worker process of the takeover
// scenario; its settings follow in the other BENCH_* variables.
const workerEnv = "ZCLAIM_BENCH_WORKER"

// takeoverWorker is a worker process of the quick start's shape (asynq
// server, with or without the middleware) whose handler notes its start and
// blocks until the process is killed; with lease "outer", the middleware
// (default options) is inside another that notes and blocks, so that the
// runs never begin.
func takeoverWorker() {
	rdb := redis.NewClient(&redis.Options{Addr: os.Getenv("BENCH_REDIS")})
	queue, sink, lease := os.Getenv("BENCH_QUEUE"), os.Getenv("BENCH_SINK"), os.Getenv("BENCH_LEASE")
	block := func(next asynq.Handler) asynq.Handler {
		return asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
			id, _ := asynq.GetTaskID(ctx)
			rdb.RPush(ctx, sink, "victim "+id)
			<-ctx.Done()
			return next.ProcessTask(ctx, t)
		})
	}
	h := block(asynq.HandlerFunc(func(ctx context.Context, _ *asynq.Task) error { return ctx.Err() }))
	cfg := asynq.Config{Queues: map[string]int{queue: 1}, Concurrency: 20, TaskCheckInterval: 20 * time.Millisecond,
		Logger: redisproc.QuietAsynq{}, LogLevel: asynq.FatalLevel}
	switch lease {
	case "asynq":
	case "outer":
		h = block(middleware(rdb, queue, "default")(asynq.HandlerFunc(func(context.Context, *asynq.Task) error { return nil })))
	default:
		h = middleware(rdb, queue, lease)(h)
	}
	if lease != "asynq" {
		cfg.IsFailure, cfg.RetryDelayFunc = zclaim.IsFailure, zclaim.RetryDelay
	}
	asynq.NewServerFromRedisClient(rdb, cfg).Run(h)
}

// middleware is the quick start's store: default options, or a lease.
func middleware(rdb redis.UniversalClient, queue, lease string) asynq.MiddlewareFunc {
	opts := zclaim.IdempotencyOptions{Prefix: "bench:{" + queue + "}:run:", Logger: slog.New(slog.DiscardHandler)}
	if lease != "default" {
		opts.Lease, _ = time.ParseDuration(lease)
	}
	idem, err := zclaim.NewIdempotency(rdb, opts)
	if err != nil {
		panic(err)
	}
	return idem.Middleware()
}

// takeoverScenario: a worker process SIGKILLed while 20 handlers run; how
// long until each of those tasks runs again in a live process of the same
// shape: zclaim with its default lease, with a 1 s lease, and asynq alone
// (its 30 s lease and once-a-minute recoverer).
func takeoverScenario() {
	const n = 20
	contenders := []struct{ name, lease string }{
		{"zclaim middleware, default options (Lease 5 s)", "default"},
		{"zclaim middleware, `Lease: time.Second`", "1s"},
		{"zclaim middleware, default options, the worker killed before the runs began (its handlers blocked in an outer middleware)", "outer"},
		{"asynq alone", "asynq"},
	}
	if *quick {
		contenders = contenders[:2]
	}
	var rows [][]string
	for _, c := range contenders {
		progress("takeover: %s", c.name)
		d, ran, err := killAndWait(n, c.lease)
		if err != nil {
			rows = append(rows, []string{c.name, "error: " + err.Error(), "", ""})
			continue
		}
		rows = append(rows, []string{c.name, ms(d.pct(0.50)), ms(d.pct(0.99)), fmt.Sprintf("%d of %d", ran, n)})
	}
	table("worker SIGKILLed mid-handler: kill → run again",
		[]string{"worker", "p50", "p99", "tasks run again"}, rows,
		fmt.Sprintf("A worker process (asynq server, Concurrency 20) holds %d tasks whose handlers block; it is SIGKILLed, and a live process of the same shape (TaskCheckInterval 20 ms) runs them again. The time is from the SIGKILL to each task's handler start in the live process. "+
			"A run that began is taken over once its lease has run out; one that never began (no run record) once the dead worker's asynq server has missed two renewals of asynq's lease of the task (5 s apart): its last renewal more than 12 s before. "+
			"asynq alone brings a task back only after its 30 s lease, at its recoverer's next once-a-minute pass, and after a retry delay.", n))
}

// killAndWait runs one round of the scenario and returns the kill → run
// again times.
func killAndWait(n int, lease string) (durs, int, error) {
	ctx := context.Background()
	rdb := newClient(8)
	defer rdb.Close()
	queue := ns("takeover-" + strings.ReplaceAll(lease, ".", "_"))
	sink := "bench:{" + queue + "}:sink"
	defer dropKeys(rdb, queue)
	defer rdb.SRem(ctx, "asynq:queues", queue)
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), workerEnv+"=1", "BENCH_REDIS="+redisAddr, "BENCH_QUEUE="+queue, "BENCH_SINK="+sink, "BENCH_LEASE="+lease)
	cmd.Stderr = os.Stderr
	proc.DieWithParent(cmd)
	if err := cmd.Start(); err != nil {
		return nil, 0, err
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	client := asynq.NewClientFromRedisClient(rdb)
	defer client.Close()
	for i := range n {
		if _, err := client.Enqueue(asynq.NewTask("work", nil), asynq.Queue(queue), asynq.TaskID("t-"+strconv.Itoa(i))); err != nil {
			return nil, 0, err
		}
	}
	for deadline := time.Now().Add(30 * time.Second); rdb.LLen(ctx, sink).Val() < int64(n); {
		if time.Now().After(deadline) {
			return nil, 0, fmt.Errorf("the worker did not start %d handlers", n)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// The live process, in this one.
	started := make(chan string, 2*n)
	h := asynq.Handler(asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
		id, _ := asynq.GetTaskID(ctx)
		started <- strings.SplitN(id, "~", 2)[0]
		return nil
	}))
	cfg := asynq.Config{Queues: map[string]int{queue: 1}, Concurrency: 20, TaskCheckInterval: 20 * time.Millisecond,
		Logger: redisproc.QuietAsynq{}, LogLevel: asynq.FatalLevel}
	if lease != "asynq" {
		h = middleware(rdb, queue, strings.Replace(lease, "outer", "default", 1))(h)
		cfg.IsFailure, cfg.RetryDelayFunc = zclaim.IsFailure, zclaim.RetryDelay
		// A process of this shape that has been running has handled tasks
		// of the type: a takeover of a run that never began is for a type
		// the middleware handles. (A task without an id fails its key.)
		h.ProcessTask(ctx, asynq.NewTask("work", nil))
	}
	srv := asynq.NewServerFromRedisClient(rdb, cfg)
	if err := srv.Start(h); err != nil {
		return nil, 0, err
	}
	defer srv.Shutdown()
	cmd.Process.Kill()
	killed := time.Now()
	cmd.Wait()
	seen := map[string]bool{}
	var d durs
	timeout := time.After(4 * time.Minute)
	for len(seen) < n {
		select {
		case id := <-started:
			if !seen[id] {
				seen[id] = true
				d = append(d, time.Since(killed))
			}
		case <-timeout:
			return d, len(seen), nil
		}
	}
	return d, len(seen), nil
}
