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
// server on the store's AsynqClient, or alone) whose handler notes its
// start and blocks until the process is killed. BENCH_LEASE is the
// store's lease ("default" or a duration), "asynq" for asynq alone, or
// "dispatcher-" and a lease for a dispatcher whose claims are in hand and
// whose enqueues never land. BENCH_BEFORE=1 puts another middleware that
// notes and blocks around the store's, so that the runs never begin.
func takeoverWorker() {
	rdb := redis.NewClient(&redis.Options{Addr: os.Getenv("BENCH_REDIS")})
	queue, sink, lease := os.Getenv("BENCH_QUEUE"), os.Getenv("BENCH_SINK"), os.Getenv("BENCH_LEASE")
	if dl, ok := strings.CutPrefix(lease, "dispatcher-"); ok {
		stuckDispatcher(rdb, queue, sink, dl)
		return
	}
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
	var client redis.UniversalClient = rdb
	if lease != "asynq" {
		idem := store(rdb, queue, lease)
		if os.Getenv("BENCH_BEFORE") == "1" {
			h = block(idem.Middleware()(asynq.HandlerFunc(func(context.Context, *asynq.Task) error { return nil })))
		} else {
			h = idem.Middleware()(h)
		}
		client = idem.AsynqClient()
		cfg.IsFailure, cfg.RetryDelayFunc = zclaim.IsFailure, zclaim.RetryDelay
	}
	asynq.NewServerFromRedisClient(client, cfg).Run(h)
}

// stuckDispatcher is a dispatcher of the schedule "bench:{queue}" whose
// claims are in hand and whose enqueues never land: its TaskOptions notes
// each job and blocks.
func stuckDispatcher(rdb redis.UniversalClient, queue, sink, lease string) {
	b, err := zclaim.NewBroker(rdb, zclaim.BrokerOptions{Key: "bench:{" + queue + "}:jobs"})
	if err != nil {
		panic(err)
	}
	opts := zclaim.DispatcherOptions{Concurrency: 20, RecoveryInterval: -1,
		TaskOptions: func(j zclaim.Job) []asynq.Option {
			rdb.RPush(context.Background(), sink, "victim "+j.ID)
			select {}
		}}
	if lease != "default" {
		opts.Lease, _ = time.ParseDuration(lease)
	}
	d, err := zclaim.NewDispatcher(b, asynq.NewClientFromRedisClient(rdb), opts)
	if err != nil {
		panic(err)
	}
	d.Run(context.Background())
}

// store is the quick start's store: default options, or a lease.
func store(rdb redis.UniversalClient, queue, lease string) *zclaim.Idempotency {
	opts := zclaim.IdempotencyOptions{Prefix: "bench:{" + queue + "}:run:", Logger: slog.New(slog.DiscardHandler)}
	if lease != "default" {
		opts.Lease, _ = time.ParseDuration(lease)
	}
	idem, err := zclaim.NewIdempotency(rdb, opts)
	if err != nil {
		panic(err)
	}
	return idem
}

// takeoverScenario: a process SIGKILLed at each crash point with 20 jobs
// in hand; how long until each runs again in a live process of the same
// shape: zclaim with its default lease and with a 1 s lease, and asynq
// alone (its 30 s lease and once-a-minute recoverer).
func takeoverScenario() {
	const n = 20
	contenders := []struct{ name, lease, before string }{
		{"worker mid-handler (run begun), default options (Lease 5 s)", "default", ""},
		{"worker mid-handler, `Lease: time.Second`", "1s", ""},
		{"worker before Begin (its handlers blocked in an outer middleware), default options", "default", "1"},
		{"worker before Begin, `Lease: time.Second`", "1s", "1"},
		{"dispatcher between its claims and their enqueues, default options (its Lease 5 s)", "dispatcher-default", ""},
		{"dispatcher between its claims and their enqueues, `DispatcherOptions.Lease: time.Second`", "dispatcher-1s", ""},
		{"asynq alone, worker mid-handler", "asynq", ""},
	}
	if *quick {
		contenders = contenders[:2]
	}
	var rows [][]string
	for _, c := range contenders {
		progress("takeover: %s", c.name)
		d, ran, err := killAndWait(n, c.lease, c.before)
		if err != nil {
			rows = append(rows, []string{c.name, "error: " + err.Error(), "", ""})
			continue
		}
		rows = append(rows, []string{c.name, ms(d.pct(0.50)), ms(d.pct(0.99)), fmt.Sprintf("%d of %d", ran, n)})
	}
	table("a process SIGKILLed: kill → run again, per crash point",
		[]string{"crash point", "p50", "p99", "tasks run again"}, rows,
		fmt.Sprintf("A process of the quick start's shape holds %d jobs and is SIGKILLed: a worker (asynq server on the store's `AsynqClient`, Concurrency 20) whose handlers block, or whose runs wait in a middleware ahead of the store's and never begin; or a dispatcher with its claims in hand whose enqueues never land. A live process of the same shape (its asynq server, TaskCheckInterval 20 ms; a dispatcher of default options) runs them again. The time is from the SIGKILL to each job's handler start in the live process. "+
			"A run that began is taken over once its lease has run out; a task whose run never began once the process that its dequeue marked as its holder has not beaten for a lease; a dispatcher's claims once their lease has run out, back on the schedule due at once. "+
			"asynq alone brings a task back only after its 30 s lease, at its recoverer's next once-a-minute pass, and after a retry delay.", n))
}

