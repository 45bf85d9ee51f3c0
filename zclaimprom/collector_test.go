package zclaimprom_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"
	"github.com/zclaim/zclaim"
	"github.com/zclaim/zclaim/internal/logbuf"
	"github.com/zclaim/zclaim/internal/redisproc"
	"github.com/zclaim/zclaim/internal/wait"
	"github.com/zclaim/zclaim/zclaimprom"
)

var addr string

func TestMain(m *testing.M) {
	redis.SetLogger(redisproc.QuietRedis{})
	addr = os.Getenv("ZCLAIM_TEST_REDIS")
	var srv *redisproc.Server
	if addr == "" {
		var err error
		if srv, err = redisproc.Start(); err != nil {
			fmt.Fprintln(os.Stderr, "zclaimprom tests need a Redis 7 server:", err)
			os.Exit(2)
		}
		addr = srv.Addr
	}
	code := m.Run()
	if srv != nil {
		srv.Close()
	}
	os.Exit(code)
}

// The collector's values equal what Stats, RecoveryStats, the
// dispatcher's and the middleware's counts say, and its metrics pass
// Prometheus' lint.
func TestCollector(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	key := fmt.Sprintf("zp:{%d}", time.Now().UnixNano())
	defer func() {
		keys, _ := rdb.Keys(ctx, "*"+strings.TrimPrefix(key, "zp:")+"*").Result()
		if len(keys) > 0 {
			rdb.Del(ctx, keys...)
		}
	}()
	b, err := zclaim.NewBroker(rdb, zclaim.BrokerOptions{Key: key, Lease: 20 * time.Millisecond, Backoff: func(int) time.Duration { return time.Hour }})
	if err != nil {
		t.Fatal(err)
	}
	past, future := time.Now().Add(-time.Minute), time.Now().Add(time.Hour)
	var jobs []zclaim.Job
	for i := range 5 {
		jobs = append(jobs, zclaim.Job{ID: fmt.Sprint("f", i), RunAt: future, Type: "t"})
	}
	jobs = append(jobs, zclaim.Job{ID: "expire", RunAt: past, Type: "t"}, zclaim.Job{ID: "kill", RunAt: past, Type: "t"})
	must(t, b.Schedule(ctx, jobs...))
	cs, err := b.Claim(ctx, 2)
	must(t, err)
	for _, c := range cs {
		if c.ID == "kill" {
			must(t, b.Kill(ctx, c, "test"))
		}
	}
	time.Sleep(30 * time.Millisecond)
	if r, err := b.Recover(ctx); err != nil || r.Requeued != 1 {
		t.Fatalf("recover: %+v %v", r, err)
	}

	// A dispatcher of three due jobs on a second schedule.
	key2 := key + ":d"
	b2, err := zclaim.NewBroker(rdb, zclaim.BrokerOptions{Key: key2})
	must(t, err)
	must(t, b2.Schedule(ctx, zclaim.Job{ID: "a", RunAt: past, Type: "t"}, zclaim.Job{ID: "b", RunAt: past, Type: "t"}, zclaim.Job{ID: "c", RunAt: past, Type: "t"}))
	ac := asynq.NewClientFromRedisClient(rdb)
	d, err := zclaim.NewDispatcher(b2, ac, zclaim.DispatcherOptions{RecoveryInterval: -1})
	must(t, err)
	dctx, stop := context.WithCancel(ctx)
	done := make(chan error)
	go func() { done <- d.Run(dctx) }()
	for deadline := time.Now().Add(20 * time.Second); d.Stats().Enqueued < 3 && time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond)
	}
	stop()
	must(t, wait.Recv(t, done, 10*time.Second, "Run to return once its context was cancelled"))
	defer rdb.Del(ctx, "asynq:{default}:pending")

	// A middleware that completes one run and skips its repeat.
	store, err := zclaim.NewIdempotency(rdb, zclaim.IdempotencyOptions{Prefix: key + ":run:",
		Key: func(context.Context, *asynq.Task) (string, error) { return "k", nil }})
	must(t, err)
	h := store.Middleware()(asynq.HandlerFunc(func(context.Context, *asynq.Task) error { return nil }))
	must(t, h.ProcessTask(ctx, asynq.NewTask("t", nil)))
	must(t, h.ProcessTask(ctx, asynq.NewTask("t", nil)))

	c := zclaimprom.NewCollector(zclaimprom.Options{Brokers: []*zclaim.Broker{b, b2}, Dispatchers: []*zclaim.Dispatcher{d},
		Idempotency: []*zclaim.Idempotency{store}})
	problems, err := testutil.CollectAndLint(c)
	must(t, err)
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}

	st, err := b.Stats(ctx)
	must(t, err)
	if st.Scheduled != 6 || st.Dead != 1 || st.Due != 0 {
		t.Fatalf("stats: %+v", st)
	}
	ds := d.Stats()
	ms := store.Stats()
	if ds.Enqueued != 3 || ds.Lag.Count != 3 || ms.Completed != 1 || ms.Skipped != 1 {
		t.Fatalf("dispatcher %+v, middleware %+v", ds, ms)
	}
	want := fmt.Sprintf(`
# HELP zclaim_scheduled_jobs Jobs on the schedule.
# TYPE zclaim_scheduled_jobs gauge
zclaim_scheduled_jobs{key=%[1]q} %[3]d
zclaim_scheduled_jobs{key=%[2]q} 0
# HELP zclaim_dead_jobs Jobs in the dead set.
# TYPE zclaim_dead_jobs gauge
zclaim_dead_jobs{key=%[1]q} %[4]d
zclaim_dead_jobs{key=%[2]q} 0
# HELP zclaim_up Whether the last scrape read the schedule's counts from Redis (1) or not (0).
# TYPE zclaim_up gauge
zclaim_up{key=%[1]q} 1
zclaim_up{key=%[2]q} 1
# HELP zclaim_recovery_requeued_total Expired runs that recovery put back on the schedule.
# TYPE zclaim_recovery_requeued_total counter
zclaim_recovery_requeued_total{key=%[1]q} 1
zclaim_recovery_requeued_total{key=%[2]q} 0
# HELP zclaim_dispatcher_enqueued_total Tasks the dispatchers enqueued into asynq.
# TYPE zclaim_dispatcher_enqueued_total counter
zclaim_dispatcher_enqueued_total{key=%[2]q} %[5]d
# HELP zclaim_middleware_tasks_total Tasks the idempotency middleware handled, by outcome: skipped (finished before), in_progress (running elsewhere), completed, released (failed), lease_lost.
# TYPE zclaim_middleware_tasks_total counter
zclaim_middleware_tasks_total{outcome="completed",prefix=%[6]q} 1
zclaim_middleware_tasks_total{outcome="in_progress",prefix=%[6]q} 0
zclaim_middleware_tasks_total{outcome="lease_lost",prefix=%[6]q} 0
zclaim_middleware_tasks_total{outcome="released",prefix=%[6]q} 0
zclaim_middleware_tasks_total{outcome="skipped",prefix=%[6]q} 1
`, key, key2, st.Scheduled, st.Dead, ds.Enqueued, key+":run:")
	must(t, testutil.CollectAndCompare(c, strings.NewReader(want), "zclaim_scheduled_jobs", "zclaim_dead_jobs", "zclaim_up",
		"zclaim_recovery_requeued_total", "zclaim_dispatcher_enqueued_total", "zclaim_dispatcher_enqueued_in_bulk_total",
		"zclaim_middleware_tasks_total"))

	// The lag histogram counts the three first attempts.
	reg := prometheus.NewPedanticRegistry()
	must(t, reg.Register(c))
	mfs, err := reg.Gather()
	must(t, err)
	for _, mf := range mfs {
		if mf.GetName() == "zclaim_dispatch_lag_seconds" {
			if n := mf.GetMetric()[0].GetHistogram().GetSampleCount(); n != 3 {
				t.Fatalf("lag histogram has %d samples, want 3", n)
			}
			return
		}
	}
	t.Fatal("no zclaim_dispatch_lag_seconds")
}

