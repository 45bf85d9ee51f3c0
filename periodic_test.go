package zclaim

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/robfig/cron/v3"
	"github.com/zclaim/zclaim/internal/logbuf"
	"github.com/zclaim/zclaim/internal/proc"
	"pgregory.net/rapid"
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

// periodicRole makes the test binary a dispatcher process of
// TestPeriodicAcrossProcesses (runPeriodicRole, called from TestMain).
const periodicRole = "ZCLAIM_TEST_PERIODIC"

// runPeriodicRole runs this process as a dispatcher of
// TestPeriodicAcrossProcesses if the environment says so ("<redis address>
// <schedule key> <asynq queue>"): it sets the test's definitions, prints
// "ready", waits for the parent's "run" and dispatches until it is killed.
func runPeriodicRole() bool {
	cfg := os.Getenv(periodicRole)
	if cfg == "" {
		return false
	}
	var addr, key, queue string
	_, err := fmt.Sscan(cfg, &addr, &key, &queue)
	roleMust(err)
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	// No backoff: a tick claimed by a dispatcher that was killed comes back
	// after its lease, not up to seconds later (DefaultBackoff doubles with
	// each attempt), when later ticks are due and it gives way to them.
	b, err := NewBroker(rdb, BrokerOptions{Key: key, Lease: 200 * time.Millisecond,
		Backoff: func(int) time.Duration { return 0 }})
	roleMust(err)
	// Every replica sets the same definitions at start-up.
	roleMust(b.SetPeriodic(context.Background(), periodicDefs(queue)...))
	// The asynq client's enqueues wait at the parent's gate.
	in := bufio.NewReader(os.Stdin)
	via := redis.NewClient(&redis.Options{Addr: addr})
	via.AddHook(&gate{in: in})
	// Its logs go to the parent too, one JSON line each: they say which
	// ticks it skipped (claimed once the next was due).
	log := slog.New(slog.NewJSONHandler(os.Stdout, nil))
	d, err := NewDispatcher(b, asynq.NewClientFromRedisClient(via), DispatcherOptions{RecoveryInterval: 20 * time.Millisecond,
		Logger: log})
	roleMust(err)
	// A spare: started, it waits for the parent's word to run.
	fmt.Println("ready")
	if line, err := in.ReadString('\n'); err == nil && line == "run\n" {
		d.Run(context.Background())
	}
	return true
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

// periodicPeriods are the periods of periodicDefs' definitions, by name.
var periodicPeriods = map[string]time.Duration{"every": time.Second, "cron": 2 * time.Second}

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
// child is SIGKILLed every 700 ms; a spare, started ahead, takes each
// killed child's place at once. Every tick due from the start until the
// kills stop runs exactly once, none early, unless a dispatcher skipped it
// for having claimed it once the next was due (RunLatest; the children's
// logs say so). A tick that neither ran nor was skipped was lost: that,
// and ticks run twice or early, fail the test at once. One skipped tick a
// definition is allowed (a machine that stalled past a period); more
// prove nothing either way where the machine explains them: no
// dispatcher ran for a moment of the tick's period (every one killed, the
// spares not started yet), a tick beside it ran a period or more late, a
// child took a second or more to start, or the test process went a
// quarter of a second without running. Such an attempt starts over, 3
// times at most.
func TestPeriodicAcrossProcesses(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("runs for seconds")
	}
	startOver(t, 3, func(int) (fault, excuse string) {
		r := periodicAcrossProcesses(t)
		took := fmt.Sprintf("no dispatcher ran for %v in all; the slowest child started in %v; the test process paused for %v at most",
			r.idle, r.slowest, r.paused)
		switch {
		case len(r.errs) > 0:
			return strings.Join(slices.Concat(r.errs, r.missing, r.explained), "\n") + "\n" + took, ""
		case len(r.missing) == 0 && len(r.explained) == 0:
			t.Log(took)
			return "", ""
		case len(r.missing) == 0 || r.slowest >= time.Second || r.paused >= time.Second/4:
			return strings.Join(slices.Concat(r.missing, r.explained), "\n"), took
		}
		return strings.Join(slices.Concat(r.missing, r.explained), "\n") + "\n" + took, ""
	})
}

