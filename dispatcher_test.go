package zclaim

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/zclaim/zclaim/internal/wait"
)

// handledLog records each handler start by Redis' clock, per job id (from
// JobFromContext; the middleware's key is the occurrence).
type handledLog struct {
	rdb   *redis.Client
	mu    sync.Mutex
	runs  map[string]int
	early []string
	lags  []time.Duration
}

func newHandledLog(t *testing.T) *handledLog {
	return &handledLog{rdb: newClient(t), runs: map[string]int{}}
}

// handler's payload is the job's due time in Unix microseconds.
func (h *handledLog) handler() asynq.Handler {
	return asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
		now, err := h.rdb.Time(ctx).Result()
		if err != nil {
			return err
		}
		job, _ := JobFromContext(ctx)
		dueUS, _ := strconv.ParseInt(string(t.Payload()), 10, 64)
		due := time.UnixMicro(dueUS)
		h.mu.Lock()
		defer h.mu.Unlock()
		h.runs[job.ID]++
		if now.Before(due) {
			h.early = append(h.early, fmt.Sprintf("%s started %v early", job.ID, due.Sub(now)))
		}
		h.lags = append(h.lags, now.Sub(due))
		return nil
	})
}

func (h *handledLog) count() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.runs)
}

// check asserts every id ran exactly once and none early; it logs the lag.
func (h *handledLog) check(t *testing.T, ids []string) {
	t.Helper()
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, id := range ids {
		if h.runs[id] != 1 {
			t.Errorf("%s handled %d times", id, h.runs[id])
		}
	}
	if len(h.runs) != len(ids) {
		t.Errorf("handled %d ids, want %d", len(h.runs), len(ids))
	}
	for _, e := range h.early {
		t.Error(e)
	}
	if len(h.lags) > 0 {
		l := slices.Clone(h.lags)
		slices.Sort(l)
		t.Logf("due -> handler start by Redis TIME, %d runs: p50 %v p99 %v max %v",
			len(l), l[len(l)/2], l[len(l)*99/100], l[len(l)-1])
	}
}

// spreadJobs makes n jobs due evenly over d from now (by Redis' clock);
// each payload is the due time in Unix µs, as the broker will round it.
func spreadJobs(t *testing.T, b *Broker, n int, d time.Duration) ([]Job, []string) {
	start := redisNow(t, b.rdb).Add(50 * time.Millisecond)
	jobs := make([]Job, n)
	ids := make([]string, n)
	for i := range jobs {
		at := start.Add(time.Duration(i) * d / time.Duration(n))
		due := b.scoreTime(b.score(at))
		ids[i] = fmt.Sprintf("order-%d:reminder", i)
		jobs[i] = Job{ID: ids[i], RunAt: at, Type: "reminder", Payload: []byte(strconv.FormatInt(due.UnixMicro(), 10))}
	}
	return jobs, ids
}

// handledSetup gives a test a schedule key, an asynq queue and a server
// on it whose handler, wrapped in the middleware, records each run.
func handledSetup(t *testing.T) (key, queue string, log *handledLog) {
	key, queue, log = testKey(t), testQueue(t), newHandledLog(t)
	idem := newIdem(t, newClient(t), IdempotencyOptions{Lease: time.Second})
	startAsynq(t, testAddr, queue, idem.Middleware()(log.handler()),
		asynq.Config{Concurrency: 20, IsFailure: IsFailure, RetryDelayFunc: RetryDelay})
	return key, queue, log
}

func runDispatcher(t *testing.T, d *Dispatcher) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); d.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() { cancel(); wait.Recv(t, done, 30*time.Second, "Run to return once its context was cancelled") })
	}
	t.Cleanup(stop)
	return stop
}

// 1. 2,000 jobs due over 2 s, two dispatchers (one on a plain asynq
// client, one on an autopipelined one, as in the quick start), one asynq
// server with the middleware: every job handled exactly once, none before
// its due time.
func TestDispatchExactlyOnceOnTime(t *testing.T) {
	t.Parallel()
	key, q, log := handledSetup(t)
	var enqLags []time.Duration
	var mu sync.Mutex
	var dsps []*Dispatcher
	for _, c := range []*asynq.Client{newAsynqClient(t, testAddr), newAutopipelinedAsynqClient(t, testAddr)} {
		b := newBroker(t, BrokerOptions{Key: key, Lease: 2 * time.Second})
		d, err := NewDispatcher(b, c, DispatcherOptions{
			TaskOptions: func(Job) []asynq.Option { return []asynq.Option{asynq.Queue(q)} },
			OnDispatch: func(c JobInfo, lag time.Duration, err error) {
				mu.Lock()
				enqLags = append(enqLags, lag)
				mu.Unlock()
			},
		})
		must(t, err)
		runDispatcher(t, d)
		dsps = append(dsps, d)
	}
	b := newBroker(t, BrokerOptions{Key: key})
	jobs, ids := spreadJobs(t, b, 2000, 2*time.Second)
	must(t, b.Schedule(ctx, jobs...))
	// Under load a task can wait out a retry in asynq's retry set, which
	// asynq's forwarder looks at every 5 s: the stall allowed leaves room.
	waitProgress(t, 30*time.Second, "jobs handled", len(ids), log.count, func() string {
		st, _ := b.Stats(ctx)
		qi, _ := newInspector(t).GetQueueInfo(q)
		return fmt.Sprintf("schedule %+v; dispatchers %+v, %+v; asynq queue %+v", st, dsps[0].Stats(), dsps[1].Stats(), qi)
	})
	time.Sleep(100 * time.Millisecond) // room for a duplicate to show
	log.check(t, ids)
	mu.Lock()
	slices.Sort(enqLags)
	t.Logf("due -> enqueued, %d: p50 %v p99 %v max %v", len(enqLags),
		enqLags[len(enqLags)/2], enqLags[len(enqLags)*99/100], enqLags[len(enqLags)-1])
	mu.Unlock()
	st, err := b.Stats(ctx)
	must(t, err)
	if st.Scheduled != 0 || st.Inflight != 0 || st.Dead != 0 {
		t.Fatalf("left behind: %+v", st)
	}
}

