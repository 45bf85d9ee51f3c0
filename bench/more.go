package main

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/zclaim/zclaim"
)

// commandCalls sums the calls in INFO commandstats.
func commandCalls(rdb *redis.Client) int64 { return callsOf(rdb, "cmdstat_") }

// callsOf sums the calls of the commands whose INFO commandstats name
// begins with prefix.
func callsOf(rdb *redis.Client, prefix string) int64 {
	s, _ := rdb.Info(context.Background(), "commandstats").Result()
	var n int64
	for _, line := range strings.Split(s, "\n") {
		name, rest, ok := strings.Cut(line, ":calls=")
		if !ok || !strings.HasPrefix(name, prefix) {
			continue
		}
		v, _ := strconv.ParseInt(rest[:strings.IndexByte(rest, ',')], 10, 64)
		n += v
	}
	return n
}

// scriptCounter counts a middleware's round trips of a task: each script
// or SET on a key of its run records (prefix + the task's key) sent alone,
// and each pipeline that holds one as one. Connection set-up, such as
// HELLO, is not counted, nor the takeover loop's passes (asynq's inspector
// and a pipeline of reads), nor the store's own keys, which come at its
// start and once a second whatever the tasks: its state marker (the bare
// prefix, checked by a script) and its number of buckets (the prefix and
// a NUL byte, "\x00done", written by a SET).
type scriptCounter struct {
	n      *atomic.Int64
	prefix string
}

// ofTask reports whether cmd is a script or SET on a run record's key,
// and not one of asynq's (the store's AsynqClient begins a run in asynq's
// dequeue and sends its Complete in asynq's done: asynq's round trips).
func (h scriptCounter) ofTask(cmd redis.Cmder) bool {
	args, key := cmd.Args(), 1
	switch cmd.Name() {
	case "evalsha", "eval":
		key = 3
		if ofAsynq(cmd) {
			return false
		}
	case "set":
	default:
		return false
	}
	k, _ := args[min(key, len(args)-1)].(string)
	return strings.HasPrefix(k, h.prefix) && len(k) > len(h.prefix) && k[len(h.prefix)] != 0
}

func (h scriptCounter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h scriptCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if h.ofTask(cmd) {
			h.n.Add(1)
		}
		return next(ctx, cmd)
	}
}
func (h scriptCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if slices.ContainsFunc(cmds, h.ofTask) && !slices.ContainsFunc(cmds, ofAsynq) {
			h.n.Add(1) // one round trip of the records' own
		}
		return next(ctx, cmds)
	}
}

// ofAsynq reports whether cmd is a script on one of asynq's keys (asynq's
// own, or done.lua carrying a Complete in asynq's done): it, and a
// pipeline that carries it, are asynq's round trip.
func ofAsynq(cmd redis.Cmder) bool {
	a := cmd.Args()
	if cmd.Name() != "evalsha" && cmd.Name() != "eval" || len(a) < 3 {
		return false
	}
	n, _ := a[2].(int)
	return slices.ContainsFunc(a[3:min(3+n, len(a))], func(k any) bool {
		s, _ := k.(string)
		return strings.HasPrefix(s, "asynq:{")
	})
}

// noopHandler returns a handler that does nothing, and a channel closed
// once it has run n times.
func noopHandler(n int) (asynq.Handler, <-chan struct{}) {
	var handled atomic.Int64
	done := make(chan struct{})
	return asynq.HandlerFunc(func(context.Context, *asynq.Task) error {
		if handled.Add(1) == int64(n) {
			close(done)
		}
		return nil
	}), done
}

// noopBacklog enqueues n no-op tasks (ids t0, t1, ...) into a queue of
// their own, named by a fresh key of name (ns), which it returns.
func noopBacklog(n int, name string) string {
	queue := ns(name)
	ac := asynq.NewClient(asynq.RedisClientOpt{Addr: redisAddr, PoolSize: 20})
	parallel(n, 16, func(i int) {
		ac.Enqueue(asynq.NewTask("noop", nil), asynq.Queue(queue), asynq.TaskID("t"+strconv.Itoa(i)))
	})
	ac.Close()
	return queue
}