// periodicResult is what one attempt of TestPeriodicAcrossProcesses found.
type periodicResult struct {
	errs      []string      // ticks run twice, early or off their boundary
	missing   []string      // missing ticks, or kills, that the machine does not explain
	explained []string      // missing ticks that it does, each saying how
	idle      time.Duration // how long, in all, no dispatcher ran
	slowest   time.Duration // the longest a spare started once the clock ran took to start
	paused    time.Duration // the longest the test process went without running
}

// periodicSkip is a dispatcher's log record of ticks it skipped: it
// claimed name's tick of From at Now, once the next was due, and ran the
// latest tick instead (RunLatest).
type periodicSkip struct {
	Msg       string
	Name      string
	From, Now time.Time
}

// periodicChild is a dispatcher process of TestPeriodicAcrossProcesses.
type periodicChild struct {
	cmd   *exec.Cmd
	stdin io.Writer
	out   *bufio.Reader
	read  chan struct{} // closed once its output is read to the end (nil for a spare)
}

// startPeriodicChild starts a dispatcher process on schedule key and asynq
// queue q and waits until it is ready to run.
func startPeriodicChild(key, q string) (*periodicChild, error) {
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), periodicRole+"="+testAddr+" "+key+" "+q)
	proc.DieWithParent(cmd)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	line, rest, err := proc.FirstLine(out, 30*time.Second)
	if err != nil || line != "ready" {
		cmd.Process.Kill()
		cmd.Wait()
		return nil, fmt.Errorf("child did not start: %q, %v", line, err)
	}
	return &periodicChild{cmd: cmd, stdin: stdin, out: rest}, nil
}

// kill kills c and, once its output is read to the end (the last lines
// of a child killed just after it logged a skip), waits for it: Wait
// closes the pipe, and what was left in it would be lost.
func (c *periodicChild) kill() {
	c.cmd.Process.Signal(syscall.SIGKILL)
	if c.read != nil {
		<-c.read
	}
	c.cmd.Wait()
}

