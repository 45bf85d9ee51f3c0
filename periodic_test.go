package zclaim

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/zclaim/zclaim/internal/proc"
)

// SetPeriodic from many replicas at once stores each definition once and
// schedules one tick each; the same call again changes nothing; a changed
// payload keeps the tick, a changed spec moves it; DeletePeriodic removes
// both. Bad definitions change nothing.
func TestSetPeriodic(t *testing.T) {
	t.Parallel()
	b := newBroker(t, BrokerOptions{})
	defs := []Periodic{
		{Name: "report", Spec: "0 6 * * *", Type: "report", Location: mustZone(t, "Europe/Paris")},
		{Name: "poll", Spec: "@every 1m", Type: "poll", Queue: "low"},
	}
	onOwnConns(t, 8, b.opts, func(_ int, bb *Broker) {
		if err := bb.SetPeriodic(ctx, defs...); err != nil {
			t.Error(err)
		}
	})
	st, err := b.Stats(ctx)
	must(t, err)
	if st.Scheduled != 2 {
		t.Fatalf("%d ticks scheduled, want 2", st.Scheduled)
	}
	list, err := b.ListPeriodic(ctx)
	must(t, err)
	sort.Slice(list, func(i, j int) bool { return list[i].Name < list[j].Name })
	if len(list) != 2 || list[1].Name != "report" || list[1].Location.String() != "Europe/Paris" || list[0].Queue != "low" {
		t.Fatalf("list: %+v", list)
	}
	next := list[1].Next
	if h := next.In(mustZone(t, "Europe/Paris")); h.Hour() != 6 || h.Minute() != 0 || !next.After(time.Now()) {
		t.Fatalf("next report tick %v", h)
	}
	j, err := b.Job(ctx, "periodic:report")
	must(t, err)
	if !j.Due.Equal(next) || j.Type != "report" {
		t.Fatalf("the tick: %+v, want due %v", j, next)
	}

	defs[0].Payload = []byte("v2")
	must(t, b.SetPeriodic(ctx, defs...))
	j, err = b.Job(ctx, "periodic:report")
	must(t, err)
	if !j.Due.Equal(next) || j.PayloadSize != 2 {
		t.Fatalf("after a new payload: %+v", j)
	}
	defs[0].Spec = "0 7 * * *"
	must(t, b.SetPeriodic(ctx, defs...))
	j, err = b.Job(ctx, "periodic:report")
	must(t, err)
	if j.Due.In(mustZone(t, "Europe/Paris")).Hour() != 7 {
		t.Fatalf("after a new spec: %+v", j)
	}

	for _, bad := range []Periodic{
		{Name: "", Spec: "@hourly", Type: "t"},
		{Name: "x", Spec: "61 * * * *", Type: "t"},
		{Name: "x", Spec: "@hourly"},
		{Name: "x", Spec: "@hourly", Type: "t", Location: time.Local},
	} {
		wantErr(t, b.SetPeriodic(ctx, bad), ErrInvalidArgument)
	}
	wantErr(t, b.SetPeriodic(ctx, defs[1], defs[1]), ErrInvalidArgument)
	wantErr(t, b.Schedule(ctx, Job{ID: "periodic:mine", RunAt: time.Now()}), ErrReservedID)

	ok, err := b.DeletePeriodic(ctx, "report")
	must(t, err)
	if !ok {
		t.Fatal("DeletePeriodic: not found")
	}
	if _, err := b.Job(ctx, "periodic:report"); err == nil {
		t.Fatal("the tick of a deleted definition is still there")
	}
	if st, _ := b.Stats(ctx); st.Scheduled != 1 {
		t.Fatalf("%d scheduled after delete", st.Scheduled)
	}
}

func mustZone(t *testing.T, name string) *time.Location {
	loc, err := time.LoadLocation(name)
	must(t, err)
	return loc
}

