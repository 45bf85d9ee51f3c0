package zclaim

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/zclaim/zclaim/internal/redisproc"
)

// The tests talk to a real Redis. By default TestMain starts its own
// redis-server (from PATH) on a free port, without persistence, and stops
// it at the end. ZCLAIM_TEST_REDIS=host:port uses that server instead; the
// tests then touch only keys of their own and never flush it.
const redisEnv = "ZCLAIM_TEST_REDIS"

var testAddr string

func TestMain(m *testing.M) {
	if runWorkerRole() || runPeriodicRole() || runCrashRole() || runStuckRole() {
		return
	}
	redis.SetLogger(redisproc.QuietRedis{}) // the tests that stop Redis on purpose would fill the output with dial errors
	testAddr = os.Getenv(redisEnv)
	var srv *redisServer
	if testAddr == "" {
		var err error
		srv, err = redisproc.Start()
		if err != nil {
			fmt.Fprintf(os.Stderr, "zclaim tests need a Redis 7 server: %v\n"+
				"install one (apt-get install redis-server) or name one with %s=host:port\n", err, redisEnv)
			os.Exit(2)
		}
		testAddr = srv.Addr
	}
	os.Setenv("REDIS_ADDR", testAddr)
	deleteExampleKeys()
	code := m.Run()
	deleteExampleKeys()
	if srv != nil {
		srv.Close()
	}
	os.Exit(code)
}

// roleMust ends a child process's role (see TestMain) on err, printed to
// stderr for the parent to show.
func roleMust(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
}

// redisServer is a redis-server process owned by the tests.
type redisServer = redisproc.Server

// ownRedis starts a server for one test that needs to stop and restart it
// (or to start it with extra arguments), removed when the test ends.
func ownRedis(t testing.TB, extra ...string) *redisServer {
	t.Helper()
	s, err := redisproc.Start(extra...)
	if err != nil {
		t.Fatalf("start redis-server: %v", err)
	}
	t.Cleanup(s.Close)
	return s
}

// ownReplicaPair starts a primary and a replica of it (through the
// address replicaOf gives, the primary's own when nil) and waits until the
// replica is linked.
func ownReplicaPair(t testing.TB, replicaOf func(primary string) string) (primary, replica *redisServer) {
	t.Helper()
	primary = ownRedis(t, "--repl-diskless-sync-delay", "0")
	addr := primary.Addr
	if replicaOf != nil {
		addr = replicaOf(addr)
	}
	host, port, _ := net.SplitHostPort(addr)
	replica = ownRedis(t, "--replicaof", host, port)
	if err := redisproc.WaitLink(replica.Addr, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	return primary, replica
}

// eachOnce fails the test unless seen counts n keys, each once.
func eachOnce(t testing.TB, seen map[string]int, n int, what string) {
	t.Helper()
	if len(seen) != n {
		t.Fatalf("%d distinct ids %s, want %d", len(seen), what, n)
	}
	for id, k := range seen {
		if k != 1 {
			t.Fatalf("%s %s %d times", id, what, k)
		}
	}
}

// newClient returns a client of the test server, closed at the end of the test.
func newClient(t testing.TB) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: testAddr, PoolSize: 4})
	t.Cleanup(func() { c.Close() })
	return c
}

// ownConn returns a client of the test server with a single connection, for
// a goroutine that must not share one; closed at the end of the test.
func ownConn(t testing.TB) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: testAddr, PoolSize: 1})
	t.Cleanup(func() { c.Close() })
	return c
}

// testKey returns a schedule key of the test's own, "zt:{name:random}", and
// deletes every key that shares its hash tag when the test ends.
func testKey(t testing.TB) string {
	t.Helper()
	var b [4]byte
	rand.Read(b[:])
	name := strings.NewReplacer("/", ".", "{", "", "}", "", " ", "_").Replace(t.Name())
	tag := name + ":" + hex.EncodeToString(b[:])
	t.Cleanup(func() { deleteTagged(tag) })
	return "zt:{" + tag + "}"
}

// deleteTagged removes the keys whose name holds {tag}, or the tag of a
// shard of it ({tag/...}). UNLINK, not DEL: a test's set of a million
// members (TestScriptsBounded) would stall the shared server 130 ms while
// it is freed, and the leases of tests running beside it last tens of ms.
func deleteTagged(tag string) {
	c := redis.NewClient(&redis.Options{Addr: testAddr})
	defer c.Close()
	ctx := context.Background()
	for _, pattern := range []string{"*{" + tag + "}*", "*{" + tag + "/*"} {
		iter := c.Scan(ctx, 0, pattern, 1000).Iterator()
		for iter.Next(ctx) {
			c.Unlink(ctx, iter.Val())
		}
	}
}