// periodicAcrossProcesses runs TestPeriodicAcrossProcesses' scenario once,
// on keys and a queue of its own.
func periodicAcrossProcesses(t *testing.T) (r periodicResult) {
	longest := pauses()
	defer func() { r.paused = longest() }()
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
		at    string         // "enqueue" (dies before) or "enqueued" (after)
		child *periodicChild // the latest child to enqueue the tick: the one to die
		done  bool           // a child died at it
	}
	var gmu sync.Mutex
	fates := map[string]*fate{} // task key -> its fate
	turns := map[string]int{}   // definition -> its ticks seen
	died := map[string]int{}    // children killed at "enqueue", at "enqueued"
	stopping := false           // once set, no child dies at the gate
	var skips []periodicSkip    // the ticks children said they skipped
	gone := make(chan *periodicChild, 100)
	answer := func(c *periodicChild) {
		killed := false // at the gate: its lines are read to the end, for the logs
		for {
			line, err := c.out.ReadString('\n')
			if err != nil {
				return
			}
			if strings.HasPrefix(line, "{") { // a log record
				var skip periodicSkip
				if json.Unmarshal([]byte(line), &skip) == nil && skip.Msg == "zclaim: periodic ticks were missed" {
					gmu.Lock()
					skips = append(skips, skip)
					gmu.Unlock()
				}
				continue
			}
			if killed {
				continue
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
				c.cmd.Process.Signal(syscall.SIGKILL)
				gone <- c
				killed = true
				continue
			}
			io.WriteString(c.stdin, "go\n")
		}
	}

	// Three children run; each killed one's place goes at once to a spare
	// that is ready (started ahead, waiting for the word to run), and
	// another spare starts. ups records how many run, from each moment on.
	type up struct {
		at time.Time
		n  int
	}
	var ups []up
	running := make([]*periodicChild, 3)
	var spares []*periodicChild
	// The clock: from when the three ran and the spares were ready, to
	// when the kills stopped (after which no more spares start).
	var began, stopAt time.Time
	type started struct {
		c    *periodicChild
		took time.Duration // to start, for a spare started once the clock ran
		err  error
	}
	launched := make(chan started, 16)
	launching := 0
	launch := func() {
		launching++
		timed := !began.IsZero() // the first ones start all at once: their time says less
		go func() {
			at := time.Now()
			c, err := startPeriodicChild(key, q)
			s := started{c: c, err: err}
			if timed {
				s.took = time.Since(at)
			}
			launched <- s
		}()
	}
	note := func() {
		n := 0
		for _, c := range running {
			if c != nil {
				n++
			}
		}
		ups = append(ups, up{time.Now(), n})
	}
	// fill gives the spares ready the places of children killed.
	fill := func() {
		for j := range running {
			if running[j] == nil && len(spares) > 0 {
				c := spares[0]
				spares = spares[1:]
				running[j] = c
				io.WriteString(c.stdin, "run\n")
				c.read = make(chan struct{})
				go func() {
					defer close(c.read)
					answer(c)
				}()
				note()
			}
		}
	}
	// retire kills c, unless another kill took it out already.
	retire := func(c *periodicChild) {
		for j := range running {
			if running[j] == c {
				running[j] = nil
				c.kill()
				note()
				if stopAt.IsZero() {
					launch()
				}
				fill()
			}
		}
	}
	arrived := func(s started) {
		launching--
		if s.err != nil {
			t.Fatal(s.err)
		}
		r.slowest = max(r.slowest, s.took)
		spares = append(spares, s.c)
		fill()
	}
	defer func() {
		for _, c := range slices.Concat(running, spares) {
			if c != nil {
				c.kill()
			}
		}
	}()
	for range len(running) + 6 {
		launch()
	}
	for launching > 0 { // the clock starts with every spare ready
		arrived(<-launched)
	}
	began = time.Now()

	// Beside the gate's deaths, one child is killed every 700 ms, at
	// whatever it was doing.
	until := time.After(5 * time.Second)
	every := time.NewTicker(700 * time.Millisecond)
	defer every.Stop()
	for i, run := 0, true; run; {
		select {
		case c := <-gone:
			retire(c)
		case s := <-launched:
			arrived(s)
		case <-every.C:
			if c := running[i%3]; c != nil {
				retire(c)
			}
			i++
		case <-until:
			run = false
		}
	}
	// Every tick due from the start until a period before the kills
	// stopped must run, or be skipped by a dispatcher that claimed it once
	// the next was due (RunLatest). The dispatchers, unhindered now, go on
	// until every such tick has run or been skipped (10 s at most); then
	// they stop.
	gmu.Lock()
	stopping = true
	gmu.Unlock()
	stopAt = time.Now()
	ticks := func(period time.Duration) (due []time.Time) {
		p := period.Milliseconds()
		for ms := (began.UnixMilli() + p - 1) / p * p; ms+p <= stopAt.UnixMilli(); ms += p {
			due = append(due, time.UnixMilli(ms))
		}
		return due
	}
	ranTick := func(name string, tick time.Time) bool { // under mu
		return slices.ContainsFunc(runs[PeriodicPrefix+name], func(x run) bool { return x.due.Equal(tick) })
	}
	skipped := func(name string, tick time.Time) bool { // under gmu
		return slices.ContainsFunc(skips, func(s periodicSkip) bool {
			return s.Name == name && !s.From.After(tick) && !s.Now.Before(tick.Add(periodicPeriods[name]))
		})
	}
	settled := func() bool {
		mu.Lock()
		defer mu.Unlock()
		gmu.Lock()
		defer gmu.Unlock()
		for name, period := range periodicPeriods {
			for _, tick := range ticks(period) {
				if !ranTick(name, tick) && !skipped(name, tick) {
					return false
				}
			}
		}
		return true
	}
	poll := time.NewTicker(50 * time.Millisecond)
	defer poll.Stop()
	for end, run := time.After(10*time.Second), true; run; {
		select {
		case c := <-gone:
			retire(c)
		case s := <-launched:
			arrived(s)
		case <-poll.C:
			run = !settled()
		case <-end:
			run = false
		}
	}
	for j, c := range running {
		if c != nil {
			running[j] = nil
			c.kill()
		}
	}
	note()
	for ; launching > 0; launching-- {
		if s := <-launched; s.err == nil {
			s.c.kill()
		}
	}
	// Every tick enqueued runs before the ticks are counted.
	in := newInspector(t)
	waitFor(t, 30*time.Second, "asynq to run the ticks enqueued", func() bool {
		qi, err := in.GetQueueInfo(q)
		return err == nil && qi.Pending+qi.Active+qi.Scheduled+qi.Retry == 0
	})

	// idleIn tells whether no dispatcher ran for a moment of [from, to):
	// ups[k].n ran from ups[k].at to the next change.
	idleIn := func(from, to time.Time) bool {
		for k, u := range ups {
			if u.n == 0 && u.at.Before(to) && (k+1 == len(ups) || ups[k+1].at.After(from)) {
				return true
			}
		}
		return from.Before(ups[0].at)
	}
	for k, u := range ups[:len(ups)-1] {
		if u.n == 0 {
			r.idle += ups[k+1].at.Sub(u.at)
		}
	}

	gmu.Lock()
	before, after := died["enqueue"], died["enqueued"]
	gmu.Unlock()
	// A gate that never stops an enqueue (asynq's script named its key
	// otherwise) would leave the recovery of claimed ticks untested; a
	// machine that stalled for seconds can leave too few ticks to kill at.
	if before < 2 || after < 2 {
		r.missing = append(r.missing, fmt.Sprintf("the gate killed %d children before an enqueue and %d after one, want 2 each", before, after))
	}
	t.Logf("the gate killed %d children before an enqueue and %d after one", before, after)

	// Each tick ran once, none early; or it was skipped (RunLatest): one a
	// definition may be, more where the machine explains why their claims
	// came late.
	mu.Lock()
	defer mu.Unlock()
	gmu.Lock()
	defer gmu.Unlock()
	for _, def := range periodicDefs(q) {
		name, period := PeriodicPrefix+def.Name, periodicPeriods[def.Name]
		rs := runs[name]
		sort.Slice(rs, func(i, j int) bool { return rs[i].due.Before(rs[j].due) })
		var lags []time.Duration
		for i, run := range rs {
			switch {
			case run.start.Before(run.due):
				r.errs = append(r.errs, fmt.Sprintf("%s: tick %v started early, at %v", name, run.due, run.start))
			case i > 0 && run.due.Equal(rs[i-1].due):
				r.errs = append(r.errs, fmt.Sprintf("%s: tick %v ran twice", name, run.due))
			case run.due.UnixMilli()%period.Milliseconds() != 0:
				r.errs = append(r.errs, fmt.Sprintf("%s: tick %v is not on a %v boundary", name, run.due, period))
			}
			lags = append(lags, run.start.Sub(run.due))
		}
		median := time.Duration(0)
		if len(lags) > 0 {
			median = slices.Sorted(slices.Values(lags))[len(lags)/2]
		}
		// late tells whether the tick that ran before tick, or the one
		// after it, started a period or more late: the machine was as far
		// behind as a claim of tick that came once the next was due.
		late := func(tick time.Time) bool {
			after := sort.Search(len(rs), func(i int) bool { return rs[i].due.After(tick) })
			return after > 0 && lags[after-1] >= period || after < len(rs) && lags[after] >= period
		}
		gaveWay, lost := false, false
		for _, tick := range ticks(period) {
			if ranTick(def.Name, tick) {
				continue
			}
			what := fmt.Sprintf("%s: the tick of %v did not run", name, tick)
			switch {
			case !skipped(def.Name, tick):
				r.errs = append(r.errs, what+", and no dispatcher skipped it: it was lost")
				lost = true
			case !gaveWay:
				gaveWay = true
				t.Logf("%s: the tick of %v gave way to the next (RunLatest)", name, tick)
			case idleIn(tick, tick.Add(period)):
				r.explained = append(r.explained, what+" (skipped); no dispatcher ran for a moment of its period")
			case late(tick):
				r.explained = append(r.explained, what+fmt.Sprintf(" (skipped); a tick beside it ran %v or more late", period))
			default:
				r.missing = append(r.missing, what+" (skipped: claimed once the next was due)")
			}
		}
		if len(lags) > 0 {
			t.Logf("%s: %d ticks; tick -> handler start p50 %v, max %v", name, len(rs), median, slices.Max(lags))
		}
		if lost {
			var dues []time.Time
			for _, run := range rs {
				dues = append(dues, run.due)
			}
			r.errs = append(r.errs, periodicState(t, key, q, name, dues, skips))
		}
	}
	return r
}