// noopServerConfig is the asynq server of tables 3 and 3b: queue alone,
// 16 workers, a dequeue every 10 ms when it is empty.
func noopServerConfig(queue string) asynq.Config {
	return asynq.Config{Queues: map[string]int{queue: 1}, Concurrency: 16, TaskCheckInterval: 10 * time.Millisecond,
		IsFailure: zclaim.IsFailure, RetryDelayFunc: zclaim.RetryDelay, Logger: quietLog{}, LogLevel: asynq.FatalLevel}
}

// serveBacklog starts srv with h, waits for done (n tasks handled), shuts
// srv down and returns its rate, the CPU a task meanwhile (Redis', this
// process') and the commands a task Redis ran.
func serveBacklog(admin *redis.Client, srv *asynq.Server, h asynq.Handler, done <-chan struct{}, n int) (rate float64, perTask [2]time.Duration, cmds float64) {
	calls0 := commandCalls(admin)
	r0, s0 := cpuMeter(admin)
	start := time.Now()
	if err := srv.Start(h); err != nil {
		panic(err)
	}
	<-done
	el := time.Since(start)
	r1, s1 := cpuMeter(admin)
	calls := commandCalls(admin) - calls0
	srv.Shutdown()
	return float64(n) / el.Seconds(), [2]time.Duration{(r1 - r0) / time.Duration(n), (s1 - s0) / time.Duration(n)}, float64(calls) / float64(n)
}

// aroundTask wraps next in calls made before and after the handler, each
// given the task's key under prefix; after may be nil.
func aroundTask(prefix string, before, after func(ctx context.Context, key string) error) asynq.MiddlewareFunc {
	return func(next asynq.Handler) asynq.Handler {
		return asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
			id, _ := asynq.GetTaskID(ctx)
			key := prefix + id
			if err := before(ctx, key); err != nil {
				return err
			}
			if err := next.ProcessTask(ctx, t); err != nil || after == nil {
				return err
			}
			return after(ctx, key)
		})
	}
}

// plainStartFinish is the least a middleware that records each run's
// start and finish asks of Redis: a plain SET NX GET before the handler and
// a plain SET after, one round trip each, with no script, token or fence.
func plainStartFinish(rdb *redis.Client, prefix string) asynq.MiddlewareFunc {
	return aroundTask(prefix, func(ctx context.Context, key string) error {
		if err := rdb.SetArgs(ctx, key, "run", redis.SetArgs{Mode: "NX", Get: true, TTL: time.Minute}).Err(); err != redis.Nil {
			return err
		}
		return nil
	}, func(ctx context.Context, key string) error {
		return rdb.Set(ctx, key, "done", 24*time.Hour).Err()
	})
}

// oneSet is a script that makes a single SET: what running a script costs
// Redis beyond the command it makes.
var oneSet = redis.NewScript(`return redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])`)

// scriptStartFinish is the least a middleware that fences its records asks
// of Redis 7, where a check and a write in one step take a script: a script
// before the handler and one after, one round trip each, each making a
// single SET, with as many keys and arguments as the middleware's Begin and
// Complete pass.
func scriptStartFinish(rdb *redis.Client, prefix string) asynq.MiddlewareFunc {
	return aroundTask(prefix, func(ctx context.Context, key string) error {
		return oneSet.Run(ctx, rdb, []string{key, prefix + "done"}, "run", 60000, "field", 86400000).Err()
	}, func(ctx context.Context, key string) error {
		return oneSet.Run(ctx, rdb, []string{key, prefix + "done"}, "done", 86405000, 5000, 86405000, "field", 100).Err()
	})
}

// handOffs wraps next in the least a middleware that waits for something
// before and after each task does: the handler's goroutine hands a request
// to another goroutine and waits for its answer, twice, with no Redis.
// stop ends that goroutine.
func handOffs(next asynq.Handler) (asynq.Handler, func()) {
	reqs := make(chan chan struct{})
	go func() {
		for r := range reqs {
			r <- struct{}{}
		}
	}()
	return asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
		r := make(chan struct{})
		reqs <- r
		<-r
		err := next.ProcessTask(ctx, t)
		reqs <- r
		<-r
		return err
	}), func() { close(reqs) }
}