// A schedule that cannot be read reports zclaim_up 0, and the scrape goes on.
func TestCollectorRedisDown(t *testing.T) {
	t.Parallel()
	srv, err := redisproc.Start()
	must(t, err)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1})
	defer rdb.Close()
	b, err := zclaim.NewBroker(rdb, zclaim.BrokerOptions{Key: "zp:{down}"})
	must(t, err)
	srv.Close()
	c := zclaimprom.NewCollector(zclaimprom.Options{Brokers: []*zclaim.Broker{b}, Timeout: time.Second})
	must(t, testutil.CollectAndCompare(c, strings.NewReader(`
# HELP zclaim_up Whether the last scrape read the schedule's counts from Redis (1) or not (0).
# TYPE zclaim_up gauge
zclaim_up{key="zp:{down}"} 0
`), "zclaim_up", "zclaim_scheduled_jobs"))
}

// Options a collector cannot use (a nil entry, a negative Timeout) make
// Register fail with an error that names them; nothing panics at a scrape.
func TestCollectorRefusesOptions(t *testing.T) {
	t.Parallel()
	for want, o := range map[string]zclaimprom.Options{
		"nil *zclaim.Broker":      {Brokers: []*zclaim.Broker{nil}},
		"nil *zclaim.Dispatcher":  {Dispatchers: []*zclaim.Dispatcher{nil}},
		"nil *zclaim.Idempotency": {Idempotency: []*zclaim.Idempotency{nil}},
		"Timeout must not be":     {Timeout: -time.Second},
	} {
		reg := prometheus.NewRegistry()
		err := reg.Register(zclaimprom.NewCollector(o))
		if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "zclaimprom: ") {
			t.Errorf("%s: Register: %v", want, err)
		}
		if _, err := reg.Gather(); err != nil {
			t.Errorf("%s: Gather after the refused Register: %v", want, err)
		}
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// An abandoned run (an active asynq task whose run record's lease ran out,
// as a dead worker leaves it) shows in the gauge read from Redis; a store
// that takes it over counts the takeover and logs it at Warn with the key,
// the dead run's token and how long it had been silent.
func TestAbandonedRunsAndTakeovers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { rdb.Close() })
	// A queue and runs of this run's own, not shared with another run on
	// the same server (go test -count, or ZCLAIM_TEST_REDIS).
	now := time.Now().UnixNano()
	queue := fmt.Sprint("prom-abandoned-", now)
	prefix := fmt.Sprintf("zt:{%s-%d}:run:", t.Name(), now)
	t.Cleanup(func() {
		rdb.Del(ctx, prefix+"order-14", prefix)
		rdb.SRem(ctx, "asynq:queues", queue)
	})
	asrv := asynq.NewServerFromRedisClient(rdb, asynq.Config{Queues: map[string]int{queue: 1}, Concurrency: 2,
		TaskCheckInterval: 10 * time.Millisecond, Logger: redisproc.QuietAsynq{}, LogLevel: asynq.FatalLevel})
	started := make(chan string, 4)
	block := make(chan struct{})
	must(t, asrv.Start(asynq.HandlerFunc(func(ctx context.Context, _ *asynq.Task) error {
		id, _ := asynq.GetTaskID(ctx)
		started <- id
		select {
		case <-block:
		case <-ctx.Done():
		}
		return nil
	})))
	t.Cleanup(func() { close(block); asrv.Shutdown() })
	c := asynq.NewClientFromRedisClient(rdb)
	t.Cleanup(func() { c.Close() })
	_, err := c.Enqueue(asynq.NewTask("order:reminder", nil), asynq.Queue(queue), asynq.TaskID("order-14"))
	must(t, err)
	wait.Recv(t, started, 30*time.Second, "the handler of order-14 to start")
	dead, err := zclaim.NewIdempotency(rdb, zclaim.IdempotencyOptions{Prefix: prefix, Lease: 20 * time.Millisecond, DisableTakeover: true})
	must(t, err)
	e, err := dead.Begin(ctx, "order-14") // and then its worker died
	must(t, err)
	time.Sleep(30 * time.Millisecond)

	// A fresh process: the gauge comes from Redis, not from what it saw.
	var logs logbuf.Buffer
	live, err := zclaim.NewIdempotency(rdb, zclaim.IdempotencyOptions{Prefix: prefix, Lease: 200 * time.Millisecond,
		TakeoverQueues: []string{queue}, DisableTakeover: true, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	must(t, err)
	coll := zclaimprom.NewCollector(zclaimprom.Options{Idempotency: []*zclaim.Idempotency{live}})
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(coll)
	if got := scrape(t, reg, "zclaim_middleware_abandoned_runs"); got != 1 {
		t.Fatalf("abandoned runs %v, want 1", got)
	}
	if got := scrape(t, reg, "zclaim_asynq_adapter_off"); got != 0 {
		t.Fatalf("asynq adapter parts off %v, want 0 under the asynq zclaim knows", got)
	}

	taker, err := zclaim.NewIdempotency(rdb, zclaim.IdempotencyOptions{Prefix: prefix, Lease: 200 * time.Millisecond,
		TakeoverQueues: []string{queue}, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	must(t, err)
	t.Cleanup(func() { taker.Close() })
	taker.Middleware()
	// The task itself, back on its queue.
	if id := wait.Recv(t, started, 20*time.Second, "a takeover"); id != "order-14" {
		t.Fatalf("task id %q started, want order-14 again", id)
	}
	// The counter and the log line come once the task is back on its
	// queue: it can start first.
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline) &&
		(taker.Stats().Takeovers == 0 || !strings.Contains(logs.String(), "took over a run")); {
		time.Sleep(5 * time.Millisecond)
	}
	reg2 := prometheus.NewPedanticRegistry()
	reg2.MustRegister(zclaimprom.NewCollector(zclaimprom.Options{Idempotency: []*zclaim.Idempotency{taker}}))
	if got := scrape(t, reg2, "zclaim_middleware_takeovers_total"); got != 1 {
		t.Fatalf("takeovers %v, want 1", got)
	}
	line := logs.String()
	for _, w := range []string{"level=WARN", "took over a run whose worker is gone", "key=order-14", fmt.Sprintf("token=%d", e.Token), "silent="} {
		if !strings.Contains(line, w) {
			t.Fatalf("log has no %q:\n%s", w, line)
		}
	}
}

// scrape gathers reg and returns the value of the one series of name.
func scrape(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	must(t, err)
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		m := mf.GetMetric()[0]
		if m.Gauge != nil {
			return m.Gauge.GetValue()
		}
		return m.Counter.GetValue()
	}
	t.Fatalf("no %s in the scrape", name)
	return 0
}

// An asynq queue whose active list is of another type holds no run: the
// abandoned-runs gauge counts the other queues' runs, and is not left out.
func TestAbandonedRunsPastHostileQueue(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	own, err := redisproc.Start() // asynq's queues are listed server-wide: the test's alone
	must(t, err)
	t.Cleanup(own.Close)
	rdb := redis.NewClient(&redis.Options{Addr: own.Addr})
	t.Cleanup(func() { rdb.Close() })
	must(t, rdb.SAdd(ctx, "asynq:queues", "fine", "hostile").Err())
	must(t, rdb.Set(ctx, "asynq:{hostile}:active", "junk", 0).Err())
	idem, err := zclaim.NewIdempotency(rdb, zclaim.IdempotencyOptions{Prefix: "zt:run:", DisableTakeover: true})
	must(t, err)
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(zclaimprom.NewCollector(zclaimprom.Options{Idempotency: []*zclaim.Idempotency{idem}}))
	if got := scrape(t, reg, "zclaim_middleware_abandoned_runs"); got != 0 {
		t.Fatalf("abandoned runs %v, want 0", got)
	}
}