// periodicState tells, for a test that lost ticks of definition name,
// the ticks that ran, the skips logged, the definition's job on the
// schedule, its next tick and asynq's tasks of the queue.
func periodicState(t *testing.T, key, q, name string, ran []time.Time, skips []periodicSkip) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: ran", name)
	for _, due := range ran {
		fmt.Fprintf(&b, " %s", due.Format("15:04:05.000"))
	}
	for _, s := range skips {
		fmt.Fprintf(&b, "\n  skip logged: %s from %s at %s", s.Name, s.From.Format("15:04:05.000"), s.Now.Format("15:04:05.000"))
	}
	br, err := NewBroker(newClient(t), BrokerOptions{Key: key})
	if err != nil {
		return b.String() + "\n  broker: " + err.Error()
	}
	jobs, err := br.Jobs(ctx, name)
	fmt.Fprintf(&b, "\n  job %s: %+v %v", name, jobs, err)
	defs, err := br.ListPeriodic(ctx)
	for _, d := range defs {
		fmt.Fprintf(&b, "\n  definition %s: next %v", d.Name, d.Next)
	}
	if err != nil {
		fmt.Fprintf(&b, "\n  definitions: %v", err)
	}
	in := newInspector(t)
	for _, list := range []func(string, ...asynq.ListOption) ([]*asynq.TaskInfo, error){
		in.ListPendingTasks, in.ListActiveTasks, in.ListScheduledTasks, in.ListRetryTasks, in.ListArchivedTasks, in.ListCompletedTasks} {
		tasks, _ := list(q, asynq.PageSize(200))
		for _, ti := range tasks {
			fmt.Fprintf(&b, "\n  asynq %s %s (retried %d, %s)", ti.State, ti.ID, ti.Retried, ti.LastErr)
		}
	}
	return b.String()
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