// backdate moves a definition's tick (and mark) to at, as if no
// dispatcher had run since then.
func backdate(t *testing.T, b *Broker, name string, at time.Time) {
	raw, err := b.rdb.HGet(ctx, b.keys.ticks, name).Result()
	must(t, err)
	_, timing, _ := strings.Cut(raw, " ")
	rec, err := b.rdb.HGet(ctx, b.keys.pending, PeriodicPrefix+name).Result()
	must(t, err)
	_, rest, _ := strings.Cut(rec, ":")
	p := b.rdb.TxPipeline()
	p.HSet(ctx, b.keys.ticks, name, fmt.Sprint(at.UnixMilli(), " ", timing))
	p.ZAdd(ctx, b.keys.schedule, redis.Z{Score: float64(at.UnixMilli()) / 1000, Member: PeriodicPrefix + name})
	p.HSet(ctx, b.keys.pending, PeriodicPrefix+name, "0@"+b.score(at)+":"+rest)
	_, err = p.Exec(ctx)
	must(t, err)
}

// After downtime across many ticks, a definition runs its latest missed
// tick once (RunLatest) or none (SkipMissed), and goes on from the next
// tick to come.
func TestPeriodicMissedTicks(t *testing.T) {
	t.Parallel()
	q := testQueue(t)
	log := &runsLog{runs: map[string][]JobInfo{}}
	startAsynq(t, testAddr, q, WithJob(log.handler()), asynq.Config{})
	b := newBroker(t, BrokerOptions{})
	must(t, b.SetPeriodic(ctx,
		Periodic{Name: "latest", Spec: "@every 1h", Type: "t", Queue: q},
		Periodic{Name: "skip", Spec: "@every 1h", Type: "t", Queue: q, Missed: SkipMissed}))
	now := redisNow(t, b.rdb).Truncate(time.Second)
	backdate(t, b, "latest", now.Add(-10*time.Hour))
	backdate(t, b, "skip", now.Add(-10*time.Hour))
	d, err := NewDispatcher(b, newAsynqClient(t, testAddr), DispatcherOptions{})
	must(t, err)
	runDispatcher(t, d)
	waitFor(t, 20*time.Second, "the latest missed tick run", func() bool { return log.total() == 1 })
	// Both definitions' next ticks written: counts alone would not tell
	// them from a tick given back with backoff (its lease of 50 ms ran out
	// on a loaded machine), still due at its backdated time.
	waitFor(t, 20*time.Second, "both next ticks written", func() bool {
		for _, name := range []string{"latest", "skip"} {
			if j, err := b.Job(ctx, PeriodicPrefix+name); err != nil || !j.Due.After(now) {
				return false
			}
		}
		st, _ := b.Stats(ctx)
		return st.Scheduled == 2 && st.Inflight == 0
	})
	time.Sleep(50 * time.Millisecond)
	runs := log.get("periodic:latest")
	if len(runs) != 1 || log.total() != 1 {
		t.Fatalf("runs: %+v", log.counts())
	}
	// The latest tick at or before now: one of @every 1h from the
	// backdated one, within the last hour.
	if age := now.Sub(runs[0].Due); age < 0 || age >= time.Hour || runs[0].Due.Sub(now.Add(-10*time.Hour))%time.Hour != 0 {
		t.Fatalf("ran the tick of %v (now %v)", runs[0].Due, now)
	}
	// The next tick is an hour after the tick dispatched, which came at
	// the latest now: at most an hour after now by Redis' clock (a
	// loaded machine may dispatch seconds after the test began).
	later := redisNow(t, b.rdb)
	for _, name := range []string{"latest", "skip"} {
		j, err := b.Job(ctx, PeriodicPrefix+name)
		must(t, err)
		if !j.Due.After(now) || j.Due.After(later.Add(time.Hour+time.Second)) {
			t.Fatalf("%s: next tick %v, test began %v, now %v", name, j.Due, now, later)
		}
	}
}

const periodicHelperEnv = "ZCLAIM_PERIODIC_HELPER"

