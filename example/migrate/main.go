// Command migrate walks through docs/migrating.md's first case: a
// home-grown poller (ZRANGEBYSCORE, then ZREM) moved to zclaim while
// producers keep writing `ZADD delay:jobs <unix seconds> <id>`, with no gap
// and no double run:
//
//  1. the old pollers, patched first so that a worker runs a job only if
//     its own ZREM removed it (the racy version runs jobs twice even alone);
//  2. asynq workers and a zclaim dispatcher on the same key, beside them;
//  3. the old pollers stopped.
//
// It checks that every job the producer wrote ran once, and says who ran
// it. Exit 1 if a job ran twice or not at all.
//
//	go run ./example/migrate                 # in-process Redis
//	REDIS_URL=redis://localhost:6379 go run ./example/migrate
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/zclaim/zclaim"
)

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Getenv("REDIS_URL"))) }

// ledger is the business side: each job's runs, by who ran it.
type ledger struct {
	mu   sync.Mutex
	runs map[string][]string
}

func (l *ledger) remind(id, by string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.runs[id] = append(l.runs[id], by)
}

func run(args []string, w io.Writer, redisURL string) int {
	fs := flag.NewFlagSet("migrate", flag.ContinueOnError)
	phase := fs.Duration("phase", time.Second, "how long each step runs")
	racy := fs.Bool("racy", false, "skip step 1's fix: the old pollers run what they read (jobs then run twice)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	var rdb *redis.Client
	if redisURL != "" {
		opt, err := redis.ParseURL(redisURL)
		if err != nil {
			fmt.Fprintln(os.Stderr, "REDIS_URL:", err)
			return 2
		}
		rdb = redis.NewClient(opt)
	} else {
		mr, err := miniredis.Run()
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		defer mr.Close()
		rdb = redis.NewClient(&redis.Options{Addr: mr.Addr()})
	}
	defer rdb.Close()
	var rnd [4]byte
	rand.Read(rnd[:])
	key := "delay:jobs:" + hex.EncodeToString(rnd[:]) // the production set (of this run only)
	queue := "migrate-" + hex.EncodeToString(rnd[:])
	defer cleanup(rdb, key, queue)
	l := &ledger{runs: map[string][]string{}}
	ctx := context.Background()

	// The producers, unchanged throughout: plain ZADD, Unix seconds, due
	// within the next 300 ms.
	var produced atomic.Int64
	stopProducer := make(chan struct{})
	producerDone := make(chan struct{})
	go func() {
		defer close(producerDone)
		for i := 0; ; i++ {
			select {
			case <-stopProducer:
				return
			case <-time.After(2 * time.Millisecond):
			}
			due := float64(time.Now().Add(time.Duration(i%300)*time.Millisecond).UnixMilli()) / 1000
			if rdb.ZAdd(ctx, key, redis.Z{Score: due, Member: "order-" + strconv.Itoa(i)}).Err() == nil {
				produced.Add(1)
			}
		}
	}()

	// Step 1: the old pollers, with their ZREM checked.
	pollCtx, stopPollers := context.WithCancel(ctx)
	defer stopPollers()
	var pollers sync.WaitGroup
	for p := range 2 {
		pollers.Add(1)
		go func() { defer pollers.Done(); oldPoller(pollCtx, rdb, key, fmt.Sprint("old poller ", p+1), !*racy, l) }()
	}
	fmt.Fprintf(w, "step 1: producers ZADD into %s; two old pollers (ZREM checked: %v) consume it\n", key, !*racy)
	time.Sleep(*phase)

	// Step 2: asynq workers and a zclaim dispatcher on the same key.
	quiet := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	idem, err := zclaim.NewIdempotency(rdb, zclaim.IdempotencyOptions{Prefix: key + ":run:", Logger: quiet})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	mux := asynq.NewServeMux()
	mux.Use(idem.Middleware())
	mux.HandleFunc("order:reminder", func(ctx context.Context, t *asynq.Task) error {
		j, _ := zclaim.JobFromContext(ctx)
		l.remind(j.ID, "zclaim")
		return nil
	})
	srv := asynq.NewServerFromRedisClient(rdb, asynq.Config{Queues: map[string]int{queue: 1}, Concurrency: 10,
		TaskCheckInterval: 10 * time.Millisecond, IsFailure: zclaim.IsFailure, RetryDelayFunc: zclaim.RetryDelay, LogLevel: asynq.ErrorLevel})
	if err := srv.Start(mux); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer srv.Shutdown()
	broker, err := zclaim.NewBroker(rdb, zclaim.BrokerOptions{Key: key, Logger: quiet}) // adopts the set as it is
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	d, err := zclaim.NewDispatcher(broker, asynq.NewClientFromRedisClient(rdb), zclaim.DispatcherOptions{
		DefaultType: "order:reminder", // plain ZADD members carry no type
		TaskOptions: func(zclaim.Job) []asynq.Option { return []asynq.Option{asynq.Queue(queue)} },
		Logger:      quiet,
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	dctx, stopDispatcher := context.WithCancel(ctx)
	defer stopDispatcher()
	dispatched := make(chan struct{})
	go func() { defer close(dispatched); d.Run(dctx) }()
	fmt.Fprintln(w, "step 2: a zclaim dispatcher and asynq workers on the same key, beside the old pollers")
	time.Sleep(*phase)

	// Step 3: the old pollers stop.
	stopPollers()
	pollers.Wait()
	fmt.Fprintln(w, "step 3: the old pollers stopped; zclaim alone")
	time.Sleep(*phase)

	// The end: the producer stops, everything due is run.
	close(stopProducer)
	<-producerDone
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		st, err := broker.Stats(ctx)
		l.mu.Lock()
		n := len(l.runs)
		l.mu.Unlock()
		if err == nil && st.Scheduled == 0 && st.Inflight == 0 && int64(n) == produced.Load() {
			break
		}
	}
	stopDispatcher()
	<-dispatched
	time.Sleep(100 * time.Millisecond)

	l.mu.Lock()
	defer l.mu.Unlock()
	twice, by := 0, map[string]int{}
	for _, runs := range l.runs {
		if len(runs) > 1 {
			twice++
		}
		by[runs[0]]++
	}
	lost := int(produced.Load()) - len(l.runs)
	fmt.Fprintf(w, "\nproduced %d jobs; ran %d: old poller 1 %d, old poller 2 %d, zclaim %d\n",
		produced.Load(), len(l.runs), by["old poller 1"], by["old poller 2"], by["zclaim"])
	fmt.Fprintf(w, "ran twice: %d (must be 0); not run: %d (must be 0)\n", twice, lost)
	if twice > 0 || lost != 0 || by["zclaim"] == 0 {
		return 1
	}
	return 0
}

// oldPoller is the home-grown consumer, with the one-line fix of step 1:
// a job runs only where ZREM removed it (n == 1). Unchecked (-racy) it is
// the racy poller: two workers run what both read.
func oldPoller(ctx context.Context, rdb *redis.Client, key, name string, checked bool, l *ledger) {
	for ctx.Err() == nil {
		now := strconv.FormatFloat(float64(time.Now().UnixMilli())/1000, 'f', 3, 64)
		ids, err := rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Min: "-inf", Max: now, Count: 10}).Result()
		if err != nil || len(ids) == 0 {
			time.Sleep(10 * time.Millisecond)
			continue
		}
		for _, id := range ids {
			if n, err := rdb.ZRem(ctx, key, id).Result(); err == nil && (n == 1 || !checked) { // the fix: n == 1
				l.remind(id, name)
			}
		}
	}
}

// cleanup deletes this run's keys and forgets its queue.
func cleanup(rdb *redis.Client, key, queue string) {
	ctx := context.Background()
	for _, pattern := range []string{key + "*", "{" + key + "}*", "asynq:{" + queue + "}*"} {
		iter := rdb.Scan(ctx, 0, pattern, 1000).Iterator()
		for iter.Next(ctx) {
			rdb.Del(ctx, iter.Val())
		}
	}
	rdb.SRem(ctx, "asynq:queues", queue)
}
