package zclaim

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
)

// quietLogger keeps asynq servers silent in tests.
type quietLogger struct{}

func (quietLogger) Debug(...any) {}
func (quietLogger) Info(...any)  {}
func (quietLogger) Warn(...any)  {}
func (quietLogger) Error(...any) {}
func (quietLogger) Fatal(...any) {}

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
	cfg.Logger = quietLogger{}
	cfg.LogLevel = asynq.FatalLevel
	srv := asynq.NewServer(asynq.RedisClientOpt{Addr: addr}, cfg)
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

// proxy forwards TCP connections to a Redis server. Pause holds all bytes
// in both directions (a stalled process, a partitioned network) until
// Resume; the client's connections stay open.
type proxy struct {
	addr   string
	target string
	l      net.Listener
	mu     sync.Mutex
	cond   *sync.Cond
	paused bool
	down   bool
	conns  []net.Conn
}

func newProxy(t testing.TB, target string) *proxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{addr: l.Addr().String(), target: target, l: l}
	p.cond = sync.NewCond(&p.mu)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

func (p *proxy) accept() {
	for {
		c, err := p.l.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		down := p.down
		p.mu.Unlock()
		if down {
			c.Close()
			continue
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, s)
		p.mu.Unlock()
		go p.pipe(c, s)
		go p.pipe(s, c)
	}
}

func (p *proxy) pipe(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			for p.paused {
				p.cond.Wait()
			}
			p.mu.Unlock()
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			dst.Close()
			return
		}
	}
}

func (p *proxy) Pause() { p.mu.Lock(); p.paused = true; p.mu.Unlock() }

func (p *proxy) Resume() { p.mu.Lock(); p.paused = false; p.cond.Broadcast(); p.mu.Unlock() }

// SetDown cuts every connection and refuses new ones while down is true.
func (p *proxy) SetDown(down bool) {
	p.mu.Lock()
	p.down = down
	conns := p.conns
	if down {
		p.conns = nil
	}
	p.mu.Unlock()
	if down {
		for _, c := range conns {
			c.Close()
		}
	}
}

func (p *proxy) close() {
	p.Resume()
	p.l.Close()
	p.mu.Lock()
	for _, c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
}

// clientVia returns a go-redis client that reaches Redis through p.
func clientVia(t testing.TB, p *proxy) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: p.addr, MaxRetries: -1})
	t.Cleanup(func() { c.Close() })
	return c
}
