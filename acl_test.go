package zclaim

import (
	"errors"
	"log/slog"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/zclaim/zclaim/internal/logbuf"
)

// readmeACL returns the ACL SETUSER line of docs/broker.md, as words.
func readmeACL(t *testing.T) []string {
	readme, err := os.ReadFile("docs/broker.md")
	must(t, err)
	line := regexp.MustCompile(`(?m)^ACL SETUSER orders .*$`).Find(readme)
	if line == nil {
		t.Fatal("docs/broker.md has no ACL SETUSER orders line")
	}
	return strings.Fields(string(line))
}

// aclUser creates the README's user on srv, with the words in drop left
// out, and returns a client that logs in as it through a URL with its
// password.
func aclUser(t *testing.T, srv *redisServer, name string, drop ...string) *redis.Client {
	words := readmeACL(t)
	args := []any{}
	for i, w := range words {
		switch {
		case i == 2:
			w = name
		case slicesContains(drop, w):
			continue
		}
		args = append(args, w)
	}
	admin := serverClient(t, srv)
	must(t, admin.Do(ctx, args...).Err())
	opt, err := redis.ParseURL("redis://" + name + ":s3cret@" + srv.Addr + "/0")
	must(t, err)
	c := redis.NewClient(opt)
	t.Cleanup(func() { c.Close() })
	return c
}

