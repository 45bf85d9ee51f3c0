package main

import (
	"context"
	"fmt"
	"runtime"
	"strconv"
	"time"

	"github.com/hibiken/asynq"
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
	contenders := []string{
		"asynq alone: the tasks pending in its queue",
		"zclaim quick start: Dispatcher (on an autopipelined client) + asynq server + idempotency middleware, jobs due in the schedule",
		"the same, the Dispatcher's asynq client on a plain go-redis client",
		"Dispatcher (on an autopipelined client) + asynq server, no middleware",
		"asynq server + idempotency middleware, the tasks pending in its queue",
		"asynq alone: the tasks due in its scheduled set (ProcessAt a second ago), DelayedTaskCheckInterval 10 ms",
	}
	rates := make([]samples, len(contenders))
	cpu := make([][2]time.Duration, len(contenders))
	for round := 1; round <= shortRounds(); round++ {
		for k := range contenders {
			rates[k] = append(rates[k], 0)
			rates[k][round-1], cpu[k] = e2eRound(k, n, conc)
			progress("e2e round %d/%d, %s: %s jobs/s", round, shortRounds(), contenders[k], human(rates[k][round-1]))
		}
	}
	var rows [][]string
	for k, name := range contenders {
		rows = append(rows, []string{name, human(rates[k].median()), rates[k].spread(),
			fmt.Sprintf("%.2f×", paired(rates[k], rates[0]).median()),
			fmt.Sprintf("%.2f×", paired(rates[k], rates[5]).median()), cpuCell(cpu[k])})
	}
	table(fmt.Sprintf("1b. End to end: a backlog of %s due jobs, asynq Concurrency %d, TaskCheckInterval 10 ms", human(float64(n)), conc),
		[]string{"contender", "jobs/s (median)", "spread", "ratio", "ratio to asynq's due tasks", "CPU / job: Redis + client (last round)"},
		rows,
		"Target: zclaim's quick start ≥ 0.9× asynq alone. The time runs from the start of the asynq server (and of the dispatcher) "+
			"to the last handler's return; the backlog is written before. "+
			"asynq's pending tasks are the strict comparison (no feeder at all); its due scheduled tasks are the like-for-like one "+
			"(its forwarder moves them to pending as zclaim's dispatcher enqueues its due jobs). "+
			"Both use default options otherwise (the dispatcher's Concurrency 16, the middleware's Lease 5 s and takeover loop). "+
			"The quick start gives the Dispatcher an asynq client on (*redis.Client).AutoPipeline, as the README does: its concurrent enqueues share round trips. "+
			"A ratio is the median over the rounds of the two contenders' rates in one round, which run one after the other.")
}

// e2eRound runs contender k of e2eScenario once: its rate and CPU per job.
func e2eRound(k, n, conc int) (float64, [2]time.Duration) {
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
	dispatched := k >= 1 && k <= 3
	dc := ac // the Dispatcher's
	if k == 1 || k == 3 {
		var closeDC func()
		dc, closeDC = autopipelinedAsynq(20)
		defer closeDC()
	}
	var b *zclaim.Broker
	if dispatched {
		var err error
		if b, err = zclaim.NewBroker(admin, zclaim.BrokerOptions{Key: key}); err != nil {
			panic(err)
		}
		scheduleDue(b, n, queue)
	} else {
		var at []asynq.Option
		if k == 5 {
			at = append(at, asynq.ProcessAt(time.Now().Add(-time.Second)))
		}
		parallel(n, 16, func(i int) {
			opts := append([]asynq.Option{asynq.Queue(queue), asynq.TaskID("t" + strconv.Itoa(i))}, at...)
			if _, err := ac.Enqueue(asynq.NewTask("t", nil), opts...); err != nil {
				panic(err)
			}
		})
	}
	h, done := noopHandler(n)
	idemClient := newClient(32)
	defer idemClient.Close()
	if k == 1 || k == 2 || k == 4 {
		idem, err := zclaim.NewIdempotency(idemClient, zclaim.IdempotencyOptions{Prefix: key + ":run:"})
		if err != nil {
			panic(err)
		}
		defer idem.Close()
		h = idem.Middleware()(h)
	}
	srv := asynq.NewServer(asynq.RedisClientOpt{Addr: redisAddr}, asynq.Config{
		Queues: map[string]int{queue: 1}, Concurrency: conc, TaskCheckInterval: 10 * time.Millisecond, DelayedTaskCheckInterval: 10 * time.Millisecond,
		IsFailure: zclaim.IsFailure, RetryDelayFunc: zclaim.RetryDelay, Logger: quietLog{}, LogLevel: asynq.FatalLevel})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	runtime.GC()
	r0, s0 := cpuMeter(admin)
	start := time.Now()
	if dispatched {
		d, err := zclaim.NewDispatcher(b, dc, zclaim.DispatcherOptions{})
		if err != nil {
			panic(err)
		}
		go d.Run(ctx)
	}
	if err := srv.Start(h); err != nil {
		panic(err)
	}
	<-done
	el := time.Since(start)
	r1, s1 := cpuMeter(admin)
	cancel()
	srv.Shutdown()
	return float64(n) / el.Seconds(), [2]time.Duration{(r1 - r0) / time.Duration(n), (s1 - s0) / time.Duration(n)}
}
