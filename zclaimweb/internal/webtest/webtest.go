// Package webtest is what the console's tests share: a Redis server of
// their own, a schedule per test under keys of its own, and the console
// served on loopback.
package webtest

import (
	"context"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/zclaim/zclaim"
	"github.com/zclaim/zclaim/internal/redisproc"
	"github.com/zclaim/zclaim/zclaimweb"
)

// Redis is the server of a test binary's tests; Start starts it.
var Redis *redisproc.Server

var seq atomic.Int64

// Start starts the tests' Redis server (with AOF, as a healthy server).
func Start() error {
	var err error
	Redis, err = redisproc.Start("--appendonly", "yes")
	if err != nil {
		return fmt.Errorf("the console's tests need redis-server 7 on PATH (apt-get install redis-server): %w", err)
	}
	return nil
}

// Env is one test's schedule and console.
type Env struct {
	RDB    *redis.Client
	Broker *zclaim.Broker
	Idem   *zclaim.Idempotency
	URL    string // the console's root, as in http://127.0.0.1:PORT/zclaim
	Key    string
}

// Options change what New builds.
type Options struct {
	ReadOnly bool
	Shards   int
	PageSize int
	Key      string // the schedule's key; default: one of the test's own
	Addr     string // the Redis server; default: the shared one (Redis)
	// BrokerRuns makes the schedule's Broker with BrokerOptions.Runs (the
	// console's store), as a user may.
	BrokerRuns bool
	Hosts      []string // zclaimweb.Options.Hosts
}

// New gives t a schedule under keys of its own and serves a console of it
// under /zclaim.
func New(t testing.TB, o Options) *Env {
	t.Helper()
	addr := o.Addr
	if addr == "" {
		addr = Redis.Addr
	}
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { rdb.Close() })
	n := seq.Add(1)
	quiet := slog.New(slog.DiscardHandler)
	key := o.Key
	if key == "" {
		key = fmt.Sprintf("web%d:{%s-%d}", n, strings.ReplaceAll(t.Name(), "/", "-"), n)
	}
	idem, err := zclaim.NewIdempotency(rdb, zclaim.IdempotencyOptions{Prefix: key + ":run:", DisableTakeover: true,
		Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	bo := zclaim.BrokerOptions{Key: key, Shards: o.Shards, Logger: quiet}
	if o.BrokerRuns {
		bo.Runs = idem
	}
	b, err := zclaim.NewBroker(rdb, bo)
	if err != nil {
		t.Fatal(err)
	}
	h, err := zclaimweb.New(zclaimweb.Options{Schedules: []*zclaim.Broker{b}, Idempotency: idem,
		Inspector: asynq.NewInspectorFromRedisClient(rdb), ReadOnly: o.ReadOnly, Root: "/zclaim",
		PageSize: o.PageSize, Refresh: 200 * time.Millisecond, Hosts: o.Hosts})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return &Env{RDB: rdb, Broker: b, Idem: idem, URL: srv.URL + "/zclaim", Key: key}
}

// Seed schedules n jobs "job-0".."job-<n-1>" a second apart
// from two hours on, in batches.
func (e *Env) Seed(t testing.TB, n int) {
	t.Helper()
	at := time.Now().Add(2 * time.Hour)
	for i := 0; i < n; i += 1000 {
		var jobs []zclaim.Job
		for j := i; j < min(i+1000, n); j++ {
			jobs = append(jobs, zclaim.Job{ID: fmt.Sprintf("job-%d", j), RunAt: at.Add(time.Duration(j) * time.Second),
				Type: "email", Queue: "default", Payload: []byte(`{"n":1}`)})
		}
		if err := e.Broker.Schedule(context.Background(), jobs...); err != nil {
			t.Fatal(err)
		}
	}
}

// Kill sends job id to the dead set: it is scheduled due now, claimed,
// and killed with reason.
func (e *Env) Kill(t testing.TB, id, reason string) {
	t.Helper()
	ctx := context.Background()
	if err := e.Broker.Schedule(ctx, zclaim.Job{ID: id, RunAt: time.Now().Add(-time.Second), Type: "email"}); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); {
		cs, err := e.Broker.Claim(ctx, zclaim.MaxBatchSize)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range cs {
			if c.ID == id {
				if err := e.Broker.Kill(ctx, c, reason); err != nil {
					t.Fatal(err)
				}
				return
			}
			if err := e.Broker.Retry(ctx, c, time.Now().Add(time.Hour)); err != nil {
				t.Fatal(err)
			}
		}
	}
	t.Fatalf("could not claim %q", id)
}