// newBroker returns a broker on its own key with short leases.
func newBroker(t testing.TB, opts BrokerOptions) *Broker {
	t.Helper()
	if opts.Key == "" {
		opts.Key = testKey(t)
	}
	if opts.Lease == 0 {
		opts.Lease = 50 * time.Millisecond
	}
	b, err := NewBroker(newClient(t), opts)
	if err != nil {
		t.Fatalf("NewBroker: %v", err)
	}
	return b
}

// redisNow reads Redis TIME.
func redisNow(t testing.TB, c redis.UniversalClient) time.Time {
	t.Helper()
	now, err := c.Time(context.Background()).Result()
	if err != nil {
		t.Fatalf("TIME: %v", err)
	}
	return now
}

// must fails the test on err; for the test's own goroutine only.
func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// wantErr fails the test unless errors.Is(err, target), showing both.
func wantErr(t testing.TB, err, target error) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Fatalf("error %v, want one matching %v", err, target)
	}
}

// startOver runs attempt, a test's scenario run afresh each time (most on
// keys or a rig of their own), until it passes, most times at most. attempt returns what went wrong
// ("" when nothing did) and, where a machine too loaded for the scenario
// explains that, how ("" when nothing does). A fault nothing explains
// fails the test at once; an explained one is logged and the scenario
// runs again, but on the last attempt it fails the test too.
func startOver(t *testing.T, most int, attempt func(n int) (fault, excuse string)) {
	t.Helper()
	for n := 1; ; n++ {
		fault, excuse := attempt(n)
		switch {
		case fault == "":
			return
		case excuse == "":
			t.Fatalf("attempt %d: %s", n, fault)
		case n == most:
			t.Fatalf("attempt %d, the last: %s (%s)", n, fault, excuse)
		}
		t.Logf("attempt %d: %s; %s: again", n, fault, excuse)
	}
}

// plainKey returns a key without a hash tag, as a foreign producer might
// use, and deletes it and the keys derived from it when the test ends.
func plainKey(t testing.TB) string {
	t.Helper()
	var b [4]byte
	rand.Read(b[:])
	key := "zt:plain:" + hex.EncodeToString(b[:])
	t.Cleanup(func() {
		c := redis.NewClient(&redis.Options{Addr: testAddr})
		defer c.Close()
		ctx := context.Background()
		c.Del(ctx, key)
		iter := c.Scan(ctx, 0, "{"+key+"}*", 1000).Iterator()
		for iter.Next(ctx) {
			c.Unlink(ctx, iter.Val())
		}
	})
	return key
}

// The package's Example functions reach the test server through
// REDIS_ADDR, as a program of yours might, and keep their keys and asynq
// queues under "zclaim-example:{...}", removed before and after the tests.
const exampleKeys = "zclaim-example:{"

func deleteExampleKeys() {
	c := redis.NewClient(&redis.Options{Addr: testAddr})
	defer c.Close()
	ctx := context.Background()
	iter := c.Scan(ctx, 0, exampleKeys+"*", 1000).Iterator()
	for iter.Next(ctx) {
		c.Del(ctx, iter.Val())
	}
	queues, _ := c.SMembers(ctx, "asynq:queues").Result()
	for _, q := range queues {
		if strings.HasPrefix(q, exampleKeys) {
			c.SRem(ctx, "asynq:queues", q)
			iter := c.Scan(ctx, 0, "asynq:{"+q+"}*", 1000).Iterator()
			for iter.Next(ctx) {
				c.Del(ctx, iter.Val())
			}
		}
	}
}

// onOwnConns runs f(w, b) for w = 0..n-1, each on a goroutine of its own
// with a Broker of opts on a connection of its own, and waits for them.
func onOwnConns(t *testing.T, n int, opts BrokerOptions, f func(w int, b *Broker)) {
	onOwnConnsAt(t, testAddr, n, opts, f)
}

// onOwnConnsAt is onOwnConns on the server at addr.
func onOwnConnsAt(t *testing.T, addr string, n int, opts BrokerOptions, f func(w int, b *Broker)) {
	var wg sync.WaitGroup
	for w := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 1})
			t.Cleanup(func() { c.Close() })
			b, err := NewBroker(c, opts)
			if err != nil {
				t.Error(err)
				return
			}
			f(w, b)
		}()
	}
	wg.Wait()
}

// roundTrips counts what a client sends: one per command or pipeline.
type roundTrips struct{ n *atomic.Int64 }

func (h roundTrips) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h roundTrips) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { h.n.Add(1); return next(ctx, cmd) }
}
func (h roundTrips) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error { h.n.Add(1); return next(ctx, cmds) }
}

// listDead returns up to max jobs of b's dead set, oldest death first.
func listDead(b *Broker, max int) ([]JobInfo, error) {
	l, err := b.List(ctx, StateDead, ListOptions{Limit: max})
	return l.Jobs, err
}
