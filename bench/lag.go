package main

import (
	"context"
	"fmt"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/zclaim/zclaim"
	"github.com/zclaim/zclaim/internal/redisproc"
)

// Scenario 2: dispatch lag by Redis TIME, and dispatch throughput.

type quietLog = redisproc.QuietAsynq

type lagResult struct {
	enq     durs // due -> enqueued (zclaim only)
	handle  durs // due -> handler start
	early   int
	missing int
}

// lagRecorder is an asynq handler that records how late (or early) each
// task starts, by Redis TIME, against the due time in its payload (µs).
type lagRecorder struct {
	rdb   *redis.Client
	mu    sync.Mutex
	res   lagResult
	count atomic.Int64
}

func (l *lagRecorder) ProcessTask(ctx context.Context, t *asynq.Task) error {
	now, err := l.rdb.Time(ctx).Result()
	if err != nil {
		return err
	}
	due, _ := strconv.ParseInt(string(t.Payload()), 10, 64)
	lag := now.Sub(time.UnixMicro(due))
	l.mu.Lock()
	l.res.handle = append(l.res.handle, lag)
	if lag < 0 {
		l.res.early++
	}
	l.mu.Unlock()
	l.count.Add(1)
	return nil
}

type lagContender struct {
	name          string
	zclaim        bool
	oracle        bool          // the floor: plain Enqueue of each task at its due time, by 16 goroutines
	checkInterval time.Duration // asynq TaskCheckInterval (and DelayedTaskCheckInterval for ProcessAt); 0 = defaults
	shards        int           // the schedule's BrokerOptions.Shards (zclaim)
	autopipeline  bool          // the dispatcher's asynq client on (*redis.Client).AutoPipeline (zclaim)
}

// dueTimes returns n due times by Redis' clock: all at one instant, or
// spread evenly over d.
func dueTimes(rdb *redis.Client, n int, lead, d time.Duration) []time.Time {
	now, _ := rdb.Time(context.Background()).Result()
	// A due time in the middle of a second shows what whole-second storage does.
	t0 := now.Add(lead).Truncate(time.Second).Add(500 * time.Millisecond)
	out := make([]time.Time, n)
	for i := range out {
		out[i] = t0
		if d > 0 {
			out[i] = t0.Add(time.Duration(i) * d / time.Duration(n)).Truncate(time.Millisecond)
		}
	}
	return out
}

