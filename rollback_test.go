package zclaim

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/zclaim/zclaim/internal/logbuf"
)

// A Redis with RDB snapshots only, SIGKILLed and restarted from its own
// older dump: a broker, a dispatcher and the middleware that ran before it
// working since the snapshot each notice at their next calls that the
// state went back, log it at Error once, and count it as state lost.
func TestRollbackNoticed(t *testing.T) {
	t.Parallel()
	s := ownRedis(t, "--save", "3600 1000000")
	rdb := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: 5, MinRetryBackoff: 5 * time.Millisecond})
	t.Cleanup(func() { rdb.Close() })
	var logs logbuf.Buffer
	log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelError}))
	const every = 10 * time.Millisecond
	key := "zt:{rollback}"
	b, err := NewBroker(rdb, BrokerOptions{Key: key, Lease: time.Second, Logger: log})
	must(t, err)
	db, err := NewBroker(rdb, BrokerOptions{Key: key, Lease: time.Second, Logger: log})
	must(t, err)
	idem, err := NewIdempotency(rdb, IdempotencyOptions{Lease: time.Second, DisableTakeover: true, Logger: log,
		Key: func(_ context.Context, t *asynq.Task) (string, error) { return string(t.Payload()), nil }})
	must(t, err)
	for _, m := range []*stateMarker{b.state, db.state, idem.state} {
		m.every = every
	}
	d, err := NewDispatcher(db, asynq.NewClientFromRedisClient(rdb), DispatcherOptions{DefaultType: "x",
		RecoveryInterval: every, MaxWait: every})
	must(t, err)
	runDispatcher(t, d)
	h := idem.Middleware()(asynq.HandlerFunc(func(context.Context, *asynq.Task) error { return nil }))
	work := func(tag string) {
		for i := range 5 {
			id := tag + string(rune('a'+i))
			must(t, h.ProcessTask(ctx, asynq.NewTask("x", []byte(id))))
			// Jobs for the dispatcher and for the broker's own claims.
			must(t, b.Schedule(ctx, Job{ID: id + "-1", RunAt: time.Now()}, Job{ID: id + "-2", RunAt: time.Now()}))
			time.Sleep(3 * every)
			b.Claim(ctx, 1)
		}
	}
	work("before-")
	must(t, rdb.Save(ctx).Err()) // the snapshot the restart goes back to
	work("after-")               // every process checks (and advances) its marker meanwhile
	s.Kill()
	must(t, s.Restart())
	// Their next calls.
	waitFor(t, 20*time.Second, "all three to notice", func() bool {
		h.ProcessTask(ctx, asynq.NewTask("x", []byte("next")))
		b.Claim(ctx, 1)
		st, _ := b.Stats(ctx)
		dst, _ := d.Broker().Stats(ctx)
		return !st.StateLost.IsZero() && !dst.StateLost.IsZero() && idem.Stats().StateLost > 0
	})
	time.Sleep(10 * every) // more checks: each loss is told once
	if n := strings.Count(logs.String(), "state went back"); n < 1 || strings.Count(logs.String(), "level=ERROR") > 3 {
		t.Fatalf("%d rollback lines, %d error lines; want one of each process:\n%s", n, strings.Count(logs.String(), "level=ERROR"), logs.String())
	}
	if n := idem.Stats().StateLost; n != 1 {
		t.Fatalf("middleware counted %d losses, want 1", n)
	}
	// "after-" runs finished in the lost world: they run again, and a
	// caller of the middleware could not have told without the count.
	if _, err := idem.Begin(ctx, "after-a"); err != nil {
		t.Fatalf("after-a after the rollback: %v (its done record was not in the snapshot)", err)
	}
}