func slicesContains(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

// With the README's ACL, a service runs the broker, the dispatcher, the
// middleware and an asynq server as that user: every job runs once, and
// nothing zclaim logs carries the password.
func TestACLDocumentedUser(t *testing.T) {
	t.Parallel()
	srv := ownRedis(t)
	rdb := aclUser(t, srv, "orders")
	if err := rdb.FlushAll(ctx).Err(); err == nil {
		t.Fatal("the README's user may FLUSHALL: not least privilege")
	}
	var logs logbuf.Buffer
	log := slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	b, err := NewBroker(rdb, BrokerOptions{Key: "delay:jobs", Lease: 200 * time.Millisecond, Logger: log})
	must(t, err)
	idem, err := NewIdempotency(rdb, IdempotencyOptions{Logger: log})
	must(t, err)
	t.Cleanup(func() { idem.Close() })
	runs := serveRuns(t, rdb, idem)
	d, err := NewDispatcher(b, asynq.NewClientFromRedisClient(rdb), DispatcherOptions{DefaultType: "order:reminder",
		RecoveryInterval: 20 * time.Millisecond})
	must(t, err)
	runDispatcher(t, d)

	due := time.Now().Add(-time.Second)
	for i := range 20 {
		must(t, b.Schedule(ctx, Job{ID: "order-" + strconv.Itoa(i), RunAt: due, Type: "order:reminder", Payload: []byte("x")}))
	}
	must(t, rdb.ZAdd(ctx, "delay:jobs", redis.Z{Score: float64(due.Unix()), Member: "plain-1"}).Err())
	cs, err := b.Claim(ctx, 1) // a direct claimer that dies: recovery brings it back
	must(t, err)
	waitFor(t, 10*time.Second, "every job run", func() bool { return len(runs.counts()) == 21 })
	// The same ZADD again: the dispatcher logs the conflict (Info). (A
	// claim held past its 200 ms lease by a loaded machine is dispatched
	// again, and meets a conflict of its own.)
	conflicts := d.Stats().Conflicts
	must(t, rdb.ZAdd(ctx, "delay:jobs", redis.Z{Score: float64(due.Unix()), Member: "plain-1"}).Err())
	waitFor(t, 20*time.Second, "the repeat settled", func() bool { return d.Stats().Conflicts > conflicts })
	if len(cs) == 1 {
		if err := b.Ack(ctx, cs[0]); !errors.Is(err, ErrLeaseLost) && err != nil {
			t.Fatal(err)
		}
	}
	st, err := b.Stats(ctx)
	must(t, err)
	if _, err := listDead(b, 10); err != nil {
		t.Fatal(err)
	}
	eachOnce(t, runs.counts(), 21, "ran")
	if !strings.Contains(logs.String(), "asynq already has a task of this occurrence") {
		t.Fatalf("the run logged nothing to look at:\n%s", logs.String())
	}
	if strings.Contains(logs.String(), "s3cret") {
		t.Fatalf("the password is in the logs:\n%s", logs.String())
	}
	t.Logf("stats %+v; %d bytes of logs", st, len(logs.String()))
}

// Without a permission the README's line grants, each call either fails
// before writing anything or works without what it lacks.
func TestACLMissingPermissions(t *testing.T) {
	t.Parallel()
	srv := ownRedis(t)
	admin := serverClient(t, srv)
	due := time.Now().Add(-time.Second)
	quiet := slog.New(slog.DiscardHandler)

	// No derived keys: Schedule, Claim and Cancel fail, and write nothing.
	rdb := aclUser(t, srv, "nokeys", "~{delay:jobs}:*")
	b, err := NewBroker(rdb, BrokerOptions{Key: "delay:jobs", Logger: quiet})
	must(t, err)
	err = b.Schedule(ctx, Job{ID: "a", RunAt: due, Type: "t"})
	if err == nil || !strings.Contains(err.Error(), "NOPERM") {
		t.Fatalf("Schedule without the derived keys: %v", err)
	}
	must(t, admin.ZAdd(ctx, "delay:jobs", redis.Z{Score: 1, Member: "plain"}).Err())
	if _, err := b.Claim(ctx, 1); err == nil {
		t.Fatal("Claim without the derived keys succeeded")
	}
	if n, _ := admin.ZCard(ctx, "delay:jobs").Result(); n != 1 {
		t.Fatalf("%d members after the refused calls, want the 1 plain one", n)
	}
	if keys, _ := admin.Keys(ctx, "{delay:jobs}:*").Result(); len(keys) != 0 {
		t.Fatalf("refused calls wrote %v", keys)
	}

	// No notice channel: Schedule works (the notice is skipped).
	rdb = aclUser(t, srv, "nochan", "&{delay:jobs}:notice")
	b, err = NewBroker(rdb, BrokerOptions{Key: "delay:jobs", Logger: quiet})
	must(t, err)
	must(t, b.Schedule(ctx, Job{ID: "b", RunAt: due}))

	// No INFO: the start-up checks are skipped with a warning.
	var logs logbuf.Buffer
	rdb = aclUser(t, srv, "noinfo", "+info")
	_, err = NewBroker(rdb, BrokerOptions{Key: "delay:jobs", Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	must(t, err)
	if !strings.Contains(logs.String(), "could not read the server's eviction policy") {
		t.Fatalf("no warning without INFO:\n%s", logs.String())
	}

	// No run-record prefix: Begin fails, and the handler does not run.
	rdb = aclUser(t, srv, "noruns", "~zclaim:run:*")
	idem, err := NewIdempotency(rdb, IdempotencyOptions{Logger: quiet})
	must(t, err)
	if _, err := idem.Begin(ctx, "k"); err == nil || !strings.Contains(err.Error(), "NOPERM") {
		t.Fatalf("Begin without the prefix: %v", err)
	}
}

// Each role as a user of its own, with the lines of docs/operations.md: a
// producer that schedules, a dispatcher, and a worker with the middleware.
func TestACLPerRole(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile("docs/operations.md")
	must(t, err)
	srv := ownRedis(t)
	admin := serverClient(t, srv)
	login := func(role string) *redis.Client {
		line := regexp.MustCompile(`(?m)^ACL SETUSER ` + role + ` .*$`).Find(doc)
		if line == nil {
			t.Fatalf("docs/operations.md has no line for %s", role)
		}
		var args []any
		for _, w := range strings.Fields(string(line)) {
			args = append(args, w)
		}
		must(t, admin.Do(ctx, args...).Err())
		c := redis.NewClient(&redis.Options{Addr: srv.Addr, Username: role, Password: "s3cret"})
		t.Cleanup(func() { c.Close() })
		return c
	}
	quiet := slog.New(slog.DiscardHandler)
	producer, dispatcher, worker := login("producer"), login("dispatcher"), login("worker")

	idem, err := NewIdempotency(worker, IdempotencyOptions{Logger: quiet})
	must(t, err)
	t.Cleanup(func() { idem.Close() })
	runs := serveRuns(t, worker, idem)
	db, err := NewBroker(dispatcher, BrokerOptions{Key: "delay:jobs", Logger: quiet})
	must(t, err)
	d, err := NewDispatcher(db, asynq.NewClientFromRedisClient(dispatcher), DispatcherOptions{DefaultType: "t",
		RecoveryInterval: 20 * time.Millisecond})
	must(t, err)
	runDispatcher(t, d)

	pb, err := NewBroker(producer, BrokerOptions{Key: "delay:jobs", Logger: quiet})
	must(t, err)
	for i := range 20 {
		must(t, pb.Schedule(ctx, Job{ID: "order-" + strconv.Itoa(i), RunAt: time.Now().Add(20 * time.Millisecond), Type: "t"}))
	}
	if _, err := pb.Stats(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "every job run", func() bool { return len(runs.counts()) == 20 })
	eachOnce(t, runs.counts(), 20, "ran")
	// Each role is kept to its own keys.
	if err := producer.Get(ctx, "asynq:queues").Err(); err == nil || !strings.Contains(err.Error(), "NOPERM") {
		t.Errorf("the producer may read asynq's keys: %v", err)
	}
	if err := worker.ZCard(ctx, "delay:jobs").Err(); err == nil || !strings.Contains(err.Error(), "NOPERM") {
		t.Errorf("the worker may read the schedule: %v", err)
	}
}
