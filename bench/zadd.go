package main

import (
	"context"
	"math/rand/v2"
	"runtime"
	"strconv"
	"sync"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/zclaim/zclaim"
)

// Scenario: jobs written by another program with a plain ZADD, which
// cannot announce itself to the dispatcher: due -> enqueue lag with the
// default options, and where the server publishes keyspace events for
// sorted sets.
func zaddScenario() {
	n, over := 1000, 10*time.Second
	if *quick {
		n, over = 100, 2*time.Second
	}
	admin := newClient(4)
	defer admin.Close()
	old, _ := admin.ConfigGet(context.Background(), "notify-keyspace-events").Result()
	defer admin.ConfigSet(context.Background(), "notify-keyspace-events", old["notify-keyspace-events"])

	var rows [][]string
	for _, c := range []struct {
		name   string
		events string
	}{
		{"defaults (MaxWait 50 ms), no keyspace events", ""},
		{"defaults, notify-keyspace-events Kz", "Kz"},
	} {
		if err := admin.ConfigSet(context.Background(), "notify-keyspace-events", c.events).Err(); err != nil {
			rows = append(rows, []string{c.name, "CONFIG SET refused: " + err.Error(), "", "", ""})
			continue
		}
		progress("zadd: %s, %d jobs over %v", c.name, n, over)
		lag, early := runZaddLag(n, over)
		rows = append(rows, []string{c.name, strconv.Itoa(len(lag)), ms(lag.pct(0.5)), ms(lag.pct(0.99)), ms(lag.pct(1)), strconv.Itoa(early)})
	}
	table("Plain-ZADD jobs: due → enqueue lag", []string{"dispatcher", "jobs", "p50", "p99", "max", "early"}, rows,
		"A producer ZADDs each member (score: Unix seconds with ms) 0–200 ms before its due time, "+
			"at random, "+strconv.Itoa(n)+" over "+over.String()+"; one dispatcher with default options. "+
			"Lag is from the due time to the end of the enqueue, by Redis' clock (OnDispatch). "+
			"Target: p99 ≤ 100 ms with defaults; a few ms with keyspace events.")
}

func runZaddLag(n int, over time.Duration) (durs, int) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	rdb := newClient(8)
	defer rdb.Close()
	key := ns("zadd")
	defer dropKeys(rdb, key)
	defer rdb.Del(context.Background(), key)
	queue := key
	defer rdb.SRem(context.Background(), "asynq:queues", queue)
	defer rdb.Del(context.Background(), "asynq:{"+queue+"}:pending", "asynq:{"+queue+"}:completed")

	b, err := zclaim.NewBroker(rdb, zclaim.BrokerOptions{Key: key})
	if err != nil {
		panic(err)
	}
	ac := asynq.NewClientFromRedisClient(rdb)
	var mu sync.Mutex
	var lag durs
	early := 0
	done := make(chan struct{})
	d, err := zclaim.NewDispatcher(b, ac, zclaim.DispatcherOptions{
		DefaultType:   "zadd",
		TaskRetention: -1, // nothing runs the tasks: keep none
		TaskOptions:   func(zclaim.Job) []asynq.Option { return []asynq.Option{asynq.Queue(queue)} },
		OnDispatch: func(_ zclaim.JobInfo, l time.Duration, _ error) {
			mu.Lock()
			defer mu.Unlock()
			lag = append(lag, l)
			if l < 0 {
				early++
			}
			if len(lag) == n {
				close(done)
			}
		},
	})
	if err != nil {
		panic(err)
	}
	go d.Run(ctx)
	time.Sleep(100 * time.Millisecond) // the dispatcher has subscribed

	start := time.Now()
	for i := range n {
		time.Sleep(time.Until(start.Add(time.Duration(i) * over / time.Duration(n))))
		now, err := rdb.Time(ctx).Result()
		if err != nil {
			panic(err)
		}
		due := now.Add(time.Duration(rand.N(200)) * time.Millisecond).Truncate(time.Millisecond)
		score := float64(due.UnixMilli()) / 1000
		if err := rdb.ZAdd(ctx, key, redis.Z{Score: score, Member: "order-" + strconv.Itoa(i)}).Err(); err != nil {
			panic(err)
		}
	}
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		progress("zadd: only %d of %d dispatched", len(lag), n)
	}
	mu.Lock()
	defer mu.Unlock()
	return lag, early
}