// killAndWait runs one round of the scenario and returns the kill → run
// again times.
func killAndWait(n int, lease, before string) (durs, int, error) {
	ctx := context.Background()
	rdb := newClient(8)
	defer rdb.Close()
	queue := ns("takeover-" + strings.ReplaceAll(lease, ".", "_"))
	sink := "bench:{" + queue + "}:sink"
	defer dropKeys(rdb, queue)
	defer rdb.SRem(ctx, "asynq:queues", queue)
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), workerEnv+"=1", "BENCH_REDIS="+redisAddr, "BENCH_QUEUE="+queue, "BENCH_SINK="+sink,
		"BENCH_LEASE="+lease, "BENCH_BEFORE="+before)
	cmd.Stderr = os.Stderr
	proc.DieWithParent(cmd)
	if err := cmd.Start(); err != nil {
		return nil, 0, err
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	client := asynq.NewClientFromRedisClient(rdb)
	defer client.Close()
	dispatcher := strings.HasPrefix(lease, "dispatcher-")
	var b *zclaim.Broker
	if dispatcher {
		var err error
		if b, err = zclaim.NewBroker(rdb, zclaim.BrokerOptions{Key: "bench:{" + queue + "}:jobs"}); err != nil {
			return nil, 0, err
		}
		jobs := make([]zclaim.Job, n)
		for i := range jobs {
			jobs[i] = zclaim.Job{ID: "t-" + strconv.Itoa(i), RunAt: time.Now(), Type: "work"}
		}
		if err := b.Schedule(ctx, jobs...); err != nil {
			return nil, 0, err
		}
	} else {
		for i := range n {
			if _, err := client.Enqueue(asynq.NewTask("work", nil), asynq.Queue(queue), asynq.TaskID("t-"+strconv.Itoa(i))); err != nil {
				return nil, 0, err
			}
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
		if j, ok := zclaim.JobFromContext(ctx); ok {
			started <- j.ID
			return nil
		}
		id, _ := asynq.GetTaskID(ctx)
		started <- id
		return nil
	}))
	cfg := asynq.Config{Queues: map[string]int{queue: 1}, Concurrency: 20, TaskCheckInterval: 20 * time.Millisecond,
		Logger: redisproc.QuietAsynq{}, LogLevel: asynq.FatalLevel}
	var sc redis.UniversalClient = rdb
	if lease != "asynq" {
		idem := store(rdb, queue, strings.TrimPrefix(lease, "dispatcher-"))
		defer idem.Close()
		h = idem.Middleware()(h)
		sc = idem.AsynqClient()
		cfg.IsFailure, cfg.RetryDelayFunc = zclaim.IsFailure, zclaim.RetryDelay
	}
	srv := asynq.NewServerFromRedisClient(sc, cfg)
	if err := srv.Start(h); err != nil {
		return nil, 0, err
	}
	defer srv.Shutdown()
	if dispatcher {
		d, err := zclaim.NewDispatcher(b, client, zclaim.DispatcherOptions{
			TaskOptions: func(zclaim.Job) []asynq.Option { return []asynq.Option{asynq.Queue(queue)} }})
		if err != nil {
			return nil, 0, err
		}
		dctx, stop := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { defer close(done); d.Run(dctx) }()
		defer func() { stop(); <-done }()
	}
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