// 2. A dispatcher stopped mid-run while it holds claims (its enqueues
// hang, then its Redis connections are cut): another dispatcher's recovery
// takes the claims back after their lease, and every job is handled
// exactly once.
func TestDispatcherStoppedMidRun(t *testing.T) {
	t.Parallel()
	key, q, log := handledSetup(t)
	taskOpts := func(Job) []asynq.Option { return []asynq.Option{asynq.Queue(q)} }
	const lease = 300 * time.Millisecond
	// Its clients' timeouts are long enough for a loaded machine: a claim
	// whose reply came after a short ReadTimeout failed, and claims that
	// keep failing back off for seconds. Cutting the proxies ends the
	// calls that hang once they are paused.
	viaProxy := func(p *proxy) *redis.Client {
		c := redis.NewClient(&redis.Options{Addr: p.Addr, MaxRetries: -1, ReadTimeout: 10 * time.Second,
			WriteTimeout: 10 * time.Second, ContextTimeoutEnabled: true})
		t.Cleanup(func() { c.Close() })
		return c
	}
	brokerPx, asynqPx := newProxy(t, testAddr), newProxy(t, testAddr)
	ba, err := NewBroker(viaProxy(brokerPx), BrokerOptions{Key: key, Lease: lease})
	must(t, err)
	// Its enqueues outlast the test's pauses: the claims behind them stay
	// held until the connections are cut.
	da, err := NewDispatcher(ba, asynq.NewClientFromRedisClient(viaProxy(asynqPx)), DispatcherOptions{
		TaskOptions: taskOpts, EnqueueTimeout: 5 * time.Second, RecoveryInterval: -1, Concurrency: 8})
	must(t, err)
	stopA := runDispatcher(t, da)

	b := newBroker(t, BrokerOptions{Key: key, Lease: lease})
	jobs, ids := spreadJobs(t, b, 400, 400*time.Millisecond)
	must(t, b.Schedule(ctx, jobs...))
	waitFor(t, 20*time.Second, "the first dispatcher to claim", func() bool { return da.Stats().Claimed >= 50 })
	asynqPx.Pause() // its enqueues hang ...
	// Claims held behind the hung enqueues, not those of the moment
	// before the pause, which settle.
	waitFor(t, 20*time.Second, "claims to pile up", func() bool {
		s := da.Stats()
		st, _ := b.Stats(ctx)
		return s.Claimed-s.Enqueued-s.Conflicts-s.Failed-s.Dead >= 8 && st.Inflight >= 8
	})
	brokerPx.Pause() // ... and so do its acks and give-backs, until
	stopped := make(chan struct{})
	go func() { defer close(stopped); stopA() }()
	brokerPx.SetDown(true) // its connections are cut, what they held lost
	asynqPx.SetDown(true)
	wait.Recv(t, stopped, 30*time.Second, "the first dispatcher to stop")
	st, _ := b.Stats(ctx)
	t.Logf("first dispatcher stopped: %+v; broker %+v", da.Stats(), st)
	if st.Inflight == 0 {
		t.Fatal("the stopped dispatcher held no claims")
	}

	db, err := NewDispatcher(b, newAsynqClient(t, testAddr), DispatcherOptions{
		TaskOptions: taskOpts, RecoveryInterval: 20 * time.Millisecond})
	must(t, err)
	runDispatcher(t, db)
	waitFor(t, time.Minute, "all jobs handled", func() bool { return log.count() >= len(ids) })
	waitFor(t, 20*time.Second, "the schedule to empty", func() bool {
		st, _ := b.Stats(ctx)
		return st.Scheduled == 0 && st.Inflight == 0
	})
	log.check(t, ids)
	st, _ = b.Stats(ctx)
	if st.Dead != 0 {
		t.Fatalf("dead: %+v", st)
	}
	t.Logf("second dispatcher: %+v", db.Stats())
}

