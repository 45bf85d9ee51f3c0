package zclaim

import (
	"context"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/zclaim/zclaim/internal/redisproc"
	"github.com/zclaim/zclaim/internal/tcpproxy"
)

// quietLogger keeps asynq servers silent in tests.
type quietLogger = redisproc.QuietAsynq

// testQueue returns an asynq queue name of the test's own; asynq's keys
// for it ("asynq:{name}:...") are deleted when the test ends.
func testQueue(t testing.TB) string {
	t.Helper()
	key := testKey(t) // "zt:{tag}"
	tag, _ := hashTag(key)
	t.Cleanup(func() { // asynq lists every queue it has seen in asynq:queues
		c := redis.NewClient(&redis.Options{Addr: testAddr})
		defer c.Close()
		c.SRem(context.Background(), "asynq:queues", tag)
	})
	return tag
}

// startAsynq runs an asynq server on queue with short check intervals,
// shut down when the test ends. cfg's zero fields get test defaults.
func startAsynq(t testing.TB, addr, queue string, h asynq.Handler, cfg asynq.Config) *asynq.Server {
	t.Helper()
	return startAsynqOn(t, nil, addr, queue, h, cfg)
}

// startAsynqOn is startAsynq with the server on client rdb, if not nil.
func startAsynqOn(t testing.TB, rdb redis.UniversalClient, addr, queue string, h asynq.Handler, cfg asynq.Config) *asynq.Server {
	t.Helper()
	cfg.Queues = map[string]int{queue: 1}
	if cfg.Concurrency == 0 {
		cfg.Concurrency = 4
	}
	if cfg.TaskCheckInterval == 0 {
		cfg.TaskCheckInterval = 10 * time.Millisecond
	}
	if cfg.DelayedTaskCheckInterval == 0 {
		cfg.DelayedTaskCheckInterval = 20 * time.Millisecond
	}
	if cfg.ShutdownTimeout == 0 {
		cfg.ShutdownTimeout = 2 * time.Second
	}
	if cfg.RetryDelayFunc == nil {
		// asynq's default waits 15 s and more: a transient failure on a
		// loaded machine would outlast the tests' waits.
		cfg.RetryDelayFunc = fastRetry
	}
	cfg.Logger = quietLogger{}
	cfg.LogLevel = asynq.FatalLevel
	var srv *asynq.Server
	if rdb != nil {
		srv = asynq.NewServerFromRedisClient(rdb, cfg)
	} else {
		srv = asynq.NewServer(asynq.RedisClientOpt{Addr: addr}, cfg)
	}
	if err := srv.Start(h); err != nil {
		t.Fatalf("asynq server: %v", err)
	}
	t.Cleanup(srv.Shutdown)
	return srv
}

func newAsynqClient(t testing.TB, addr string) *asynq.Client {
	t.Helper()
	c := asynq.NewClient(asynq.RedisClientOpt{Addr: addr})
	t.Cleanup(func() { c.Close() })
	return c
}

// newAutopipelinedAsynqClient returns an asynq client on an autopipelined
// go-redis client of its own (with hooks), as the README's quick start
// gives the Dispatcher.
func newAutopipelinedAsynqClient(t testing.TB, addr string, hooks ...redis.Hook) *asynq.Client {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { rdb.Close() })
	for _, h := range hooks {
		rdb.AddHook(h)
	}
	ap, err := rdb.AutoPipeline()
	must(t, err)
	return asynq.NewClientFromRedisClient(ap)
}

func newInspector(t testing.TB) *asynq.Inspector {
	t.Helper()
	in := asynq.NewInspector(asynq.RedisClientOpt{Addr: testAddr})
	t.Cleanup(func() { in.Close() })
	return in
}

// waitFor polls cond every few ms until it holds or d passes.
func waitFor(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// waitProgress polls count every few ms until it reaches want. It fails
// only once count has stayed put for stall: on a loaded machine a run that
// is slow but going finishes, and a stuck one fails. report, if not nil,
// says more on failure.
func waitProgress(t testing.TB, stall time.Duration, what string, want int, count func() int, report func() string) {
	t.Helper()
	last, moved := count(), time.Now()
	for last < want {
		time.Sleep(5 * time.Millisecond)
		if n := count(); n != last {
			last, moved = n, time.Now()
		} else if time.Since(moved) > stall {
			more := ""
			if report != nil {
				more = "; " + report()
			}
			t.Fatalf("%s: %d of %d, none more in %v%s", what, last, want, stall, more)
		}
	}
}

type proxy = tcpproxy.Proxy

// newProxy forwards to target until the test ends.
func newProxy(t testing.TB, target string) *proxy {
	t.Helper()
	p, err := tcpproxy.New(target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// clientVia returns a go-redis client that reaches Redis through p.
func clientVia(t testing.TB, p *proxy) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: p.Addr, MaxRetries: -1})
	t.Cleanup(func() { c.Close() })
	return c
}