// Scenario 3: an asynq server with a no-op handler over N pending tasks,
// with and without the idempotency middleware, and with the least any
// middleware that asks Redis about each task must do (the floor).
func middlewareScenario() {
	n := 20000
	if *quick {
		n = 1000
	}
	type run struct {
		rate         float64
		cmdsPerTask  float64
		tripsPerTask float64
	}
	// What runs around the handler; the ratios compare each with the first.
	type contender struct {
		name         string
		wrap         string // "": nothing; "idem": the middleware; "client": a store, no middleware; "setnx", "startFinish", "scripts", "handoff": the floors
		noTakeover   bool   // the middleware's DisableTakeover
		autopipeline bool   // the middleware's client is (*redis.Client).AutoPipeline
		asynqClient  bool   // the asynq server runs on the store's AsynqClient
		userKey      bool   // the middleware's Key is a function of the user's (the task id, as a function the store cannot see into)
	}
	contenders := []contender{
		{name: "asynq, no middleware"},
		{name: "asynq + idempotency middleware", wrap: "idem"},
		{name: "asynq + idempotency middleware, `DisableTakeover` (no takeover loop)", wrap: "idem", noTakeover: true},
		{name: "asynq + idempotency middleware, the server on the store's `AsynqClient` (its dequeues take up to 8 tasks at a time, each marked as held; each Begin a call of the middleware's own, grouped with those of the same moment; completed in one script with asynq's done)", wrap: "idem", asynqClient: true},
		{name: "asynq + idempotency middleware with a `Key` function of the user's, the server on the store's `AsynqClient` (the same)", wrap: "idem", asynqClient: true, userKey: true},
		{name: "asynq, no middleware, the server on a store's `AsynqClient` (its dequeues take up to 8 tasks at a time)", wrap: "client", asynqClient: true},
		{name: "floor: asynq + one plain SET NX per task (no script, no fencing, never completed)", wrap: "setnx"},
		{name: "floor of start + finish: plain SET NX GET before the handler, plain SET after (no script, no token, no fence)", wrap: "startFinish"},
		{name: "floor of a fenced start + finish: a script before the handler and one after, each a single SET (on Redis 7 a check and a write in one step take a script)", wrap: "scripts"},
		{name: "floor of waiting, no Redis: two hand-offs a task to a goroutine and back, one before the handler and one after", wrap: "handoff"},
		{name: "asynq + idempotency middleware on an autopipelined go-redis client (what NewIdempotency's doc advises against)",
			wrap: "idem", autopipeline: true},
		{name: "asynq, no middleware, again (the first row's twin: its ratio is the noise of a ratio)"},
	}
	last := make([]run, len(contenders))
	rates := make([]samples, len(contenders))
	cpu := make([]cpuRounds, len(contenders))
	nr := shortRounds(len(contenders))
	for round := 1; round <= nr; round++ {
		for _, k := range slots(round, len(contenders)) {
			c := contenders[k]
			admin := newClient(4)
			key := noopBacklog(n, "mw")
			queue := key
			h, done := noopHandler(n)
			var trips atomic.Int64
			idemClient := newClient(32)
			idemClient.AddHook(scriptCounter{n: &trips, prefix: key + ":run:"})
			var idem *zclaim.Idempotency
			stopHandOffs := func() {}
			switch c.wrap {
			case "idem", "client":
				var rdb redis.UniversalClient = idemClient
				if c.autopipeline {
					ap, err := idemClient.AutoPipeline()
					if err != nil {
						panic(err)
					}
					rdb = ap
				}
				var err error
				opts := zclaim.IdempotencyOptions{Prefix: key + ":run:", DisableTakeover: c.noTakeover}
				if c.userKey {
					opts.Key = func(ctx context.Context, _ *asynq.Task) (string, error) {
						id, _ := asynq.GetTaskID(ctx)
						return id, nil
					}
				}
				idem, err = zclaim.NewIdempotency(rdb, opts)
				if err != nil {
					panic(err)
				}
				if c.wrap == "idem" {
					h = idem.Middleware()(h)
				}
			case "setnx":
				h = aroundTask(key+":run:", func(ctx context.Context, k string) error {
					return idemClient.SetNX(ctx, k, "1", time.Minute).Err()
				}, nil)(h)
			case "startFinish":
				h = plainStartFinish(idemClient, key+":run:")(h)
			case "scripts":
				h = scriptStartFinish(idemClient, key+":run:")(h)
			case "handoff":
				h, stopHandOffs = handOffs(h)
			}
			var srv *asynq.Server
			if c.asynqClient {
				srv = asynq.NewServerFromRedisClient(idem.AsynqClient(), noopServerConfig(queue))
			} else {
				srv = asynq.NewServer(asynq.RedisClientOpt{Addr: redisAddr}, noopServerConfig(queue))
			}
			rate, perTask, calls := serveBacklog(admin, srv, h, done, n)
			stopHandOffs()
			if idem != nil {
				idem.Close()
			}
			last[k] = run{rate: rate, cmdsPerTask: calls, tripsPerTask: float64(trips.Load()) / float64(n)}
			rates[k] = append(rates[k], last[k].rate)
			cpu[k] = append(cpu[k], perTask)
			progress("middleware round %d/%d, %s: %s tasks/s", round, nr, c.name, human(last[k].rate))
			idemClient.Close()
			dropKeys(admin, key)
			admin.SRem(context.Background(), "asynq:queues", queue)
			admin.Close()
		}
	}
	var rows [][]string
	for k, c := range contenders {
		trips := "–"
		if c.wrap != "" {
			trips = fmt.Sprintf("%.2f", last[k].tripsPerTask)
		}
		ratio := paired(rates[k], rates[0])
		rows = append(rows, []string{c.name, human(rates[k].median()), rates[k].spread(),
			fmt.Sprintf("%.2f×", ratio.median()), ratio.middleHalf(),
			fmt.Sprintf("%.1f", last[k].cmdsPerTask), trips, cpu[k].cell(), cpu[k].over(cpu[0])})
	}
	table(fmt.Sprintf("3. Middleware overhead: asynq server, no-op handler, %s tasks, Concurrency 16", human(float64(n))),
		[]string{"contender", "tasks/s (median)", "spread", "ratio", "ratio's middle half of rounds", "Redis commands / task (all, incl. asynq's)", "zclaim round trips / task", "CPU / task: Redis + client (the round of median total)", "CPU / task beyond asynq alone's (median)"},
		rows,
		"Targets: ≥ 0.95× asynq's throughput without the middleware, ≤ 2 Redis round trips per task on the success path (Begin, Complete; fewer where calls of the same moment group). "+
			"A ratio is the median over the rounds of the two contenders' rates in one round, whose contenders run one after the other, "+turns(nr, len(contenders))+"; "+
			"the next column gives the middle half of those per-round ratios (first to third quartile): how far one round's ratio strays. "+
			"CPU beyond asynq alone's is likewise the median over the rounds of the difference of the two contenders' CPU a task in one round (Redis' and this process'). "+
			"Commands count every command Redis ran, including those inside scripts. "+
			"On the store's AsynqClient, a dequeue of asynq's takes the tasks its next ones get, up to 8 (doubling from 1 while asynq asks for all it took), and marks each as held by the process: "+
			"asynq's processor dequeues one task a round trip in one goroutine, which bounds asynq alone; the row without the middleware shows what that alone is worth. "+
			"Each handler's Begin is a call of the middleware's own, grouped with those of the same moment, and each Complete rides in asynq's done; with a Key function of the user's the same. "+
			"The first floor does one round trip per task and nothing else: what asking Redis once per task costs on this machine. "+
			"The second does the two plain commands a middleware that records each run's start and finish needs at least, one round trip each, "+
			"without the token, lease and fence that make the middleware's scripts safe. "+
			"The third sends what any middleware that fences its records sends at least on Redis 7, where a check and a write in one step take a script: "+
			"two scripts a task, one round trip each, each making a single SET, with as many keys and arguments as the middleware's Begin and Complete. "+
			"The fourth asks nothing of Redis: before the handler and after it, the handler's goroutine hands a request to another goroutine and waits for its answer, "+
			"which comes at once: what waiting twice a task costs asynq's server, whatever a middleware waits for. "+
			"Round trips count the scripts and SETs on run records the middleware's client sends, alone or in a pipeline, not the takeover loop's passes (once a second, whatever the tasks), nor a script or pipeline that carries asynq's dequeue or done of the task too (asynq's round trips). "+
			"The row of the autopipelined client gives the middleware a client of (*redis.Client).AutoPipeline: its round trips count the pipelines it sends. "+
			"The last row runs the first again in each round: how far its ratio is from 1.00× is how far a ratio moves when nothing changes.")
}