// TestPeriodicHelper is a child process of TestPeriodicAcrossProcesses: a
// dispatcher on the schedule it is given, until it is killed.
func TestPeriodicHelper(t *testing.T) {
	t.Parallel()
	cfg := os.Getenv(periodicHelperEnv)
	if cfg == "" {
		t.Skip("the child process of TestPeriodicAcrossProcesses")
	}
	var key, queue string
	if _, err := fmt.Sscan(cfg, &key, &queue); err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: testAddr})
	// No backoff: a tick claimed by a dispatcher that was killed comes back
	// after its lease, not up to seconds later (DefaultBackoff doubles with
	// each attempt), when later ticks are due and it gives way to them.
	b, err := NewBroker(rdb, BrokerOptions{Key: key, Lease: 200 * time.Millisecond,
		Backoff: func(int) time.Duration { return 0 }})
	must(t, err)
	// Every replica sets the same definitions at start-up.
	must(t, b.SetPeriodic(ctx, periodicDefs(queue)...))
	// The asynq client's enqueues wait at the parent's gate.
	via := redis.NewClient(&redis.Options{Addr: testAddr})
	via.AddHook(&gate{in: bufio.NewReader(os.Stdin)})
	d, err := NewDispatcher(b, asynq.NewClientFromRedisClient(via), DispatcherOptions{RecoveryInterval: 20 * time.Millisecond})
	must(t, err)
	fmt.Println("ready")
	d.Run(context.Background())
}

// gate stops each of a child's enqueues into asynq twice, for its parent
// to kill the child there or let it go on: it prints "enqueue <task key>"
// before asynq's enqueue script goes to Redis and "enqueued <task key>"
// once Redis answered it, and waits after each for a line on stdin.
type gate struct {
	mu sync.Mutex // one question at a time
	in *bufio.Reader
}

func (g *gate) ask(verb, key string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	fmt.Println(verb, key)
	if _, err := g.in.ReadString('\n'); err != nil {
		select {} // the parent is gone: wait for its SIGKILL
	}
}

func (g *gate) DialHook(next redis.DialHook) redis.DialHook { return next }
func (g *gate) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (g *gate) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		// asynq's enqueue: EVALSHA (or EVAL) sha 2 asynq:{queue}:t:<id> ...
		args := cmd.Args()
		name := strings.ToLower(cmd.Name())
		key, _ := args[min(3, len(args)-1)].(string)
		if name != "evalsha" && name != "eval" || !strings.Contains(key, "}:t:") {
			return next(ctx, cmd)
		}
		g.ask("enqueue", key)
		err := next(ctx, cmd)
		if err == nil {
			g.ask("enqueued", key)
		}
		return err
	}
}

func periodicDefs(queue string) []Periodic {
	return []Periodic{
		{Name: "every", Spec: "@every 1s", Type: "t", Queue: queue},
		{Name: "cron", Spec: "*/2 * * * * *", Type: "t", Queue: queue},
	}
}

// Three dispatchers in separate processes share a schedule with an
// "@every 1s" and a "*/2 * * * * *" definition. A child that enqueues a
// tick is SIGKILLed there, once for each tick: before its enqueue for one
// tick of a definition in two, after it for the others. Beside those, one
// child is SIGKILLed every 700 ms; each is restarted at once. Every tick
// from the first to the last runs exactly once, none before its time (but
// for at most one per definition that gives way to the next under
// RunLatest, on a machine that stalled). An attempt whose ticks went
// missing while a child took over a second to start, or while the test
// process itself went a quarter of a second without running (a machine
// that stalled), proves nothing either way: it starts over, 3 times at
// most. Ticks run twice or early fail at once.
func TestPeriodicAcrossProcesses(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("runs for seconds")
	}
	startOver(t, 3, func(int) (fault, excuse string) {
		missing, errs, slowest, paused := periodicAcrossProcesses(t)
		took := fmt.Sprintf("the slowest child started in %v; the test process paused for %v at most", slowest, paused)
		switch {
		case len(errs) > 0:
			return strings.Join(append(errs, missing...), "\n") + "\n" + took, ""
		case len(missing) == 0:
			t.Log(took)
			return "", ""
		case slowest >= time.Second || paused >= time.Second/4:
			return strings.Join(missing, "\n"), took
		}
		return strings.Join(missing, "\n") + "\n" + took, ""
	})
}