// 3. asynq unreachable for a while: failed enqueues give their claims
// back with backoff; nothing is lost or run twice.
func TestDispatcherEnqueueFailures(t *testing.T) {
	t.Parallel()
	key, q, log := handledSetup(t)
	px := newProxy(t, testAddr)
	px.SetDown(true)
	ac := asynq.NewClientFromRedisClient(redis.NewClient(&redis.Options{Addr: px.Addr, MaxRetries: -1,
		DialTimeout: 50 * time.Millisecond}))
	b := newBroker(t, BrokerOptions{Key: key, Lease: time.Second, MaxAttempts: 1000,
		Backoff: func(int) time.Duration { return 20 * time.Millisecond }})
	d, err := NewDispatcher(b, ac, DispatcherOptions{
		TaskOptions: func(Job) []asynq.Option { return []asynq.Option{asynq.Queue(q)} }})
	must(t, err)
	runDispatcher(t, d)
	jobs, ids := spreadJobs(t, b, 300, 200*time.Millisecond)
	must(t, b.Schedule(ctx, jobs...))
	waitFor(t, 20*time.Second, "failed enqueues", func() bool { return d.Stats().Failed >= 300 })
	if n := log.count(); n != 0 {
		t.Fatalf("%d handled while asynq was unreachable", n)
	}
	px.SetDown(false)
	waitFor(t, time.Minute, "all jobs handled", func() bool { return log.count() >= len(ids) })
	log.check(t, ids)
	st, _ := b.Stats(ctx)
	if st.Dead != 0 || st.Scheduled != 0 {
		t.Fatalf("stats %+v", st)
	}
	t.Logf("dispatcher: %+v", d.Stats())
}

// A job scheduled earlier than the dispatcher's sleep wakes it at once;
// a job without a task type goes to the dead set (or gets DefaultType).
func TestDispatcherWakeAndTypes(t *testing.T) {
	t.Parallel()
	key := testKey(t)
	q := testQueue(t)
	var got sync.Map
	startAsynq(t, testAddr, q, asynq.HandlerFunc(func(ctx context.Context, task *asynq.Task) error {
		j, _ := JobFromTask(task)
		got.Store(j.ID, task.Type())
		return nil
	}), asynq.Config{})
	// A lease no batch outlasts, however loaded the machine: the unfit
	// jobs below must die once each, settled with their batch.
	b := newBroker(t, BrokerOptions{Key: key, Lease: time.Minute})
	type lagOf struct {
		id  string
		lag time.Duration
	}
	lags := make(chan lagOf, 10)
	d, err := NewDispatcher(b, newAsynqClient(t, testAddr), DispatcherOptions{
		MaxWait:     time.Hour, // only a notice can wake it
		DefaultType: "adopted",
		TaskOptions: func(Job) []asynq.Option { return []asynq.Option{asynq.Queue(q)} },
		OnDispatch:  func(c JobInfo, lag time.Duration, _ error) { lags <- lagOf{c.ID, lag} },
	})
	must(t, err)
	must(t, b.Schedule(ctx, Job{ID: "later", RunAt: time.Now().Add(time.Hour), Type: "x"}))
	// Due centuries ago: its lag is more than a Duration holds, and must
	// saturate rather than wrap to a negative one.
	must(t, b.Schedule(ctx, Job{ID: "ancient", RunAt: time.Date(1600, 1, 1, 0, 0, 0, 0, time.UTC), Type: "x"}))
	stopFirst := runDispatcher(t, d)
	if l := wait.Recv(t, lags, 20*time.Second, "the dispatch of the job due in 1600"); l.id != "ancient" || l.lag != time.Duration(math.MaxInt64) {
		t.Fatalf("%s dispatched with lag %v; want ancient with the largest Duration", l.id, l.lag)
	}
	time.Sleep(50 * time.Millisecond) // asleep until the hour is up
	// A foreign producer cannot announce its jobs: "foreign", due a
	// millisecond after "soon", is taken along when the dispatcher wakes
	// for "soon". It is written first, so that no claim for "soon" can
	// come before it (a ZADD after the notice, late on a loaded machine,
	// would wait out the hour).
	soonAt := redisNow(t, b.rdb).Add(30 * time.Millisecond).Truncate(time.Millisecond)
	foreignScore := float64(soonAt.Add(time.Millisecond).UnixMilli()) / 1000
	must(t, b.rdb.ZAdd(ctx, key, redis.Z{Score: foreignScore, Member: "foreign"}).Err())
	must(t, b.Schedule(ctx, Job{ID: "soon", RunAt: soonAt, Type: "typed"}))
	for range 2 {
		select {
		case l := <-lags:
			// A loaded machine can be a second late; a lost wake-up waits
			// out the hour.
			if l.lag < 0 || l.lag > 5*time.Second {
				t.Errorf("%s dispatched %v after due", l.id, l.lag)
			}
		case <-time.After(15 * time.Second): // MaxWait is an hour: only a lost wake-up gets here
			st, _ := b.Stats(ctx)
			subs, _ := b.rdb.PubSubNumSub(ctx, b.keys.notice).Result()
			t.Fatalf("the notice did not wake the dispatcher: schedule %+v, dispatcher %+v, subscribers of %s: %v",
				st, d.Stats(), b.keys.notice, subs)
		}
	}
	waitFor(t, 20*time.Second, "both tasks handled", func() bool {
		a, ok1 := got.Load("foreign")
		b, ok2 := got.Load("soon")
		return ok1 && ok2 && a == "adopted" && b == "typed"
	})

	// Without a DefaultType, a job without a type goes to the dead set, and
	// so does one whose record is corrupt, both settled with the batch they
	// were claimed in. The first dispatcher (which has a DefaultType) must
	// not be the one to claim them.
	stopFirst()
	d2, err := NewDispatcher(b, newAsynqClient(t, testAddr), DispatcherOptions{RecoveryInterval: -1})
	must(t, err)
	stop := runDispatcher(t, d2)
	must(t, b.rdb.HSet(ctx, b.keys.pending, "garbled", "0:9zz").Err())
	must(t, b.rdb.ZAdd(ctx, key, redis.Z{Score: 1, Member: "typeless"}, redis.Z{Score: 1, Member: "garbled"}).Err())
	// What asynq would refuse, before writing anything, dies at once too
	// (Schedule refuses it; a foreign producer's ZADD does not).
	long := strings.Repeat("x", MaxIDLen+1)
	must(t, b.rdb.ZAdd(ctx, key, redis.Z{Score: 1, Member: " \t"}, redis.Z{Score: 1, Member: ""},
		redis.Z{Score: 1, Member: "caf\xe9"}, redis.Z{Score: 1, Member: long}).Err())
	b.rdb.Publish(ctx, b.keys.notice, "1")
	waitFor(t, 20*time.Second, "the six unfit jobs to die", func() bool { return d2.Stats().Dead == 6 })
	stop()
	dead, err := listDead(b, 10)
	must(t, err)
	reasons := map[string]string{}
	for _, j := range dead {
		reasons[j.ID] = j.Reason
	}
	if len(dead) != 6 || !strings.Contains(reasons["typeless"], "no task type") || !strings.HasPrefix(reasons["garbled"], "corrupt record") ||
		!strings.Contains(reasons[" \t"], "white space") || !strings.Contains(reasons[""], "empty job id") ||
		!strings.Contains(reasons["caf\xe9"], "not valid UTF-8") || !strings.Contains(reasons[long], "longer than MaxIDLen") {
		t.Fatalf("%+v", dead)
	}
	if n := d2.Stats().Failed; n != 0 {
		t.Fatalf("%d enqueues failed: an unfit job was tried", n)
	}
	st, err := b.Stats(ctx)
	must(t, err)
	if st.Inflight != 0 || st.Dead != 6 {
		t.Fatalf("stats %+v", st)
	}
}

