// Command periodic runs periodic jobs from three replicas of a service at
// once: each replica stores the same definitions (Broker.SetPeriodic) and
// runs a dispatcher, and every tick still runs once. It prints each run
// and exits 1 if a tick ran twice, early, or not at all.
//
//	go run ./example/periodic                 # in-process Redis, nothing to set up
//	REDIS_URL=redis://localhost:6379 go run ./example/periodic
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
	"sort"
	"sync"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/zclaim/zclaim"
)

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Getenv("REDIS_URL"))) }

func run(args []string, w io.Writer, redisURL string) int {
	fs := flag.NewFlagSet("periodic", flag.ContinueOnError)
	over := fs.Duration("for", 4*time.Second, "how long the replicas run")
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
	var b [4]byte
	rand.Read(b[:])
	tag := "zclaim-periodic-" + hex.EncodeToString(b[:]) // keys and queue of this run only
	key, queue := "zclaim:{"+tag+"}", tag
	quiet := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	// The definitions every replica sets at start-up.
	defs := []zclaim.Periodic{
		{Name: "heartbeat", Spec: "@every 1s", Type: "heartbeat", Queue: queue},
		{Name: "report", Spec: "*/2 * * * * *", Type: "report", Queue: queue}, // seconds first: every 2 s
	}

	// The worker: asynq's server; the handler reads the tick it runs.
	var mu sync.Mutex
	runs := map[string][]time.Time{}
	early := 0
	mux := asynq.NewServeMux()
	mux.Use(zclaim.WithJob)
	handle := func(ctx context.Context, t *asynq.Task) error {
		j, _ := zclaim.JobFromContext(ctx) // j.Due is the tick's time
		now, err := rdb.Time(ctx).Result()
		if err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		runs[j.ID] = append(runs[j.ID], j.Due)
		if now.Before(j.Due) {
			early++
		}
		fmt.Fprintf(w, "%-20s tick %s  started %5.1f ms after it\n", j.ID, j.Due.UTC().Format("15:04:05.000"), float64(now.Sub(j.Due))/1e6)
		return nil
	}
	mux.HandleFunc("heartbeat", handle)
	mux.HandleFunc("report", handle)
	srv := asynq.NewServerFromRedisClient(rdb, asynq.Config{Queues: map[string]int{queue: 1},
		TaskCheckInterval: 10 * time.Millisecond, LogLevel: asynq.ErrorLevel})
	if err := srv.Start(mux); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer srv.Shutdown()

	// Three replicas, each with the same definitions and a dispatcher.
	var wg sync.WaitGroup
	for range 3 {
		broker, err := zclaim.NewBroker(rdb, zclaim.BrokerOptions{Key: key, Logger: quiet})
		if err == nil {
			err = broker.SetPeriodic(ctx, defs...)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		d, err := zclaim.NewDispatcher(broker, asynq.NewClientFromRedisClient(rdb), zclaim.DispatcherOptions{Logger: quiet})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		wg.Add(1)
		go func() { defer wg.Done(); d.Run(ctx) }()
	}
	time.Sleep(*over)
	cancel()
	wg.Wait()
	time.Sleep(100 * time.Millisecond)

	mu.Lock()
	defer mu.Unlock()
	ok := early == 0
	for _, p := range defs {
		ticks := runs[zclaim.PeriodicPrefix+p.Name]
		sort.Slice(ticks, func(i, j int) bool { return ticks[i].Before(ticks[j]) })
		twice, gaps := 0, 0
		for i := 1; i < len(ticks); i++ {
			switch d := ticks[i].Sub(ticks[i-1]); {
			case d == 0:
				twice++
			case d > time.Second && p.Name == "heartbeat", d > 2*time.Second:
				gaps++
			}
		}
		fmt.Fprintf(w, "%s: %d ticks from 3 replicas, %d ran twice, %d missing\n", p.Name, len(ticks), twice, gaps)
		ok = ok && twice == 0 && gaps == 0 && len(ticks) > 0
	}
	fmt.Fprintf(w, "early starts: %d\n", early)
	if !ok {
		return 1
	}
	return 0
}