// Scenario: Redis memory per finished run record of the middleware, the
// records it keeps for Retention (records kept = rate × Retention).
func memoryScenario() {
	n := 1_000_000
	if *quick {
		n = 20_000
	}
	rdb := newClient(64)
	defer rdb.Close()
	ctx := context.Background()
	used := func() int64 {
		s, _ := rdb.Info(ctx, "memory").Result()
		v, _ := strconv.ParseInt(infoField(s, "used_memory"), 10, 64)
		return v
	}
	var rows [][]string
	for _, row := range []struct {
		buckets   int
		noHistory bool
	}{{0, false}, {n / 100, true}, {n / 100, false}} {
		prefix := ns("mem") + ":run:"
		idem, err := zclaim.NewIdempotency(rdb, zclaim.IdempotencyOptions{Prefix: prefix, DoneBuckets: row.buckets,
			NoHistory: row.noHistory})
		if err != nil {
			panic(err)
		}
		name := strconv.Itoa(zclaim.DefaultDoneBuckets) + " (the default), with the runs' history"
		switch {
		case row.noHistory:
			name = strconv.Itoa(row.buckets) + " (records / 100), NoHistory"
		case row.buckets != 0:
			name = strconv.Itoa(row.buckets) + " (records / 100), with the runs' history"
		}
		progress("memory: %d finished records through Begin + Complete, DoneBuckets %s", n, name)
		due := time.Now().Truncate(time.Millisecond)
		runtime.GC()
		// The keys of the row before were deleted: Redis shrinks its
		// keyspace's hash tables a cron tick or more later, which would
		// come off this row's growth. Wait until used_memory stops falling.
		before := used()
		for range 30 {
			time.Sleep(100 * time.Millisecond)
			now := used()
			if now > before-4096 {
				break
			}
			before = now
		}
		t0 := time.Now()
		parallel(n, 64, func(i int) {
			e, err := idem.Begin(ctx, zclaim.OccurrenceID("order-"+strconv.Itoa(i), due))
			if err == nil {
				err = e.Complete(ctx)
			}
			if err != nil {
				panic(err)
			}
		})
		took := time.Since(t0)
		after := used()
		idem.Close()
		per := float64(after-before) / float64(n)
		rows = append(rows, []string{name, human(float64(n)), human(float64(after-before)) + " B",
			strconv.FormatFloat(per, 'f', 0, 64) + " B", human(float64(n)/took.Seconds()) + "/s"})
		dropKeys(rdb, prefix)
	}
	table("Idempotency: Redis memory per finished record",
		[]string{"DoneBuckets", "records", "used_memory delta", "per record", "Begin + Complete"},
		rows,
		"Keys: `"+zclaim.OccurrenceID("order-731", time.Now().Truncate(time.Millisecond))+"` (an occurrence of a Dispatcher's). "+
			"A finished record is a field of one of DoneBuckets small hashes (a digest of its key, its run's lease deadline when it finished), "+
			"kept as a listpack while a bucket holds at most 128; a lookup is one HGET inside Begin's script. "+
			"Records kept = finish rate × Retention (up to a sweep later): 100 runs/s with the default 24 h keep 8.64M records; "+
			"with DoneBuckets ≥ records / 100 they cost what the second row shows. "+
			"A run's history (its finish, token and process: one field of a hash beside its bucket, kept as long) adds what the third row shows over the second.")
}