// A notice sent while the dispatcher's subscription was cut is lost: when
// the subscription comes back, the dispatcher looks at the schedule again
// instead of sleeping out MaxWait.
func TestDispatcherWakesAfterResubscribing(t *testing.T) {
	t.Parallel()
	key, q := testKey(t), testQueue(t)
	px := newProxy(t, testAddr)
	b, err := NewBroker(clientVia(t, px), BrokerOptions{Key: key})
	must(t, err)
	direct := newBroker(t, BrokerOptions{Key: key}) // schedules while b is cut off
	dispatched := make(chan string, 1)
	d, err := NewDispatcher(b, newAsynqClient(t, testAddr), DispatcherOptions{
		MaxWait: time.Hour, RecoveryInterval: -1, // only a notice or a resubscription can wake it
		TaskOptions: func(Job) []asynq.Option { return []asynq.Option{asynq.Queue(q)} },
		OnDispatch:  func(c JobInfo, _ time.Duration, _ error) { dispatched <- c.ID },
	})
	must(t, err)
	runDispatcher(t, d)
	subscribers := func() int64 {
		n, _ := direct.rdb.PubSubNumSub(ctx, b.keys.notice).Result()
		return n[b.keys.notice]
	}
	waitFor(t, 20*time.Second, "the dispatcher to subscribe", func() bool { return subscribers() == 1 })
	px.SetDown(true)
	waitFor(t, 20*time.Second, "the subscription to be cut", func() bool { return subscribers() == 0 })
	must(t, direct.Schedule(ctx, Job{ID: "while-cut", RunAt: time.Now(), Type: "x"})) // its notice reaches no one
	px.SetDown(false)
	if id := wait.Recv(t, dispatched, 20*time.Second, "the dispatch of the job scheduled while the dispatcher was cut off"); id != "while-cut" {
		t.Fatalf("dispatched %q", id)
	}
}

// A dispatcher whose claims fail backs off instead of spinning: here every
// claim fails at once (the schedule key holds a string), the fastest
// failure there is. (With Redis down, go-redis' own dial retries already
// make each attempt slow.) Run still returns when its context is done.
func TestDispatcherBacksOffOnErrors(t *testing.T) {
	t.Parallel()
	rdb := redis.NewClient(&redis.Options{Addr: testAddr})
	t.Cleanup(func() { rdb.Close() })
	var cmds atomic.Int64
	rdb.AddHook(roundTrips{&cmds})
	key := testKey(t)
	must(t, rdb.Set(ctx, key, "not a zset", 0).Err())
	b, err := NewBroker(rdb, BrokerOptions{Key: key})
	must(t, err)
	d, err := NewDispatcher(b, newAsynqClient(t, testAddr), DispatcherOptions{MaxWait: 200 * time.Millisecond, RecoveryInterval: -1})
	must(t, err)
	cmds.Store(0)
	stop := runDispatcher(t, d)
	time.Sleep(500 * time.Millisecond)
	stop()
	// Backoff from 10 ms doubling to MaxWait: about 6 claims in 500 ms.
	if n := cmds.Load(); n > 30 {
		t.Fatalf("%d commands in 500ms while every claim fails: spinning", n)
	}
	t.Logf("%d commands in 500ms while every claim fails", cmds.Load())
}