// periodicAcrossProcesses runs TestPeriodicAcrossProcesses' scenario once,
// on keys and a queue of its own. It returns the ticks found missing, the
// other faults, the longest a child took to start and the longest the
// test process went without running.
func periodicAcrossProcesses(t *testing.T) (missing, errs []string, slowest, paused time.Duration) {
	longest := pauses()
	defer func() { paused = longest() }()
	key, q := testKey(t), testQueue(t)
	var mu sync.Mutex
	type run struct {
		due   time.Time
		start time.Time
	}
	runs := map[string][]run{}
	rdb := newClient(t)
	h := asynq.HandlerFunc(func(ctx context.Context, task *asynq.Task) error {
		now, err := rdb.Time(ctx).Result()
		if err != nil {
			return err
		}
		j, ok := JobFromContext(ctx)
		if !ok {
			return fmt.Errorf("no JobInfo")
		}
		mu.Lock()
		defer mu.Unlock()
		runs[j.ID] = append(runs[j.ID], run{j.Due, now})
		return nil
	})
	startAsynq(t, testAddr, q, WithJob(h), asynq.Config{Concurrency: 4})

	// A child that enqueues a tick dies there, once for each tick: before
	// its enqueue script goes for one tick of a definition in two, after
	// Redis answered it for the others. The tick comes back after its
	// lease, claimed by another child, which must enqueue it (or meet its
	// TaskID) and write the definition's next tick.
	type fate struct {
		at    string    // "enqueue" (dies before) or "enqueued" (after)
		child *exec.Cmd // the latest child to enqueue the tick: the one to die
		done  bool      // a child died at it
	}
	var gmu sync.Mutex
	fates := map[string]*fate{} // task key -> its fate
	turns := map[string]int{}   // definition -> its ticks seen
	died := map[string]int{}    // children killed at "enqueue", at "enqueued"
	stopping := false           // once set, no child dies at the gate
	gone := make(chan *exec.Cmd, 100)
	answer := func(c *exec.Cmd, stdin io.Writer, out *bufio.Reader) {
		for {
			line, err := out.ReadString('\n')
			if err != nil {
				return
			}
			verb, key, _ := strings.Cut(strings.TrimSpace(line), " ")
			gmu.Lock()
			f := fates[key]
			if f == nil {
				def, _, _ := strings.Cut(key, "@") // each definition's ticks take turns
				f = &fate{at: [2]string{"enqueue", "enqueued"}[turns[def]%2]}
				fates[key] = f
				turns[def]++
			}
			if verb == "enqueue" {
				// A child killed elsewhere first leaves the death to the next.
				f.child = c
			}
			die := !stopping && !f.done && f.child == c && f.at == verb
			if die {
				f.done = true
				died[verb]++
			}
			gmu.Unlock()
			if die {
				c.Process.Signal(syscall.SIGKILL)
				gone <- c
				return
			}
			io.WriteString(stdin, "go\n")
		}
	}
	start := func() *exec.Cmd {
		began := time.Now()
		cmd := exec.Command(os.Args[0], "-test.run=^TestPeriodicHelper$")
		cmd.Env = append(os.Environ(), redisEnv+"="+testAddr, periodicHelperEnv+"="+key+" "+q)
		proc.DieWithParent(cmd)
		out, err := cmd.StdoutPipe()
		must(t, err)
		stdin, err := cmd.StdinPipe()
		must(t, err)
		must(t, cmd.Start())
		line, rest, err := proc.FirstLine(out, 30*time.Second)
		if err != nil || line != "ready" {
			cmd.Process.Kill()
			cmd.Wait()
			t.Fatalf("child did not start: %q, %v", line, err)
		}
		go answer(cmd, stdin, rest)
		slowest = max(slowest, time.Since(began))
		return cmd
	}
	kill := func(c *exec.Cmd) { c.Process.Signal(syscall.SIGKILL); c.Wait() }
	procs := []*exec.Cmd{start(), start(), start()}
	defer func() {
		for _, c := range procs {
			kill(c)
		}
	}()
	// A child that died at the gate is restarted, unless one killed it
	// (and restarted it) first.
	restart := func(c *exec.Cmd) {
		for j := range procs {
			if procs[j] == c {
				kill(c)
				procs[j] = start()
			}
		}
	}
	// Beside the gate's deaths, one child is killed every 700 ms, at
	// whatever it was doing.
	until := time.After(5 * time.Second)
	every := time.NewTicker(700 * time.Millisecond)
	defer every.Stop()
	for i, run := 0, true; run; {
		select {
		case c := <-gone:
			restart(c)
		case <-every.C:
			kill(procs[i%3])
			procs[i%3] = start()
			i++
		case <-until:
			run = false
		}
	}
	// Let the last ticks finish, unhindered, then stop every dispatcher.
	gmu.Lock()
	stopping = true
	gmu.Unlock()
	for len(gone) > 0 {
		restart(<-gone)
	}
	time.Sleep(600 * time.Millisecond)
	for _, c := range procs {
		kill(c)
	}
	procs = nil
	time.Sleep(300 * time.Millisecond)

	gmu.Lock()
	before, after := died["enqueue"], died["enqueued"]
	gmu.Unlock()
	// A gate that never stops an enqueue (asynq's script named its key
	// otherwise) would leave the recovery of claimed ticks untested; a
	// machine that stalled for seconds can leave too few ticks to kill at.
	if before < 2 || after < 2 {
		missing = append(missing, fmt.Sprintf("the gate killed %d children before an enqueue and %d after one, want 2 each", before, after))
	}
	t.Logf("the gate killed %d children before an enqueue and %d after one", before, after)

	mu.Lock()
	defer mu.Unlock()
	for name, period := range map[string]time.Duration{"periodic:every": time.Second, "periodic:cron": 2 * time.Second} {
		rs := runs[name]
		sort.Slice(rs, func(i, j int) bool { return rs[i].due.Before(rs[j].due) })
		if len(rs) < int(5*time.Second/period)-1 {
			missing = append(missing, fmt.Sprintf("%s ran %d ticks in about 5 s", name, len(rs)))
			continue
		}
		var lags []time.Duration
		gaveWay := 0
		for i, r := range rs {
			if r.start.Before(r.due) {
				errs = append(errs, fmt.Sprintf("%s: tick %v started early, at %v", name, r.due, r.start))
			}
			lags = append(lags, r.start.Sub(r.due))
			if i > 0 {
				switch gap := r.due.Sub(rs[i-1].due); {
				case gap == 0:
					errs = append(errs, fmt.Sprintf("%s: tick %v ran twice", name, r.due))
				case gap == 2*period && gaveWay == 0:
					// RunLatest: a tick claimed once the next was due (a
					// dispatcher killed with it, on a machine that stalled
					// past the period) gives way to the next. Once.
					gaveWay++
					t.Logf("%s: the tick between %v and %v gave way to the next (RunLatest)", name, rs[i-1].due, r.due)
				case gap != period:
					missing = append(missing, fmt.Sprintf("%s: %v between ticks %v and %v: ticks are missing", name, gap, rs[i-1].due, r.due))
				}
			}
			if r.due.UnixMilli()%period.Milliseconds() != 0 {
				errs = append(errs, fmt.Sprintf("%s: tick %v is not on a %v boundary", name, r.due, period))
			}
		}
		sort.Slice(lags, func(i, j int) bool { return lags[i] < lags[j] })
		t.Logf("%s: %d ticks; tick -> handler start p50 %v, max %v", name, len(rs), lags[len(lags)/2], lags[len(lags)-1])
	}
	return missing, errs, slowest, 0 // paused: the deferred call's
}

// pauses measures how long the process goes without running a goroutine
// that wakes every 10 ms: the longest the machine stalled it. The function
// it returns stops the measure and tells the longest pause beyond the
// 10 ms.
func pauses() (longest func() time.Duration) {
	stop, done := make(chan struct{}), make(chan time.Duration)
	go func() {
		var most time.Duration
		for {
			select {
			case <-stop:
				done <- most
				return
			default:
			}
			began := time.Now()
			time.Sleep(10 * time.Millisecond)
			most = max(most, time.Since(began)-10*time.Millisecond)
		}
	}()
	return func() time.Duration { close(stop); return <-done }
}
