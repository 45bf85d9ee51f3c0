package main

import (
	"context"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/zclaim/zclaim"
)

// Scenario e2e: a backlog of due jobs worked off end to end, by asynq
// alone (the tasks already pending in its queue) and by zclaim's quick
// start (a Dispatcher feeding an asynq server whose handler runs under the
// idempotency middleware), with each half of zclaim alone beside them.
func e2eScenario() {
	n, conc := 20000, 20
	if *quick {
		n = 3000
	}
	// The ratios compare each contender with the first and the last.
	contenders := []e2eContender{
		{name: "asynq alone: the tasks pending in its queue"},
		{name: "zclaim quick start with the README's Faster settings: Dispatcher through an asynq client on an autopipelined go-redis client + asynq server on the store's AsynqClient + idempotency middleware, jobs due in the schedule",
			dispatcher: true, autopipeline: true, middleware: true, viaDone: true},
		{name: "the same without histories (BrokerOptions.History -1, IdempotencyOptions.NoHistory: no event written on any step)",
			dispatcher: true, autopipeline: true, middleware: true, viaDone: true, noHistory: true},
		{name: "the same with the asynq server on a client of its own (each Begin and Complete a round trip of its own): asynq's public API only",
			dispatcher: true, autopipeline: true, middleware: true},
		{name: "the same on the store's AsynqClient, the Dispatcher through an asynq client on a plain go-redis client (the quick start's clients; TaskRetention -1, as the rows above)",
			dispatcher: true, middleware: true, viaDone: true},
		{name: "the quick start with Faster's settings but the Dispatcher's default TaskRetention (asynq keeps each finished task 66 s)",
			dispatcher: true, autopipeline: true, middleware: true, keepFinished: true, viaDone: true},
		{name: "Dispatcher through an autopipelined asynq client + asynq server, no middleware (its default TaskRetention)",
			dispatcher: true, autopipeline: true, keepFinished: true},
		{name: "asynq server + idempotency middleware, the tasks pending in its queue", middleware: true},
		{name: "floor of a feeder: asynq server, the tasks enqueued within the window by plain Enqueue (16 goroutines, an autopipelined client; no schedule, no claim)",
			enqueueInWindow: true, autopipeline: true},
		{name: "the same floor, and a plain SET NX GET before each handler and a plain SET after (no script, token or fence)",
			enqueueInWindow: true, autopipeline: true, plainMiddleware: true},
		{name: "asynq alone, the tasks pending in its queue, again (the first row's twin: its ratio is the noise of a ratio)"},
		{name: "asynq alone: the tasks due in its scheduled set (ProcessAt a second ago), DelayedTaskCheckInterval 10 ms", processAt: true},
	}
	rates := make([]samples, len(contenders))
	cpu := make([]cpuRounds, len(contenders))
	scripts := make([]samples, len(contenders))
	nr := shortRounds(len(contenders))
	for round := 1; round <= nr; round++ {
		for _, k := range slots(round, len(contenders)) {
			c := contenders[k]
			rate, used, sc := e2eRound(c, n, conc)
			rates[k], cpu[k], scripts[k] = append(rates[k], rate), append(cpu[k], used), append(scripts[k], sc)
			progress("e2e round %d/%d, %s: %s jobs/s", round, nr, c.name, human(rate))
		}
	}
	perJob := historyMemory(n)
	var rows [][]string
	last := len(contenders) - 1
	for k, c := range contenders {
		ratio := paired(rates[k], rates[0])
		rows = append(rows, []string{c.name, human(rates[k].median()), rates[k].spread(),
			fmt.Sprintf("%.2f×", ratio.median()), ratio.middleHalf(),
			fmt.Sprintf("%.2f×", paired(rates[k], rates[last]).median()), fmt.Sprintf("%.2f", scripts[k].median()), cpu[k].cell(), cpu[k].over(cpu[0])})
	}
	table(fmt.Sprintf("1b. End to end: a backlog of %s due jobs, asynq Concurrency %d, TaskCheckInterval 10 ms", human(float64(n)), conc),
		[]string{"contender", "jobs/s (median)", "spread", "ratio", "ratio's middle half of rounds", "ratio to asynq's due tasks", "Redis scripts / job (median)", "CPU / job: Redis + client (the round of median total)", "CPU / job beyond asynq alone's (median)"},
		rows,
		"Targets: the quick start with the README's Faster settings ≥ 1.2× asynq alone; on asynq's public API only ≥ 0.9×. The time runs from the start of the asynq server (and of the dispatcher) "+
			"to the last handler's return; the backlog is written before. "+
			"asynq's pending tasks are the strict comparison (no feeder at all); its due scheduled tasks are the like-for-like one "+
			"(its forwarder moves them to pending as zclaim's dispatcher enqueues its due jobs). "+
			"Both use default options otherwise (the dispatcher's Concurrency 16, the middleware's Lease 5 s and takeover loop). "+
			"The second row is the README's quick start with its Faster settings: the Dispatcher enqueues through an asynq client on (*redis.Client).AutoPipeline, whose concurrent enqueues share round trips, "+
			"and has asynq keep no finished task (TaskRetention -1: the middleware's records skip an occurrence dispatched again), and the asynq server runs on the idempotency store's AsynqClient "+
			"(its dequeues take tasks ahead; each run is completed in one script with asynq's done of its task); "+
			"the next row is the same with the histories off (the events of each job's steps and of its run, for Broker.Jobs; their memory a job is below the table and in the memory table); "+
			"the row after it puts the server on a client of its own, each Begin and Complete a round trip of its own: asynq's public API only; "+
			"the row after that has the quick start's clients, its Dispatcher's asynq client on a plain go-redis client, with Faster's TaskRetention -1. "+
			"The two floor rows have no schedule: 16 goroutines enqueue the tasks (asynq alone's) on such a client once the clock runs, "+
			"which is what feeding asynq inside the window costs whatever the feeder; the second adds the two plain commands a middleware "+
			"that records each run's start and finish sends at least (table 3's second floor). "+
			"A ratio is the median over the rounds of the two contenders' rates in one round, whose contenders run one after the other, "+turns(nr, len(contenders))+", "+
			"and the next column the middle half of those per-round ratios (first to third quartile): how far one round's ratio strays; "+
			"CPU beyond asynq alone's is the median over the rounds of the difference of CPU a job (Redis' and this process') from the first row's in the same round. "+
			"Scripts a job are the EVALSHA and EVAL calls Redis ran within the window (INFO commandstats), whoever sent them: asynq's dequeue and done, its enqueue of a task, the Begin, the dispatcher's claims and settles. "+
			"The row before the last runs the first again in each round: how far its ratio is from 1.00× is how far a ratio moves when nothing changes. "+
			fmt.Sprintf("The schedule's history held %.0f B a job dispatched (MEMORY USAGE of its hashes after Schedule and a Dispatcher's enqueue of %s jobs of 2-to-6-byte ids; "+
				"kept for BrokerOptions.History, a day by default: rate × History × this).", perJob, human(float64(n))))
}