// With asynq hanging, a dispatcher holds few claims: Concurrency
// enqueues under way and at most max(Concurrency, 2×min(4×Concurrency,
// BatchSize)) queued, so the rest stay scheduled instead of burning leases.
func TestDispatcherBoundsClaimsWhileAsynqHangs(t *testing.T) {
	t.Parallel()
	key := testKey(t)
	px := newProxy(t, testAddr)
	b := newBroker(t, BrokerOptions{Key: key, Lease: time.Minute})
	ac := asynq.NewClientFromRedisClient(clientVia(t, px))
	d, err := NewDispatcher(b, ac, DispatcherOptions{Concurrency: 2, RecoveryInterval: -1, EnqueueTimeout: time.Minute})
	must(t, err)
	px.Pause()
	must(t, b.Schedule(ctx, jobsDue(100, "h", time.Now().Add(-time.Second))...))
	stop := runDispatcher(t, d)
	t.Cleanup(px.Resume) // runs before the dispatcher's stop: a failure does not wait out the enqueues
	waitFor(t, 20*time.Second, "claims", func() bool { return d.Stats().Claimed > 0 })
	time.Sleep(200 * time.Millisecond)
	st, err := b.Stats(ctx)
	must(t, err)
	const bound = 2 + 16
	if st.Inflight == 0 || st.Inflight > bound || st.Scheduled < 100-bound {
		t.Fatalf("with asynq hanging: %+v, want at most %d in flight", st, bound)
	}
	px.Resume()
	stop()
}

// A claim whose lease runs out while it waits for a worker (asynq hangs,
// after enqueues quick enough to let claims queue; no enqueue ends, so the
// dispatcher does not renew the lease) is not enqueued: recovery gives
// the job back and its next claim enqueues it. The only
// conflict left is the enqueue that was under way; enqueuing the waiting
// claims too would have made one for each of them.
func TestDispatcherSkipsClaimsPastTheirLease(t *testing.T) {
	t.Parallel()
	// A lease long enough for an enqueue on a loaded machine (one that ran
	// past it would be enqueued again: a conflict), short enough to run out
	// for the claims that wait. A machine so loaded that an enqueue outside
	// the pause takes a quarter of the lease can make such a conflict, or
	// keep claims from queueing long enough to run out: the attempt starts
	// over on a rig of its own, up to 3 attempts.
	const lease = time.Second
	startOver(t, 3, func(int) (fault, excuse string) {
		st, slow := skipsClaimsPastTheirLease(t, lease)
		if st.Conflicts <= 1 && st.Failed > 0 {
			t.Logf("dispatcher: %+v", st)
			return "", ""
		}
		fault = fmt.Sprintf("stats %+v: want at most 1 conflict (the enqueue under way) "+
			"and the claims past their lease not enqueued", st)
		if slow == 0 {
			return fault, ""
		}
		return fault, fmt.Sprintf("%d enqueues slower than %v outside the pause", slow, lease/4)
	})
}

// skipsClaimsPastTheirLease runs one attempt of
// TestDispatcherSkipsClaimsPastTheirLease: the dispatcher's stats once
// every job ran, and how many commands of its asynq client took longer
// than a quarter of the lease outside the pause.
func skipsClaimsPastTheirLease(t *testing.T, lease time.Duration) (DispatcherStats, int64) {
	r := newLeaseRig(t, lease)
	slow := &slowCalls{d: lease / 4}
	r.via.AddHook(slow)
	d := r.dispatcher(t, 1)
	// First jobs while asynq is quick, 12 at a time until their pace (a
	// moving average, in which a slow first enqueue, a new connection's,
	// soon weighs little) lets claims queue: an eighth of the lease lets
	// two wait behind the one under way. A loaded machine takes more.
	const quick, most = 12, 5
	b, px, log, all := r.b, r.px, r.log, r.jobs(most*quick+20, "lease-")
	stop := runDispatcher(t, d)
	defer stop()
	n := 0
	for n < most*quick {
		must(t, b.Schedule(ctx, all[n:n+quick]...))
		n += quick
		waitFor(t, 20*time.Second, "the first enqueues", func() bool { return d.Stats().Enqueued == int64(n) })
		if d.enqueueTime.get() <= lease/8 {
			break
		}
	}
	jobs := all[:n+20]
	slow.hold()
	px.Pause()
	t.Cleanup(px.Resume)
	must(t, b.Schedule(ctx, jobs[n:]...))
	waitFor(t, 20*time.Second, "claims queued behind the enqueue under way", func() bool { return d.Stats().Claimed > int64(n)+1 })
	// Every claim since the pause, the one under way and those queued
	// behind it, runs out of its lease and recovery takes its job back;
	// then half a lease more, for the claims queued to be past their
	// leases by the dispatcher's reckoning too (a claim reached at its
	// lease's end may be enqueued, and its next claim meet it: a conflict),
	// and the claims of the jobs taken back to be well within theirs.
	since := int(d.Stats().Claimed) - n
	waitFor(t, 20*time.Second, "the leases of the claims since the pause to run out", func() bool {
		return b.RecoveryStats().Requeued >= since
	})
	time.Sleep(lease / 2)
	px.Resume()
	slow.hold()
	waitEachRanOnce(t, log, b, jobs, 10*time.Second)
	return d.Stats(), slow.n.Load()
}