// A tick whose definition the dispatcher cannot read (here, a time zone
// that does not load) goes back with its backoff instead of running with
// no next tick written, which would end the definition's ticks; once the
// definition reads again, the tick runs (or the latest one due by then:
// missed ticks run once) and the next one is written. Run logs such a
// definition at its start.
func TestPeriodicUnreadableDefinition(t *testing.T) {
	t.Parallel()
	rdb := newClient(t)
	// A lease of seconds: under load a claim of 50 ms may run out before
	// its enqueue, another reason to give the tick back. Attempts enough
	// that 20 ms backoffs cannot use them up (and send the tick to the dead
	// set) while a loaded test waits to restore the definition.
	b := newBroker(t, BrokerOptions{Key: testKey(t), Lease: 2 * time.Second, MaxAttempts: 1000,
		Backoff: func(int) time.Duration { return 20 * time.Millisecond }})
	q := testQueue(t)
	must(t, b.SetPeriodic(ctx, Periodic{Name: "tz", Spec: "@every 1s", Type: "tz", Queue: q}))
	defs := b.shards[0].periodic
	good, err := rdb.HGet(ctx, defs, "tz").Result()
	must(t, err)
	bad := strings.Replace(good, `"tz":"UTC"`, `"tz":"Nowhere/Atlantis"`, 1)
	if bad == good {
		t.Fatalf("no time zone in the stored definition %s", good)
	}
	must(t, rdb.HSet(ctx, defs, "tz", bad).Err())
	var mu sync.Mutex
	var reported []error
	var logs logbuf.Buffer
	d, err := NewDispatcher(b, newAsynqClient(t, testAddr), DispatcherOptions{OnDispatch: func(_ JobInfo, _ time.Duration, err error) {
		mu.Lock()
		reported = append(reported, err)
		mu.Unlock()
	}, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	must(t, err)
	runDispatcher(t, d)
	// Run says so at its start, before the tick is due.
	waitFor(t, 10*time.Second, "the definition that cannot be read logged", func() bool {
		return strings.Contains(logs.String(), `level=ERROR msg="zclaim: this dispatcher cannot read a periodic definition`)
	})
	zone := func(err error) bool {
		return errors.Is(err, ErrCorrupt) && strings.Contains(err.Error(), "Nowhere/Atlantis")
	}
	waitFor(t, 10*time.Second, "the tick given back twice for its zone", func() bool {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for _, err := range reported {
			if err == nil {
				t.Fatal("the tick was dispatched while its definition could not be read")
			}
			if zone(err) {
				n++
			}
		}
		return n >= 2
	})
	in := newInspector(t)
	if tasks, _ := in.ListPendingTasks(q); len(tasks) != 0 {
		t.Fatalf("%d tasks enqueued for a tick whose definition cannot be read", len(tasks))
	}
	j, err := b.Job(ctx, "periodic:tz")
	must(t, err)
	if j.Attempt < 2 {
		t.Fatalf("the tick: %+v, want it back on the schedule after its failed attempts", j)
	}
	must(t, rdb.HSet(ctx, defs, "tz", good).Err())
	waitFor(t, 10*time.Second, "a tick enqueued, and the next one written", func() bool {
		tasks, _ := in.ListPendingTasks(q)
		next, err := b.Job(ctx, "periodic:tz")
		if len(tasks) == 0 || err != nil || next.Attempt != 1 {
			return false
		}
		// The tick given back, or the latest tick due by the time the
		// definition read again, where that came more than a period later
		// (missed ticks run once).
		var first time.Time
		for _, task := range tasks {
			_, due, ok := ParseOccurrence(task.ID)
			if !ok || due.Before(j.Due) {
				t.Fatalf("task %s enqueued, want the tick of %s or a later one", task.ID, j.Occurrence())
			}
			if first.IsZero() || due.Before(first) {
				first = due
			}
		}
		return next.Due.After(first)
	})
}

// latestTick finds the last tick at or before now, however many were
// missed: checked against a walk tick by tick where that is short, and by
// its defining property (at or before now, the next one after it, no
// earlier than the tick it started from) where ticks were missed for
// years, on schedules with gaps (a window of minutes a day, weekdays).
func TestLatestTick(t *testing.T) {
	t.Parallel()
	specs := []string{"@every 1s", "@every 7s", "* * * * * *", "*/5 * * * *", "* 9 * * *", "*/10 * 9-10 * * MON-FRI",
		"0 0 1 1 *", "30 2 29 2 *"}
	start := time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC)
	rapid.Check(t, func(rt *rapid.T) {
		spec := rapid.SampledFrom(specs).Draw(rt, "spec")
		s, err := cronParser.Parse(spec)
		if err != nil {
			rt.Fatal(err)
		}
		from := s.Next(start.Add(time.Duration(rapid.Int64Range(0, int64(400*24*time.Hour)).Draw(rt, "from"))))
		// Missed for up to six years, to any second of a day.
		missed := rapid.SampledFrom([]time.Duration{0, time.Hour, 48 * time.Hour, 400 * 24 * time.Hour,
			5 * 365 * 24 * time.Hour, 6 * 365 * 24 * time.Hour}).Draw(rt, "missed")
		now := from.Add(missed + time.Duration(rapid.IntRange(0, 86399).Draw(rt, "second of a day"))*time.Second)
		got := latestTick(s, from, now)
		if got.After(now) || !s.Next(got).After(now) || got.Before(from) {
			rt.Fatalf("%s from %v, now %v: latest tick %v (next %v)", spec, from, now, got, s.Next(got))
		}
		// A walk tick by tick, where it is short: the same tick, for an
		// @every schedule where latestTick walks too.
		want, steps := from, 0
		for n := s.Next(want); !n.After(now) && steps <= 20*latestWalk; n = s.Next(want) {
			want, steps = n, steps+1
		}
		_, every := s.(cron.ConstantDelaySchedule)
		if steps <= 20*latestWalk && (!every || steps <= latestWalk) && !got.Equal(want) {
			rt.Fatalf("%s from %v, now %v: latest tick %v, want %v", spec, from, now, got, want)
		}
	})
}