// Scenario 4: Claim latency as the set grows (1% due), and memory per job.
func scaleScenario() {
	sizes := []int{1e3, 1e5, 1e6}
	samplesN := 500
	if *quick {
		sizes, samplesN = []int{1e3, 1e5}, 100
	}
	admin := newClient(8)
	defer admin.Close()
	ctx := context.Background()
	results := map[int][]durs{}
	for round := 1; round <= *rounds; round++ {
		for _, n := range sizes {
			key := ns("scale")
			b, _ := zclaim.NewBroker(admin, zclaim.BrokerOptions{Key: key, Lease: time.Hour})
			now := time.Now()
			due, later := float64(now.Add(-time.Minute).Unix()), float64(now.Add(time.Hour).Unix())
			for i := 0; i < n; i += 10000 {
				zs := make([]redis.Z, 0, 10000)
				for j := i; j < min(i+10000, n); j++ {
					s := later
					if j%100 == 0 {
						s = due
					}
					zs = append(zs, redis.Z{Score: s, Member: "job-" + strconv.Itoa(j)})
				}
				admin.ZAdd(ctx, key, zs...)
			}
			var lat durs
			for range samplesN {
				t0 := time.Now()
				cs, err := b.Claim(ctx, 10)
				lat = append(lat, time.Since(t0))
				if err != nil || len(cs) == 0 {
					panic(fmt.Sprintf("claim: %v, %d", err, len(cs)))
				}
				// Keep the set at n with 1% due: ack and put the ids back, due.
				b.AckMany(ctx, cs...)
				zs := make([]redis.Z, len(cs))
				for i, c := range cs {
					zs[i] = redis.Z{Score: due, Member: c.ID}
				}
				admin.ZAdd(ctx, key, zs...)
			}
			results[n] = append(results[n], lat)
			progress("scale round %d/%d, %s jobs: claim p50 %s p99 %s", round, *rounds, human(float64(n)), ms(lat.pct(0.5)), ms(lat.pct(0.99)))
			dropKeys(admin, key)
		}
	}
	var rows [][]string
	var base time.Duration
	for _, n := range sizes {
		var p50s, p99s samples
		for _, l := range results[n] {
			p50s = append(p50s, float64(l.pct(0.5)))
			p99s = append(p99s, float64(l.pct(0.99)))
		}
		p99 := time.Duration(p99s.median())
		if base == 0 {
			base = p99
		}
		rows = append(rows, []string{human(float64(n)), ms(time.Duration(p50s.median())), ms(p99),
			fmt.Sprintf("%.2f×", float64(p99)/float64(base))})
	}
	table("4a. Claim latency (batch 10) as the schedule grows, 1% due",
		[]string{"jobs in the set", "p50", "p99 (median of rounds)", "p99 vs smallest"}, rows,
		"Target: p99 at 1e6 ≤ 1.3× p99 at 1e3.")

	// Memory per scheduled job.
	memN := 100000
	if *quick {
		memN = 20000
	}
	used := func() int64 {
		admin.Do(ctx, "MEMORY", "PURGE")
		s, _ := admin.Info(ctx, "memory").Result()
		v, _ := strconv.ParseInt(infoField(s, "used_memory"), 10, 64)
		return v
	}
	var mrows [][]string
	for _, payload := range []int{0, 100} {
		key := ns("mem")
		b, _ := zclaim.NewBroker(admin, zclaim.BrokerOptions{Key: key})
		before := used()
		jobs := make([]zclaim.Job, memN)
		p := []byte(strings.Repeat("x", payload))
		for i := range jobs {
			jobs[i] = zclaim.Job{ID: "order-" + strconv.Itoa(1000000+i) + ":reminder", RunAt: time.Now().Add(time.Hour)}
			if payload > 0 {
				jobs[i].Type, jobs[i].Payload = "order:reminder", p
			}
		}
		b.Schedule(ctx, jobs...)
		per := float64(used()-before) / float64(memN)
		what := "id only (24-byte id)"
		if payload > 0 {
			what = "24-byte id, type and a 100-byte payload"
		}
		mrows = append(mrows, []string{what, fmt.Sprintf("%.0f B", per)})
		dropKeys(admin, key)
	}
	table(fmt.Sprintf("4b. Redis memory per scheduled job (INFO used_memory, %s jobs)", human(float64(memN))),
		[]string{"job", "bytes / job"}, mrows)
}