// historyMemory dispatches n due jobs (no server: the tasks stay pending)
// and returns the bytes a job of the schedule's history (the sent
// buckets' hashes) takes.
func historyMemory(n int) float64 {
	ctx := context.Background()
	admin := newClient(4)
	defer admin.Close()
	key := ns("hist")
	defer func() {
		dropKeys(admin, key)
		admin.SRem(ctx, "asynq:queues", key)
	}()
	b, err := zclaim.NewBroker(admin, zclaim.BrokerOptions{Key: key})
	if err != nil {
		panic(err)
	}
	scheduleDue(b, n, key)
	ac, closeAC := autopipelinedAsynq(20)
	defer closeAC()
	d, err := zclaim.NewDispatcher(b, ac, zclaim.DispatcherOptions{TaskRetention: -1})
	if err != nil {
		panic(err)
	}
	dctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); d.Run(dctx) }()
	for {
		st, err := b.Stats(ctx)
		if err == nil && st.Scheduled == 0 && st.Inflight == 0 && d.Stats().Enqueued >= int64(n) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	stop()
	<-done
	tag := key[strings.IndexByte(key, '{'):]
	tag = tag[:strings.IndexByte(tag, '}')+1]
	keys, err := admin.Keys(ctx, "*"+tag+":sent:*").Result()
	if err != nil {
		panic(err)
	}
	var bytes int64
	for _, k := range keys {
		bytes += admin.MemoryUsage(ctx, k, 0).Val()
	}
	return float64(bytes) / float64(n)
}