// slowCalls counts a client's commands that take longer than d, but for
// those under way while the test holds them on purpose (between two
// calls of hold).
type slowCalls struct {
	d     time.Duration
	holds atomic.Int64 // odd while the test holds the commands
	n     atomic.Int64
}

func (s *slowCalls) hold() { s.holds.Add(1) }

func (s *slowCalls) DialHook(next redis.DialHook) redis.DialHook { return next }

func (s *slowCalls) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h, start := s.holds.Load(), time.Now()
		err := next(ctx, cmd)
		if time.Since(start) > s.d && h%2 == 0 && s.holds.Load() == h {
			s.n.Add(1)
		}
		return err
	}
}

func (s *slowCalls) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// A slow asynq (each enqueue takes 300 ms) gets only the claims it can
// enqueue within a quarter of their lease: none waits past its lease, so
// none goes back and none meets its own task as a conflict. A queue of
// claims sized for a fast asynq (8 rounds of 4 enqueues) would hold its
// last claims 2.4 s, past their 2 s lease; paced, a claim waits 300 ms.
// A claim can wait past its lease only behind enqueues that take seconds:
// an attempt whose asynq client had calls slower than twice the delay
// (a loaded machine) starts over on a rig of its own, up to 3 attempts.
func TestDispatcherPacesClaimsToASlowAsynq(t *testing.T) {
	t.Parallel()
	const delay = 300 * time.Millisecond
	startOver(t, 3, func(int) (fault, excuse string) {
		st, slow := pacedToASlowAsynq(t, delay)
		if st.Failed == 0 && st.Conflicts == 0 && st.Enqueued == 32 {
			t.Logf("dispatcher: %+v", st)
			return "", ""
		}
		fault = fmt.Sprintf("stats %+v: want every job enqueued once, none past its lease", st)
		if slow == 0 {
			return fault, ""
		}
		return fault, fmt.Sprintf("%d calls slower than %v", slow, 2*delay)
	})
}

// pacedToASlowAsynq runs one attempt of
// TestDispatcherPacesClaimsToASlowAsynq: the dispatcher's stats once every
// job ran, and how many commands of its asynq client took longer than
// twice the delay.
func pacedToASlowAsynq(t *testing.T, delay time.Duration) (DispatcherStats, int64) {
	r := newLeaseRig(t, 2*time.Second)
	// Four connections made and asynq's script loaded before the delay:
	// a new connection's handshake would add round trips of its own.
	r.warm(t, 4)
	slow := &slowCalls{d: 2 * delay}
	r.via.AddHook(slow)
	r.px.SetDelay(delay)
	d := r.dispatcher(t, 4)
	jobs := r.jobs(32, "slow-")
	must(t, r.b.Schedule(ctx, jobs...))
	stop := runDispatcher(t, d)
	defer stop()
	waitEachRanOnce(t, r.log, r.b, jobs, 20*time.Second)
	return d.Stats(), slow.n.Load()
}

// leaseRig is what the tests of claims and their leases share: an asynq
// server on queue q that logs its runs, and a broker (key of its own,
// lease as given) whose jobs go back at once, up to 100 times, for
// dispatchers whose asynq client goes through proxy px (via).
type leaseRig struct {
	q   string
	log *runsLog
	px  *proxy
	via *redis.Client
	b   *Broker
}

func newLeaseRig(t *testing.T, lease time.Duration) leaseRig {
	r := leaseRig{q: testQueue(t), log: &runsLog{runs: map[string][]JobInfo{}}, px: newProxy(t, testAddr)}
	startAsynq(t, testAddr, r.q, WithJob(r.log.handler()), asynq.Config{Concurrency: 4})
	r.via = clientVia(t, r.px)
	r.b = newBroker(t, BrokerOptions{Key: testKey(t), Lease: lease, MaxAttempts: 100,
		Backoff: func(int) time.Duration { return 0 }})
	return r
}

// warm makes n connections of the rig's asynq client and loads asynq's
// enqueue script, with an enqueue on each into a queue of their own.
func (r leaseRig) warm(t *testing.T, n int) {
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := asynq.NewClientFromRedisClient(r.via).Enqueue(asynq.NewTask("t", nil), asynq.Queue(r.q+"-warm")); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
}