func runLag(c lagContender, due []time.Time) lagResult {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	admin := newClient(8)
	defer admin.Close()
	key := ns("lag")
	defer dropKeys(admin, key)
	queue := key
	defer admin.SRem(context.Background(), "asynq:queues", queue)

	rec := &lagRecorder{rdb: admin}
	cfg := asynq.Config{Queues: map[string]int{queue: 1}, Concurrency: 20, Logger: quietLog{}, LogLevel: asynq.FatalLevel}
	if c.checkInterval > 0 {
		cfg.TaskCheckInterval = c.checkInterval
		if !c.zclaim && !c.oracle {
			cfg.DelayedTaskCheckInterval = c.checkInterval
		}
	}
	srv := asynq.NewServer(asynq.RedisClientOpt{Addr: redisAddr}, cfg)
	if err := srv.Start(rec); err != nil {
		panic(err)
	}
	defer srv.Shutdown()
	ac := asynq.NewClient(asynq.RedisClientOpt{Addr: redisAddr, PoolSize: 32})
	defer ac.Close()

	var enqMu sync.Mutex
	var enq durs
	if c.zclaim {
		b, err := zclaim.NewBroker(admin, zclaim.BrokerOptions{Key: key, Shards: c.shards})
		if err != nil {
			panic(err)
		}
		jobs := make([]zclaim.Job, len(due))
		for i, t := range due {
			jobs[i] = zclaim.Job{ID: "j" + strconv.Itoa(i), RunAt: t, Type: "lag", Queue: queue,
				Payload: []byte(strconv.FormatInt(t.UnixMicro(), 10))}
		}
		if err := b.Schedule(ctx, jobs...); err != nil {
			panic(err)
		}
		dc := ac
		if c.autopipeline {
			var closeDC func()
			dc, closeDC = autopipelinedAsynq(32)
			defer closeDC()
		}
		opts := zclaim.DispatcherOptions{OnDispatch: func(_ zclaim.JobInfo, lag time.Duration, _ error) {
			enqMu.Lock()
			enq = append(enq, lag)
			enqMu.Unlock()
		}}
		d, err := zclaim.NewDispatcher(b, dc, opts)
		if err != nil {
			panic(err)
		}
		go d.Run(ctx)
	} else if c.oracle {
		// A feeder that knows every due time and costs nothing: each task
		// is enqueued the moment it is due (by the local clock, set to
		// Redis TIME, plus 1 ms of margin), as fast as asynq takes them.
		// The clock's offset is read from the quickest of 20 round trips:
		// on a busy machine one reply can take longer than the margin.
		var offset time.Duration
		best := time.Hour
		for range 20 {
			t0 := time.Now()
			rnow, err := admin.Time(ctx).Result()
			if rtt := time.Since(t0); err == nil && rtt < best {
				best, offset = rtt, rnow.Sub(t0)-rtt/2
			}
		}
		parallel(len(due), 16, func(i int) {
			time.Sleep(time.Until(due[i].Add(-offset + time.Millisecond)))
			_, err := ac.Enqueue(asynq.NewTask("lag", []byte(strconv.FormatInt(due[i].UnixMicro(), 10))), asynq.Queue(queue))
			if err != nil {
				panic(err)
			}
			lag := time.Now().Add(offset).Sub(due[i])
			enqMu.Lock()
			enq = append(enq, lag)
			enqMu.Unlock()
		})
	} else {
		parallel(len(due), 16, func(i int) {
			t := due[i]
			_, err := ac.Enqueue(asynq.NewTask("lag", []byte(strconv.FormatInt(t.UnixMicro(), 10))),
				asynq.Queue(queue), asynq.ProcessAt(t))
			if err != nil {
				panic(err)
			}
		})
	}
	end := due[len(due)-1].Add(15 * time.Second)
	for rec.count.Load() < int64(len(due)) && time.Now().Before(end) {
		time.Sleep(20 * time.Millisecond)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	r := rec.res
	r.missing = len(due) - int(rec.count.Load())
	enqMu.Lock()
	r.enq = enq
	enqMu.Unlock()
	return r
}

func lagScenario() {
	burstN, streamRate, streamFor := 2000, 1000, 10*time.Second
	if *quick {
		burstN, streamRate, streamFor = 500, 200, 2*time.Second
	}
	contenders := []lagContender{
		{"zclaim dispatcher, asynq TaskCheckInterval 10 ms", true, false, 10 * time.Millisecond, 0, false},
		{"zclaim dispatcher on an autopipelined asynq client, asynq TaskCheckInterval 10 ms", true, false, 10 * time.Millisecond, 0, true},
		{"zclaim dispatcher, schedule in 16 shards, asynq TaskCheckInterval 10 ms", true, false, 10 * time.Millisecond, 16, false},
		{"zclaim dispatcher, asynq defaults", true, false, 0, 0, false},
		{"asynq ProcessAt, check intervals 10 ms", false, false, 10 * time.Millisecond, 0, false},
		{"asynq ProcessAt, defaults", false, false, 0, 0, false},
		{"floor: plain Enqueue at each due time (no claim at all), asynq TaskCheckInterval 10 ms", false, true, 10 * time.Millisecond, 0, false},
	}
	loads := []struct {
		name string
		due  func(*redis.Client) []time.Time
	}{
		{fmt.Sprintf("%d jobs due at one instant", burstN), func(r *redis.Client) []time.Time { return dueTimes(r, burstN, 3*time.Second, 0) }},
		{fmt.Sprintf("a stream of %d jobs/s for %v", streamRate, streamFor), func(r *redis.Client) []time.Time {
			return dueTimes(r, streamRate*int(streamFor/time.Second), 5*time.Second, streamFor)
		}},
	}
	admin := newClient(2)
	defer admin.Close()
	var rows [][]string
	for _, load := range loads {
		for _, c := range contenders {
			progress("lag: %s, %s", load.name, c.name)
			r := runLag(c, load.due(admin))
			enq := func(p float64) string {
				if !c.zclaim && !c.oracle {
					return "–"
				}
				return ms(r.enq.pct(p))
			}
			miss := ""
			if r.missing > 0 {
				miss = fmt.Sprintf(" (%d not handled)", r.missing)
			}
			rows = append(rows, []string{load.name, c.name, enq(0.5), enq(0.99), enq(1),
				ms(r.handle.pct(0.5)), ms(r.handle.pct(0.99)), ms(r.handle.pct(1)), strconv.Itoa(r.early) + miss})
		}
	}
	table("2. Dispatch lag by Redis TIME",
		[]string{"load", "contender", "→ enqueue p50", "p99", "max", "→ handler start p50", "p99", "max", "early starts"}, rows,
		"Targets: p99 ≤ 10 ms to enqueue and ≤ 25 ms to handler start (asynq TaskCheckInterval 10 ms), zero early starts. "+
			"The floor row enqueues each task through asynq's client the moment it is due, with no claim at all: no feeder that enqueues through asynq's client does better on this machine. "+
			"Lag to handler start is negative for an early start; asynq stores ProcessAt in whole seconds, so a task due at x.5 s can start up to 0.5 s early. "+
			"With its defaults asynq's idle worker loop sleeps up to 1.5 s before looking at a queue, whatever feeds it: set TaskCheckInterval to 10–50 ms.")
}

// dispatchThroughput compares the dispatcher draining N due jobs into asynq
// with plain asynq Enqueue calls at the same concurrency.
func dispatchThroughput() {
	n, conc := 50000, zclaim.DefaultConcurrency
	if *quick {
		n = 3000
	}
	// The contenders, in the table's order; same names the row whose tasks
	// each sends (-1: none), for the table's last ratio.
	type contender struct {
		name string
		same int
	}
	const plainRow, sameRow, sameAPRow = 0, 1, 6
	contenders := []contender{
		{"plain asynq.Client.Enqueue (TaskID), " + strconv.Itoa(conc) + " goroutines", -1},
		{"plain Enqueue of the tasks the dispatcher sends (occurrence TaskID, Retention)", sameRow},
		{fmt.Sprintf("the same tasks, and beside them the dispatcher's two scripts claiming and settling %d jobs every %d enqueues "+
			"(its Redis work without its pipeline)", scriptsBatch, scriptsBatch), sameRow},
		{"zclaim Dispatcher (batch claim + Enqueue + settle), Concurrency " + strconv.Itoa(conc), sameRow},
		{"the same with an OnDispatch hook (claims also read due times)", sameRow},
		{"zclaim Dispatcher on a schedule of 16 shards (one server)", sameRow},
		{"plain Enqueue of the same tasks, on an autopipelined client", sameAPRow},
		{"zclaim Dispatcher on an autopipelined client", sameAPRow},
		{"the same on a schedule of 16 shards", sameAPRow},
		{"plain asynq.Client.Enqueue again (the first row's twin: its ratio is the noise of a ratio)", -1},
	}
	rates := make([]samples, len(contenders))
	cpus := make([][2]time.Duration, len(contenders)) // Redis, this process: per job, last round
	nr := shortRounds(len(contenders))
	for round := 1; round <= nr; round++ {
		admin := newClient(4)
		key := ns("thru")
		queue := key
		ac := asynq.NewClient(asynq.RedisClientOpt{Addr: redisAddr, PoolSize: conc + 4})
		apc, closeAPC := autopipelinedAsynq(conc + 4) // enqueues of one moment share round trips

		// timed runs one contender's n jobs: its rate, and the CPU a job
		// cost Redis and this process.
		timed := func(run func()) (float64, [2]time.Duration) {
			runtime.GC() // each contender starts from a collected heap: the schedule's setup leaves garbage
			r0, s0 := cpuMeter(admin)
			start := time.Now()
			run()
			rate := float64(n) / time.Since(start).Seconds()
			r1, s1 := cpuMeter(admin)
			return rate, [2]time.Duration{(r1 - r0) / time.Duration(n), (s1 - s0) / time.Duration(n)}
		}
		// The first contender, and its twin.
		plainEnqueue := func() (float64, [2]time.Duration) {
			return timed(func() {
				parallel(n, conc, func(i int) {
					if _, err := ac.Enqueue(asynq.NewTask("t", nil), asynq.Queue(queue), asynq.TaskID("p"+strconv.Itoa(i))); err != nil {
						panic(err)
					}
				})
			})
		}

		// The tasks the dispatcher sends, enqueued plainly: its TaskID
		// names the occurrence (a first attempt has no header), and asynq
		// keeps it for TaskRetention once completed; on a plain client and
		// on an autopipelined one.
		// enqueueSame enqueues the i-th of the tasks the dispatcher sends.
		enqueueSame := func(c *asynq.Client, i int, due time.Time) {
			id := "s" + strconv.Itoa(i)
			if _, err := c.Enqueue(asynq.NewTask("t", nil), asynq.TaskID(zclaim.OccurrenceID(id, due)),
				asynq.Retention(91*time.Second), asynq.Queue(queue)); err != nil {
				panic(err)
			}
		}
		plainSame := func(c *asynq.Client) func() (float64, [2]time.Duration) {
			return func() (float64, [2]time.Duration) {
				due := time.Now().Truncate(time.Millisecond)
				return timed(func() {
					parallel(n, conc, func(i int) { enqueueSame(c, i, due) })
				})
			}
		}

		// The same tasks with the dispatcher's Redis work beside them: on
		// a connection of its own, its two scripts claim and settle a
		// batch of jobs every batch of enqueues (the size of the
		// dispatcher's claims here), without its pipeline of goroutines.
		beside := func() (float64, [2]time.Duration) {
			b, _ := zclaim.NewBroker(admin, zclaim.BrokerOptions{Key: key})
			scheduleDue(b, n, queue)
			claimSettle, err := dispatcherScripts(key)
			if err != nil {
				panic(err)
			}
			side := newClient(2)
			defer side.Close()
			due := time.Now().Truncate(time.Millisecond)
			return timed(func() {
				var enqueued atomic.Int64
				batches := make(chan struct{}, n/scriptsBatch+1)
				claimed := make(chan struct{})
				go func() {
					defer close(claimed)
					for range n / scriptsBatch {
						<-batches
						if err := claimSettle(context.Background(), side, scriptsBatch); err != nil {
							panic(err)
						}
					}
				}()
				parallel(n, conc, func(i int) {
					enqueueSame(ac, i, due)
					if enqueued.Add(1)%scriptsBatch == 0 {
						batches <- struct{}{}
					}
				})
				<-claimed
			})
		}

		// The dispatcher: without hooks, with an OnDispatch hook (which
		// makes its claims read the jobs' due times), on a schedule of 16
		// shards, and on the autopipelined client, on one shard and on 16.
		dispatcher := func(hook, shards, ap bool) func() (float64, [2]time.Duration) {
			return func() (float64, [2]time.Duration) {
				b, _ := zclaim.NewBroker(admin, zclaim.BrokerOptions{Key: key, Shards: map[bool]int{true: 16, false: 1}[shards]})
				scheduleDue(b, n, queue)
				opts := zclaim.DispatcherOptions{Concurrency: conc, RecoveryInterval: -1}
				if hook {
					opts.OnDispatch = func(zclaim.JobInfo, time.Duration, error) {}
				}
				c := ac
				if ap {
					c = apc
				}
				d, _ := zclaim.NewDispatcher(b, c, opts)
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				return timed(func() {
					go d.Run(ctx)
					for s := d.Stats(); s.Enqueued+s.Conflicts+s.Dead < int64(n); s = d.Stats() {
						time.Sleep(time.Millisecond)
					}
				})
			}
		}
		runs := []func() (float64, [2]time.Duration){
			plainEnqueue, plainSame(ac), beside,
			dispatcher(false, false, false), dispatcher(true, false, false), dispatcher(false, true, false),
			plainSame(apc), dispatcher(false, false, true), dispatcher(false, true, true),
			plainEnqueue,
		}
		for _, k := range slots(round, len(runs)) {
			rate, cpu := runs[k]()
			rates[k], cpus[k] = append(rates[k], rate), cpu
			dropKeys(admin, key)
		}
		line := make([]string, len(contenders))
		for k, r := range rates {
			line[k] = human(r[len(r)-1])
		}
		progress("dispatch throughput round %d/%d: plain Enqueue %s/s (again %s/s), of the same tasks %s/s (autopipelined %s/s), beside the scripts %s/s, dispatcher %s/s, with OnDispatch %s/s, 16 shards %s/s, autopipelined %s/s (16 shards %s/s)",
			round, nr, line[0], line[9], line[1], line[6], line[2], line[3], line[4], line[5], line[7], line[8])
		admin.SRem(context.Background(), "asynq:queues", queue)
		ac.Close()
		closeAPC()
		admin.Close()
	}
	// Each round runs its contenders back to back: a ratio is the median
	// of the rounds' ratios, so that the machine's drift over the run
	// (other tenants of the VM) cancels out.
	ratio := func(a, b samples) string { return fmt.Sprintf("%.2f×", paired(a, b).median()) }
	var rows [][]string
	for k, c := range contenders {
		toSame := ""
		if c.same >= 0 {
			toSame = ratio(rates[k], rates[c.same])
		}
		rows = append(rows, []string{c.name, human(rates[k].median()), rates[k].spread(), ratio(rates[k], rates[plainRow]), toSame, cpuCell(cpus[k])})
	}
	table(fmt.Sprintf("2b. Dispatch throughput: %s due jobs into asynq, %d at once", human(float64(n)), conc),
		[]string{"contender", "jobs/s (median)", "spread", "ratio", "ratio to the same tasks", "CPU / job: Redis + client (last round)"},
		rows,
		"Targets: the dispatcher ≥ 0.9× plain Enqueue at the same concurrency, ≥ 0.85× on a schedule of 16 shards. "+
			"A ratio is the median over the rounds of the two contenders' rates in one round; "+
			"the contenders of a round run one after the other, "+turns(nr, len(contenders))+". "+
			"The second row enqueues exactly the tasks the dispatcher sends, without a schedule: the last ratio is the dispatcher's own cost. "+
			"The third adds the dispatcher's Redis work (claim.lua and finish.lua, read from the working tree) on a connection of its own, "+
			"a batch of the size the dispatcher's claims have here (min(4×Concurrency, BatchSize)) every as many enqueues: what its scripts cost "+
			"without its goroutines. "+
			"Three rows use an asynq client made from (*redis.Client).AutoPipeline, whose concurrent enqueues share round trips; their last ratio compares the dispatchers with the plain Enqueue on one. "+
			"Redis and the client share the machine's cores, so the ratio follows the CPU each job costs. "+
			"The last row runs the first again in each round: how far its ratio is from 1.00× is how far a ratio moves when nothing changes.")
}

// scriptsBatch is the size of a dispatcher's claims in dispatchThroughput:
// min(4×Concurrency, BatchSize) with the defaults.
const scriptsBatch = 4 * zclaim.DefaultConcurrency

// scheduleDue schedules n jobs of type "t" on queue, due a second ago.
func scheduleDue(b *zclaim.Broker, n int, queue string) {
	jobs := make([]zclaim.Job, n)
	past := time.Now().Add(-time.Second)
	for i := range jobs {
		jobs[i] = zclaim.Job{ID: "d" + strconv.Itoa(i), RunAt: past, Type: "t", Queue: queue}
	}
	if err := b.Schedule(context.Background(), jobs...); err != nil {
		panic(err)
	}
}

func cpuCell(c [2]time.Duration) string {
	us := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
	return fmt.Sprintf("%.1f + %.1f = %.1f µs", us(c[0]), us(c[1]), us(c[0]+c[1]))
}