// e2eContender is one way of working off e2eScenario's backlog.
type e2eContender struct {
	name            string
	dispatcher      bool // the backlog is due jobs in a schedule, which a Dispatcher enqueues; else asynq tasks
	enqueueInWindow bool // the asynq tasks are enqueued once the clock runs (16 goroutines), not before
	autopipeline    bool // the asynq client that enqueues in the window is on (*redis.Client).AutoPipeline
	middleware      bool // the handler runs under the idempotency middleware
	plainMiddleware bool // the handler runs under plainStartFinish
	processAt       bool // asynq's tasks wait in its scheduled set, due a second ago; else pending
	keepFinished    bool // the Dispatcher's default TaskRetention; else -1, as the quick start's
	viaDone         bool // the asynq server runs on the idempotency store's AsynqClient, as the quick start's
	noHistory       bool // no histories (BrokerOptions.History -1, IdempotencyOptions.NoHistory)
}

// e2eRound runs contender c of e2eScenario once: its rate, CPU per job
// and the scripts a job Redis ran meanwhile.
func e2eRound(c e2eContender, n, conc int) (float64, [2]time.Duration, float64) {
	admin := newClient(4)
	defer admin.Close()
	key := ns("e2e")
	queue := key
	defer func() {
		dropKeys(admin, key)
		admin.SRem(context.Background(), "asynq:queues", queue)
	}()
	ac := asynq.NewClient(asynq.RedisClientOpt{Addr: redisAddr, PoolSize: 20})
	defer ac.Close()
	dc := ac // the client that enqueues in the window: the Dispatcher's, or the floor's
	if c.autopipeline {
		var closeDC func()
		dc, closeDC = autopipelinedAsynq(20)
		defer closeDC()
	}
	var dopts zclaim.DispatcherOptions
	if !c.keepFinished {
		dopts.TaskRetention = -1
	}
	var b *zclaim.Broker
	if c.dispatcher {
		var err error
		bo := zclaim.BrokerOptions{Key: key}
		if c.noHistory {
			bo.History = -1
		}
		if b, err = zclaim.NewBroker(admin, bo); err != nil {
			panic(err)
		}
		scheduleDue(b, n, queue)
	}
	var at []asynq.Option
	if c.processAt {
		at = append(at, asynq.ProcessAt(time.Now().Add(-time.Second)))
	}
	enqueueAll := func(ac *asynq.Client) {
		parallel(n, 16, func(i int) {
			opts := append([]asynq.Option{asynq.Queue(queue), asynq.TaskID("t" + strconv.Itoa(i))}, at...)
			if _, err := ac.Enqueue(asynq.NewTask("t", nil), opts...); err != nil {
				panic(err)
			}
		})
	}
	if !c.dispatcher && !c.enqueueInWindow {
		enqueueAll(ac)
	}
	h, done := noopHandler(n)
	idemClient := newClient(32)
	defer idemClient.Close()
	var server redis.UniversalClient // the asynq server's client; nil: one of its own
	if c.middleware {
		idem, err := zclaim.NewIdempotency(idemClient, zclaim.IdempotencyOptions{Prefix: key + ":run:", NoHistory: c.noHistory})
		if err != nil {
			panic(err)
		}
		defer idem.Close()
		h = idem.Middleware()(h)
		if c.viaDone {
			server = idem.AsynqClient()
		}
	}
	if c.plainMiddleware {
		h = plainStartFinish(idemClient, key+":run:")(h)
	}
	cfg := asynq.Config{
		Queues: map[string]int{queue: 1}, Concurrency: conc, TaskCheckInterval: 10 * time.Millisecond, DelayedTaskCheckInterval: 10 * time.Millisecond,
		IsFailure: zclaim.IsFailure, RetryDelayFunc: zclaim.RetryDelay, Logger: quietLog{}, LogLevel: asynq.FatalLevel}
	var srv *asynq.Server
	if server != nil {
		srv = asynq.NewServerFromRedisClient(server, cfg)
	} else {
		srv = asynq.NewServer(asynq.RedisClientOpt{Addr: redisAddr}, cfg)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	runtime.GC()
	scripts0 := callsOf(admin, "cmdstat_eval")
	r0, s0 := cpuMeter(admin)
	start := time.Now()
	if c.dispatcher {
		d, err := zclaim.NewDispatcher(b, dc, dopts)
		if err != nil {
			panic(err)
		}
		go d.Run(ctx)
	}
	if c.enqueueInWindow {
		go enqueueAll(dc)
	}
	if err := srv.Start(h); err != nil {
		panic(err)
	}
	<-done
	el := time.Since(start)
	r1, s1 := cpuMeter(admin)
	scripts := callsOf(admin, "cmdstat_eval") - scripts0
	cancel()
	srv.Shutdown()
	return float64(n) / el.Seconds(), [2]time.Duration{(r1 - r0) / time.Duration(n), (s1 - s0) / time.Duration(n)}, float64(scripts) / float64(n)
}