// dispatcher makes a dispatcher of conc workers on the rig's broker and
// proxied client, recovering every 20 ms.
func (r leaseRig) dispatcher(t *testing.T, conc int) *Dispatcher {
	d, err := NewDispatcher(r.b, asynq.NewClientFromRedisClient(r.via), DispatcherOptions{
		Concurrency: conc, RecoveryInterval: 20 * time.Millisecond, EnqueueTimeout: time.Minute})
	must(t, err)
	return d
}

// jobs returns n jobs due a second ago, for the rig's queue.
func (r leaseRig) jobs(n int, prefix string) []Job {
	jobs := jobsDue(n, prefix, time.Now().Add(-time.Second))
	for i := range jobs {
		jobs[i].Queue = r.q
	}
	return jobs
}

// The claims a pipeline lets out follow the pace of the enqueues: a claim
// per worker until one has ended, then one more round of the workers for
// each enqueue time that fits in a quarter of the lease, up to the queue.
func TestDispatcherClaimLimit(t *testing.T) {
	t.Parallel()
	b := newBroker(t, BrokerOptions{Lease: time.Second})
	d, err := NewDispatcher(b, newAsynqClient(t, testAddr), DispatcherOptions{Concurrency: 4})
	must(t, err)
	p := d.newPipeline(nil)
	if most := 4 + 2*16; cap(p.queue) != most {
		t.Fatalf("queue of %d, want %d", cap(p.queue), most)
	}
	for _, c := range []struct {
		took time.Duration // the average enqueue; 0: none has ended
		want int
	}{{0, 4}, {2 * time.Second, 4}, {300 * time.Millisecond, 4}, {250 * time.Millisecond, 8},
		{100 * time.Millisecond, 12}, {10 * time.Millisecond, 36}, {time.Nanosecond, 36}} {
		d.enqueueTime.ns.Store(int64(c.took))
		if got := p.limit(); got != c.want {
			t.Errorf("enqueues of %v: limit %d, want %d", c.took, got, c.want)
		}
	}
	// The average takes its first observation whole, then an eighth of
	// each: 800, 800 - 800/8 = 700, 700 - 700/8 = 613.
	var a average
	for _, v := range []time.Duration{800, 0, 0} {
		a.observe(v)
	}
	if got := a.get(); got != 613 {
		t.Errorf("average of 800 ns, 0, 0: %v, want 613ns", got)
	}
}

// waitEachRanOnce waits up to d for every one of jobs to run and for b's
// schedule to empty, then checks that each ran once.
func waitEachRanOnce(t *testing.T, log *runsLog, b *Broker, jobs []Job, d time.Duration) {
	t.Helper()
	waitFor(t, d, "every job to run", func() bool {
		log.mu.Lock()
		defer log.mu.Unlock()
		return len(log.runs) == len(jobs)
	})
	waitFor(t, 20*time.Second, "the schedule to empty", func() bool {
		st, err := b.Stats(ctx)
		return err == nil && st.Scheduled == 0 && st.Inflight == 0
	})
	for _, j := range jobs {
		if n := len(log.get(j.ID)); n != 1 {
			t.Errorf("%s ran %d times", j.ID, n)
		}
	}
}

// A panic in a user callback does not kill the process: TaskOptions'
// panic sends that job to the dead set with the panic as its reason, and
// OnDispatch's is logged while the dispatch stands.
func TestDispatcherCallbackPanics(t *testing.T) {
	t.Parallel()
	q := testQueue(t)
	// A lease no enqueue outlasts, however loaded the machine: a batch
	// whose lease ran out would come back and count its jobs again.
	b := newBroker(t, BrokerOptions{Lease: time.Minute})
	var hooked atomic.Int64
	d, err := NewDispatcher(b, newAsynqClient(t, testAddr), DispatcherOptions{
		TaskOptions: func(j Job) []asynq.Option {
			if j.ID == "bad" {
				panic("no options for bad")
			}
			return []asynq.Option{asynq.Queue(q)}
		},
		OnDispatch: func(c JobInfo, _ time.Duration, err error) {
			hooked.Add(1)
			if c.ID == "good-1" {
				panic(fmt.Errorf("hook failed for %s", c.ID))
			}
		},
	})
	must(t, err)
	runDispatcher(t, d)
	due := time.Now().Add(-time.Second)
	for _, id := range []string{"good-0", "good-1", "bad", "good-2"} {
		must(t, b.Schedule(ctx, Job{ID: id, RunAt: due, Type: "t"}))
	}
	waitFor(t, 20*time.Second, "every job settled", func() bool {
		st, err := b.Stats(ctx)
		// At least 4 hooks: a failed enqueue (a loaded machine) is one more.
		return err == nil && st.Scheduled == 0 && st.Inflight == 0 && hooked.Load() >= 4
	})
	if st := d.Stats(); st.Enqueued != 3 || st.Dead != 1 {
		t.Fatalf("dispatcher stats %+v, want 3 enqueued and 1 dead", st)
	}
	dead, err := listDead(b, 10)
	must(t, err)
	if len(dead) != 1 || dead[0].ID != "bad" || !strings.Contains(dead[0].Reason, "TaskOptions panicked: no options for bad") {
		t.Fatalf("dead set %+v", dead)
	}
}

