package zclaim

import (
	"context"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/zclaim/zclaim/internal/logbuf"
	"github.com/zclaim/zclaim/internal/wait"
)

// scripts counts the scripts a server ran, from INFO commandstats.
func scripts(t *testing.T, rdb *redis.Client) int64 {
	t.Helper()
	s, err := rdb.Info(ctx, "commandstats").Result()
	must(t, err)
	var n int64
	for _, line := range strings.Split(s, "\n") {
		name, rest, ok := strings.Cut(line, ":calls=")
		if ok && strings.HasPrefix(name, "cmdstat_eval") {
			v, _ := strconv.ParseInt(rest[:strings.IndexByte(rest, ',')], 10, 64)
			n += v
		}
	}
	return n
}

// An idle dispatcher (default options) on a server that publishes keyspace
// events for sorted sets looks at the schedule about once a second, and
// its recovery loop rests; a plain ZADD still wakes it at once. Without
// the events it looks once per MaxWait.
func TestIdleDispatcherQuiet(t *testing.T) {
	t.Parallel()
	for _, events := range []bool{true, false} {
		t.Run(map[bool]string{true: "keyspace events", false: "no events"}[events], func(t *testing.T) {
			t.Parallel()
			var srv *redisServer
			if events {
				srv = ownRedis(t, "--notify-keyspace-events", "Kz")
			} else {
				srv = ownRedis(t)
			}
			rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
			t.Cleanup(func() { rdb.Close() })
			b, err := NewBroker(rdb, BrokerOptions{Key: "delay:jobs", AllowEviction: true})
			must(t, err)
			got := make(chan string, 1)
			d, err := NewDispatcher(b, asynq.NewClientFromRedisClient(rdb), DispatcherOptions{DefaultType: "t",
				OnDispatch: func(c JobInfo, _ time.Duration, err error) { got <- c.ID }})
			must(t, err)
			runDispatcher(t, d)
			if events {
				// Subscribed, and the server's setting read: the claim stage
				// sleeps a second from its next pass on.
				waitFor(t, 20*time.Second, "the dispatcher to see the keyspace events", d.keyspace.Load)
			}
			time.Sleep(200 * time.Millisecond) // past start-up (and the subscription's wake)
			// Counted in windows of 600 ms: with the events, a loaded
			// machine can put a late start-up look in the first one.
			n := int64(0)
			for try := 1; ; try++ {
				s0 := scripts(t, rdb)
				time.Sleep(600 * time.Millisecond)
				n = scripts(t, rdb) - s0
				if !events || n <= 2 {
					break
				}
				if try == 3 {
					t.Fatalf("idle with keyspace events: %d scripts in 600ms (3 tries), want at most 2", n)
				}
			}
			if !events && n < 3 {
				t.Fatalf("idle without events: %d scripts in 600ms, want one per MaxWait (50ms)", n)
			}
			// The ZADD comes just after an idle look, whose next is a
			// second away with the events: a dispatch within 500 ms is the
			// wake's. A loaded machine can be later; it tries again.
			for try := 1; ; try++ {
				s0 := scripts(t, rdb)
				waitFor(t, 20*time.Second, "an idle look", func() bool { return scripts(t, rdb) > s0 })
				start := time.Now()
				must(t, rdb.ZAdd(ctx, "delay:jobs", redis.Z{Score: float64(time.Now().Unix() - 1), Member: "order-" + strconv.Itoa(try)}).Err())
				wait.Recv(t, got, 20*time.Second, "the dispatch of a plain ZADD")
				took := time.Since(start)
				if !events || took <= 500*time.Millisecond {
					break
				}
				if try == 3 {
					t.Fatalf("the ZADD was dispatched after %v (3 tries)", took)
				}
			}
		})
	}
}

// A claim that keeps failing (the schedule key holds a string) backs off to
// seconds, and its warning is logged once per cause per 10 s, with the
// count of those unlogged.
func TestFailingClaimBacksOff(t *testing.T) {
	t.Parallel()
	srv := ownRedis(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { rdb.Close() })
	var logs logbuf.Buffer
	b, err := NewBroker(rdb, BrokerOptions{Key: "delay:jobs", AllowEviction: true})
	must(t, err)
	must(t, rdb.Set(ctx, b.keys.batches, "not a zset", 0).Err())
	d, err := NewDispatcher(b, asynq.NewClientFromRedisClient(rdb), DispatcherOptions{DefaultType: "t", RecoveryInterval: -1,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	must(t, err)
	cctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	_, err = b.ListPeriodic(ctx) // its script loaded: Run's own read of the definitions is one call
	must(t, err)
	s0 := scripts(t, rdb)
	go func() { defer close(done); d.Run(cctx) }()
	time.Sleep(700 * time.Millisecond)
	cancel()
	wait.Recv(t, done, 10*time.Second, "Run to return once its context was cancelled")
	n := scripts(t, rdb) - s0
	if c := strings.Count(logs.String(), "dispatcher claim failed"); c != 1 {
		t.Fatalf("%d warnings in 0.7s, want 1:\n%s", c, logs.String())
	}
	// 10, 20, 40, ... ms: about 6 tries in 0.7 s; capped at MaxWait
	// (50 ms) it would be about 15. Besides the claims, Run reads the
	// periodic definitions once (checkPeriodic).
	if n-1 > 9 {
		t.Fatalf("%d claims in 0.7s of failures, want a backoff", n-1)
	}
}
