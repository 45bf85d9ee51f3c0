package zclaim

import (
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
	d, err := NewDispatcher(b, asynq.NewClientFromRedisClient(rdb), DispatcherOptions{RecoveryInterval: 20 * time.Millisecond})
	must(t, err)
	fmt.Println("ready")
	d.Run(context.Background())
}

func periodicDefs(queue string) []Periodic {
	return []Periodic{
		{Name: "every", Spec: "@every 1s", Type: "t", Queue: queue},
		{Name: "cron", Spec: "*/2 * * * * *", Type: "t", Queue: queue},
	}
}

// Three dispatchers in separate processes share a schedule with an
// "@every 1s" and a "*/2 * * * * *" definition; one of them is SIGKILLed
// and restarted every 700 ms. Every tick from the first to the last runs
// exactly once, none before its time (but for at most one per definition
// that gives way to the next under RunLatest, on a machine that stalled).
// An attempt whose ticks went missing while a child took over a second to
// start (a machine that stalled for seconds) proves nothing either way:
// it starts over, 3 times at most. Ticks run twice or early fail at once.
func TestPeriodicAcrossProcesses(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("runs for seconds")
	}
	for attempt := 1; ; attempt++ {
		missing, errs, slowest := periodicAcrossProcesses(t)
		if len(errs) > 0 || len(missing) > 0 && (slowest < time.Second || attempt == 3) {
			t.Fatalf("attempt %d (the slowest child started in %v):\n%s", attempt, slowest,
				strings.Join(append(errs, missing...), "\n"))
		}
		if len(missing) == 0 {
			return
		}
		t.Logf("attempt %d: %s; a child took %v to start: again", attempt, strings.Join(missing, "; "), slowest)
	}
}

// periodicAcrossProcesses runs TestPeriodicAcrossProcesses' scenario once,
// on keys and a queue of its own. It returns the ticks found missing, the
// other faults, and the longest a child took to start.
func periodicAcrossProcesses(t *testing.T) (missing, errs []string, slowest time.Duration) {
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

	start := func() *exec.Cmd {
		began := time.Now()
		cmd := exec.Command(os.Args[0], "-test.run=^TestPeriodicHelper$")
		cmd.Env = append(os.Environ(), redisEnv+"="+testAddr, periodicHelperEnv+"="+key+" "+q)
		proc.DieWithParent(cmd)
		out, err := cmd.StdoutPipe()
		must(t, err)
		must(t, cmd.Start())
		line, rest, err := proc.FirstLine(out, 30*time.Second)
		if err != nil || line != "ready" {
			cmd.Process.Kill()
			cmd.Wait()
			t.Fatalf("child did not start: %q, %v", line, err)
		}
		go io.Copy(io.Discard, rest)
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
	until := time.Now().Add(5 * time.Second)
	for i := 0; time.Now().Before(until); i++ {
		time.Sleep(700 * time.Millisecond)
		kill(procs[i%3])
		procs[i%3] = start()
	}
	// Let the last ticks finish, then stop every dispatcher.
	time.Sleep(600 * time.Millisecond)
	for _, c := range procs {
		kill(c)
	}
	procs = nil
	time.Sleep(300 * time.Millisecond)

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
	return missing, errs, slowest
}