// Scenario 5: from a lease's expiry to the job being dispatched again.
func recoveryScenario() {
	n := 50
	type variant struct {
		name     string
		interval time.Duration
		backoff  func(int) time.Duration
	}
	variants := []variant{
		{"defaults (RecoveryInterval 1 s, DefaultBackoff: 0.5–1 s after attempt 1)", 0, nil},
		{"RecoveryInterval 50 ms, no backoff", 50 * time.Millisecond, func(int) time.Duration { return 0 }},
	}
	var rows [][]string
	for _, v := range variants {
		admin := newClient(8)
		key := ns("recovery")
		queue := key
		b, _ := zclaim.NewBroker(admin, zclaim.BrokerOptions{Key: key, Lease: 300 * time.Millisecond, Backoff: v.backoff})
		ctx, cancel := context.WithCancel(context.Background())
		jobs := make([]zclaim.Job, n)
		for i := range jobs {
			jobs[i] = zclaim.Job{ID: "r" + strconv.Itoa(i), RunAt: time.Now().Add(-time.Second), Type: "t", Queue: queue}
		}
		b.Schedule(ctx, jobs...)
		crashed, _ := b.Claim(ctx, n) // a worker that dies holding them
		leaseEnd := map[string]time.Time{}
		for _, c := range crashed {
			leaseEnd[c.ID] = c.LeaseUntil
		}
		var mu sync.Mutex
		var lat durs
		got := make(chan struct{}, n)
		ac := asynq.NewClient(asynq.RedisClientOpt{Addr: redisAddr})
		d, _ := zclaim.NewDispatcher(b, ac, zclaim.DispatcherOptions{RecoveryInterval: v.interval,
			OnDispatch: func(c zclaim.JobInfo, _ time.Duration, _ error) {
				mu.Lock()
				lat = append(lat, time.Since(leaseEnd[c.ID])) // Redis runs on this machine: one clock
				mu.Unlock()
				got <- struct{}{}
			}})
		go d.Run(ctx)
		for range n {
			<-got
		}
		cancel()
		progress("recovery, %s: p50 %s max %s", v.name, ms(lat.pct(0.5)), ms(lat.pct(1)))
		rows = append(rows, []string{v.name, ms(lat.pct(0.5)), ms(lat.pct(0.99)), ms(lat.pct(1))})
		ac.Close()
		dropKeys(admin, key)
		admin.SRem(context.Background(), "asynq:queues", queue)
		admin.Close()
	}
	table(fmt.Sprintf("5. Recovery: lease expiry → dispatched again (%d claims of a crashed worker)", n),
		[]string{"settings", "p50", "p99", "max"}, rows,
		"The time is the recovery loop's interval (when the next pass sees the expired lease) plus the backoff before the next attempt.")
}