// claimCounter counts the claim scripts a client sends.
type claimCounter struct{ n *atomic.Int64 }

func (h claimCounter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h claimCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if a := cmd.Args(); len(a) > 1 && a[1] == claimScript.Hash() {
			h.n.Add(1)
		}
		return next(ctx, cmd)
	}
}
func (h claimCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			if a := cmd.Args(); len(a) > 1 && a[1] == claimScript.Hash() {
				h.n.Add(1)
			}
		}
		return next(ctx, cmds)
	}
}

// On a schedule of 16 shards, a dispatcher working off a backlog claims
// in batches: the room a claim leaves in its queue waits for a batch
// rather than go to the next shard as a small claim of its own.
func TestShardedDispatchClaimsInBatches(t *testing.T) {
	t.Parallel()
	rdb := newClient(t)
	var claims atomic.Int64
	rdb.AddHook(claimCounter{&claims})
	b, err := NewBroker(rdb, BrokerOptions{Key: testKey(t), Shards: 16, Lease: time.Minute})
	must(t, err)
	q := testQueue(t)
	const n = 8000
	scheduleDueJobs(t, b, n, q)
	claims.Store(0)
	d, err := NewDispatcher(b, newAsynqClient(t, testAddr), DispatcherOptions{Concurrency: 16, RecoveryInterval: -1})
	must(t, err)
	runDispatcher(t, d)
	waitProgress(t, 30*time.Second, "jobs dispatched", n, func() int { return int(d.Stats().Enqueued) }, nil)
	// A claim takes up to half the queue (64) under load; each shard's
	// last claim may be small.
	limit := int64(n/64*3/2 + 2*16)
	if got := claims.Load(); got > limit {
		t.Fatalf("%d claims for %d jobs on 16 shards (%.0f jobs a claim); want at most %d", got, n, float64(n)/float64(got), limit)
	} else {
		t.Logf("%d claims for %d jobs (%.0f a claim)", got, n, float64(n)/float64(got))
	}
}

// enqueueBatches records how many asynq enqueue scripts each round trip of
// a client carries.
type enqueueBatches struct {
	mu    sync.Mutex
	sizes map[int]int // enqueues in a round trip -> round trips
}

func (h *enqueueBatches) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *enqueueBatches) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.add([]redis.Cmder{cmd})
		return next(ctx, cmd)
	}
}
func (h *enqueueBatches) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.add(cmds)
		return next(ctx, cmds)
	}
}
func (h *enqueueBatches) add(cmds []redis.Cmder) {
	n := 0
	for _, c := range cmds {
		if c.Name() == "evalsha" || c.Name() == "eval" {
			n++
		}
	}
	if n > 0 {
		h.mu.Lock()
		h.sizes[n]++
		h.mu.Unlock()
	}
}

// A backlog dispatched through an asynq client on an autopipelined
// go-redis client (the quick start's): the enqueues of one moment share
// round trips, and every job becomes exactly one pending task.
func TestDispatcherOnAutopipelinedClient(t *testing.T) {
	t.Parallel()
	b := newBroker(t, BrokerOptions{Key: testKey(t), Lease: time.Minute})
	q := testQueue(t)
	const n = 3000
	scheduleDueJobs(t, b, n, q)
	sizes := &enqueueBatches{sizes: map[int]int{}}
	d, err := NewDispatcher(b, newAutopipelinedAsynqClient(t, testAddr, sizes), DispatcherOptions{RecoveryInterval: -1})
	must(t, err)
	runDispatcher(t, d)
	waitProgress(t, 30*time.Second, "jobs dispatched", n, func() int { return int(d.Stats().Enqueued) }, nil)
	waitFor(t, 20*time.Second, "the batches settled", func() bool {
		st, _ := b.Stats(ctx)
		return st.Scheduled == 0 && st.Inflight == 0
	})
	if st := d.Stats(); st.Conflicts != 0 || st.Failed != 0 || st.Dead != 0 {
		t.Fatalf("dispatcher %+v", st)
	}
	qi, err := newInspector(t).GetQueueInfo(q)
	must(t, err)
	if qi.Pending != n {
		t.Fatalf("asynq holds %d pending tasks, want %d", qi.Pending, n)
	}
	sizes.mu.Lock()
	defer sizes.mu.Unlock()
	trips, grouped := 0, 0
	for k, v := range sizes.sizes {
		trips += v
		if k > 1 {
			grouped += k * v
		}
	}
	t.Logf("%d enqueues in %d round trips; %d of them shared one", n, trips, grouped)
	if grouped == 0 {
		t.Fatalf("no two enqueues of %d shared a round trip: %v", n, sizes.sizes)
	}
}

// scheduleDueJobs schedules n jobs of type "t" on queue q, due a second ago.
func scheduleDueJobs(t *testing.T, b *Broker, n int, q string) {
	t.Helper()
	due := time.Now().Add(-time.Second)
	jobs := make([]Job, n)
	for i := range jobs {
		jobs[i] = Job{ID: "j" + strconv.Itoa(i), RunAt: due, Type: "t", Queue: q}
	}
	must(t, b.Schedule(ctx, jobs...))
}
