package zclaim

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/zclaim/zclaim/internal/logbuf"
	"github.com/zclaim/zclaim/internal/wait"
)

// Redis-level faults on real redis-servers: eviction, a server that runs
// out of memory, one that restarts empty, a failover to a replica, and
// times further out than a score holds.

// serverClient returns a client of s, closed when the test ends.
func serverClient(t *testing.T, s *redisServer) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: s.Addr})
	t.Cleanup(func() { c.Close() })
	return c
}

// A server that may evict keys is refused unless the user accepts the
// risk; a policy changed while running is logged at Error.
func TestEvictionPolicyRefused(t *testing.T) {
	for _, policy := range []string{"allkeys-lru", "volatile-lru", "allkeys-random"} {
		srv := ownRedis(t, "--maxmemory", "20mb", "--maxmemory-policy", policy)
		rdb := serverClient(t, srv)
		_, err := NewBroker(rdb, BrokerOptions{})
		wantErr(t, err, ErrEvictionPolicy)
		if !strings.Contains(err.Error(), policy) || !strings.Contains(err.Error(), "noeviction") {
			t.Errorf("error %q does not say what is set and how to fix it", err)
		}
		_, err = NewIdempotency(rdb, IdempotencyOptions{})
		wantErr(t, err, ErrEvictionPolicy)

		var buf logbuf.Buffer
		log := slog.New(slog.NewTextHandler(&buf, nil))
		if _, err := NewBroker(rdb, BrokerOptions{AllowEviction: true, Logger: log}); err != nil {
			t.Fatal(err)
		}
		if _, err := NewIdempotency(rdb, IdempotencyOptions{AllowEviction: true, Logger: log}); err != nil {
			t.Fatal(err)
		}
		if n := strings.Count(buf.String(), "level=WARN msg=\"zclaim: the Redis server may evict keys"); n != 2 {
			t.Errorf("%d warnings with AllowEviction, want 2:\n%s", n, buf.String())
		}
	}

	// Changed at run time: the recovery loop says so.
	srv := ownRedis(t)
	rdb := serverClient(t, srv)
	var buf logbuf.Buffer
	b, err := NewBroker(rdb, BrokerOptions{Logger: slog.New(slog.NewTextHandler(&buf, nil))})
	must(t, err)
	if !strings.Contains(buf.String(), "persists nothing") {
		t.Errorf("no warning for a server without AOF or save points:\n%s", buf.String())
	}
	must(t, rdb.ConfigSet(ctx, "save", "3600 1").Err())
	var rdbOnly logbuf.Buffer
	_, err = NewIdempotency(rdb, IdempotencyOptions{Logger: slog.New(slog.NewTextHandler(&rdbOnly, nil)), DisableTakeover: true})
	must(t, err)
	if !strings.Contains(rdbOnly.String(), "RDB snapshots only: a crash rolls back") {
		t.Errorf("no warning for a server with RDB save points only:\n%s", rdbOnly.String())
	}
	must(t, rdb.ConfigSet(ctx, "save", "").Err())
	must(t, rdb.ConfigSet(ctx, "maxmemory-policy", "allkeys-lru").Err())
	old := serverCheckInterval
	serverCheckInterval = 0
	defer func() { serverCheckInterval = old }()
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); b.RunRecovery(rctx, 5*time.Millisecond) }()
	waitFor(t, 20*time.Second, "an Error log", func() bool {
		return strings.Contains(buf.String(), "level=ERROR") && strings.Contains(buf.String(), "allkeys-lru")
	})
	cancel()
	wait.Recv(t, done, 10*time.Second, "RunRecovery to return once its context was cancelled")
}

// A server at maxmemory with noeviction refuses writes: a Schedule that
// fails part-way says exactly how many jobs it wrote, and those are there.
func TestScheduleOutOfMemory(t *testing.T) {
	t.Parallel()
	srv := ownRedis(t, "--maxmemory-policy", "noeviction")
	rdb := serverClient(t, srv)
	b, err := NewBroker(rdb, BrokerOptions{Key: "delay:jobs", Logger: slog.New(slog.DiscardHandler)})
	must(t, err)
	info, err := rdb.Info(ctx, "memory").Result()
	must(t, err)
	used, _ := strconv.Atoi(infoField(info, "used_memory"))
	// Room for about two chunks of 1,000 jobs with 1 KB payloads.
	must(t, rdb.ConfigSet(ctx, "maxmemory", strconv.Itoa(used+1600*1024)).Err())
	jobs := make([]Job, 3000)
	payload := []byte(strings.Repeat("x", 1024))
	for i := range jobs {
		jobs[i] = Job{ID: "job-" + strconv.Itoa(i), RunAt: time.Now().Add(time.Hour), Type: "t", Payload: payload}
	}
	err = b.Schedule(ctx, jobs...)
	var se *ScheduleError
	if !errors.As(err, &se) || !strings.Contains(err.Error(), "OOM") {
		t.Fatalf("Schedule at maxmemory: %v, want a *ScheduleError from OOM", err)
	}
	if se.Total != 3000 || se.Written%MaxBatchSize != 0 || se.Written == 0 || se.Written == 3000 {
		t.Fatalf("written %d of %d, want whole chunks, some but not all", se.Written, se.Total)
	}
	n, err := rdb.ZCard(ctx, "delay:jobs").Result()
	must(t, err)
	if int(n) != se.Written {
		t.Fatalf("%d jobs on the schedule, the error says %d", n, se.Written)
	}
	for _, j := range jobs[:se.Written] {
		if _, err := rdb.ZScore(ctx, "delay:jobs", j.ID).Result(); err != nil {
			t.Fatalf("%s reported written, not on the schedule", j.ID)
		}
	}
	// With room again, the rest of the call completes it.
	must(t, rdb.ConfigSet(ctx, "maxmemory", "0").Err())
	must(t, b.Schedule(ctx, jobs[se.Written:]...))
	if n, _ := rdb.ZCard(ctx, "delay:jobs").Result(); n != 3000 {
		t.Fatalf("%d scheduled after completing the call", n)
	}
}

// A server that restarts without persistence lost everything: stale claims
// say so (not "another worker owns it"), Stats reports it, the loss is
// logged at Error, and the idempotency store notices too.
func TestRestartWithoutPersistence(t *testing.T) {
	old := stateCheckInterval
	stateCheckInterval = 5 * time.Millisecond
	defer func() { stateCheckInterval = old }()
	srv := ownRedis(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1})
	t.Cleanup(func() { rdb.Close() })
	var buf logbuf.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	b, err := NewBroker(rdb, BrokerOptions{Key: "delay:jobs", Logger: log})
	must(t, err)
	idem, err := NewIdempotency(rdb, IdempotencyOptions{Logger: log})
	must(t, err)
	t.Cleanup(func() { idem.Close() })
	due := time.Now().Add(-time.Second)
	for i := range 150 {
		must(t, b.Schedule(ctx, Job{ID: "job-" + strconv.Itoa(i), RunAt: due}))
	}
	claims, err := b.Claim(ctx, 50)
	must(t, err)
	stale, err := b.Claim(ctx, 1)
	must(t, err)
	must(t, b.Ack(ctx, stale[0]))
	if err := b.Ack(ctx, stale[0]); !errors.Is(err, ErrLeaseLost) || errors.Is(err, ErrStateLost) {
		t.Fatalf("a stale ack before any loss: %v, want lease lost only", err)
	}
	var execs []*Execution
	for i := range 5 {
		e, err := idem.Begin(ctx, "run-"+strconv.Itoa(i))
		must(t, err)
		must(t, e.Complete(ctx))
		e, err = idem.Begin(ctx, "held-"+strconv.Itoa(i))
		must(t, err)
		execs = append(execs, e)
	}

	srv.Kill()
	must(t, srv.Restart()) // empty: no persistence
	if _, err := rdb.Ping(ctx).Result(); err != nil {
		rdb.Ping(ctx) // the pool's old connections are gone
	}

	err = b.Ack(ctx, claims[0])
	if !errors.Is(err, ErrStateLost) || !errors.Is(err, ErrLeaseLost) || !strings.Contains(err.Error(), "lost the schedule's state") {
		t.Fatalf("ack of a claim the server forgot: %v, want ErrStateLost", err)
	}
	for _, c := range claims[1:3] {
		if _, err := b.Extend(ctx, c, time.Second); !errors.Is(err, ErrStateLost) {
			t.Fatalf("extend: %v", err)
		}
	}
	st, err := b.Stats(ctx)
	must(t, err)
	if st.StateLost.IsZero() || st.Scheduled != 0 {
		t.Fatalf("stats after the restart: %+v", st)
	}
	if n := strings.Count(buf.String(), "level=ERROR msg=\"zclaim: the Redis server lost the schedule's keys"); n != 1 {
		t.Errorf("%d Error logs of the schedule's loss, want 1:\n%s", n, buf.String())
	}
	// The store: a held run's settle says the state was lost; a Begin has
	// the marker checked, which notices.
	if err := execs[0].Complete(ctx); !errors.Is(err, ErrStateLost) {
		t.Fatalf("complete after the restart: %v", err)
	}
	waitFor(t, 10*time.Second, "the store to notice", func() bool {
		e, err := idem.Begin(ctx, "probe")
		if err == nil {
			e.Release(ctx)
		}
		return idem.Stats().StateLost == 1
	})
	if !strings.Contains(buf.String(), "level=ERROR msg=\"zclaim: the Redis server lost the idempotency records") {
		t.Errorf("no Error log of the store's loss:\n%s", buf.String())
	}
	// After the loss is noticed, new claims work and settle normally.
	must(t, b.Schedule(ctx, Job{ID: "after", RunAt: due}))
	cs, err := b.Claim(ctx, 1)
	must(t, err)
	must(t, b.Ack(ctx, cs[0]))
}

// A primary and a replica that reaches it through a proxy (which can hold
// the replication stream: a lagging replica), promoted mid-run. With
// WaitReplicas, every job whose Schedule returned nil is on the promoted
// replica and tokens keep growing, even when the old primary's clock ran
// ahead; without it, the writes of the lag are lost and tokens go back.
func TestFailoverToReplica(t *testing.T) {
	t.Parallel()
	for _, wait := range []bool{true, false} {
		t.Run(map[bool]string{true: "WaitReplicas 1", false: "no wait (control)"}[wait], func(t *testing.T) {
			var link *proxy
			primary, replica := ownReplicaPair(t, func(addr string) string { link = newProxy(t, addr); return link.Addr })
			prdb, rrdb := serverClient(t, primary), serverClient(t, replica)
			opts := BrokerOptions{Key: "delay:jobs", Logger: slog.New(slog.DiscardHandler)}
			if wait {
				opts.WaitReplicas, opts.WaitTimeout = 1, 5*time.Second
			}
			b, err := NewBroker(prdb, opts) // while the replica keeps up
			must(t, err)
			if wait {
				opts.WaitTimeout = 50 * time.Millisecond
			}
			lagging, err := NewBroker(prdb, opts) // while it lags: short waits
			must(t, err)
			// The old primary's clock runs a minute ahead: its tokens do.
			must(t, prdb.Set(ctx, b.keys.tokens, strconv.FormatInt(time.Now().Add(time.Minute).UnixMicro(), 10), 0).Err())

			due := time.Now().Add(-time.Second)
			var acked []string
			var maxToken int64
			schedule := func(b *Broker, i int) {
				id := "job-" + strconv.Itoa(i)
				err := b.Schedule(ctx, Job{ID: id, RunAt: due})
				switch {
				case err == nil:
					acked = append(acked, id)
				case !wait || !errors.Is(err, ErrNotReplicated):
					t.Fatalf("schedule %s: %v", id, err)
				}
			}
			claim := func(b *Broker) {
				cs, err := b.Claim(ctx, 5)
				switch {
				case err == nil:
					for _, c := range cs {
						maxToken = max(maxToken, c.Token)
					}
				case !wait || !errors.Is(err, ErrNotReplicated):
					t.Fatalf("claim: %v", err)
				}
			}
			for i := range 40 {
				schedule(b, i)
			}
			claim(b)
			waitFor(t, 20*time.Second, "the replica to catch up", func() bool {
				p, _ := prdb.Info(ctx, "replication").Result()
				r, _ := rrdb.Info(ctx, "replication").Result()
				return infoField(p, "master_repl_offset") == infoField(r, "slave_repl_offset")
			})
			link.Pause() // the replica lags from here
			for i := 40; i < 50; i++ {
				schedule(lagging, i)
			}
			claim(lagging)
			must(t, rrdb.ReplicaOf(ctx, "NO", "ONE").Err()) // promoted
			link.Close()

			nb, err := NewBroker(rrdb, BrokerOptions{Key: "delay:jobs", Logger: slog.New(slog.DiscardHandler)})
			must(t, err)
			lost := 0
			for _, id := range acked {
				j, err := nb.Job(ctx, id) // scheduled, or in flight (claimed)
				if err != nil || (j.State != StateScheduled && j.State != StateInFlight) {
					lost++
				}
			}
			rt, _ := rrdb.Get(ctx, nb.keys.tokens).Result()
			pt, _ := prdb.Get(ctx, nb.keys.tokens).Result()
			t.Logf("tokens counter: replica %s, old primary %s", rt, pt)
			cs, err := nb.Claim(ctx, 5)
			must(t, err)
			if len(cs) == 0 {
				t.Fatal("nothing to claim on the promoted replica")
			}
			back := cs[0].Token <= maxToken
			t.Logf("acked %d, lost %d; tokens before the failover up to %d, after from %d", len(acked), lost, maxToken, cs[0].Token)
			if wait && (lost > 0 || back || len(acked) != 40) {
				t.Fatalf("with WaitReplicas: %d acked jobs lost, tokens back: %v (acked %d, want the 40 before the lag)", lost, back, len(acked))
			}
			if !wait && (lost < 10 || !back) {
				t.Fatalf("without waiting: %d lost (want at least the lag's 10), tokens back: %v: the control no longer shows the failure", lost, back)
			}
		})
	}
}

// Times further out than a score holds are refused, never due at once;
// everything computed from a score saturates.
func TestTimesOutOfRange(t *testing.T) {
	t.Parallel()
	b := newBroker(t, BrokerOptions{})
	for _, at := range []time.Time{
		time.Date(300_000_000, 1, 1, 0, 0, 0, 0, time.UTC),
		time.Unix(1<<62, 0),
		time.Unix(math.MaxInt64, 0),
		time.Unix(math.MinInt64/2, 0),
		time.UnixMilli(maxScoreMs + 1000),
	} {
		err := b.Schedule(ctx, Job{ID: "far", RunAt: at})
		wantErr(t, err, ErrInvalidJob)
		wantErr(t, err, ErrRunAtRange)
		c, _ := b.Claim(ctx, 1)
		wantErr(t, b.Retry(ctx, Claim{Job: Job{ID: "x"}, Token: 1}, at), ErrRunAtRange)
		if st, _ := b.Stats(ctx); st.Scheduled != 0 || len(c) != 0 {
			t.Fatalf("RunAt %v: %+v scheduled, %d claimed", at, st, len(c))
		}
	}
	// The furthest that fits is kept to the millisecond.
	far := time.UnixMilli(maxScoreMs - 1001)
	must(t, b.Schedule(ctx, Job{ID: "far", RunAt: far}))
	st, err := b.Stats(ctx)
	must(t, err)
	if d := st.Next.Sub(far); d < 0 || d >= time.Millisecond {
		t.Fatalf("Next %v, want %v", st.Next, far)
	}
	must(t, b.rdb.ZAdd(ctx, b.Key(), redis.Z{Score: float64(-maxScoreMs+1001) / 1000, Member: "past"}).Err())
	cs, err := b.Claim(ctx, 1)
	must(t, err)
	if len(cs) != 1 || !cs[0].Due.Equal(time.UnixMilli(-maxScoreMs+1001)) {
		t.Fatalf("the earliest time a score holds: claims %+v", cs)
	}
	// A score no time holds (a foreign ZADD) reads as the furthest time.
	must(t, b.rdb.ZAdd(ctx, b.Key(), redis.Z{Score: 1e300, Member: "never"}).Err())
	must(t, b.rdb.ZRem(ctx, b.Key(), "far").Err())
	st, err = b.Stats(ctx)
	must(t, err)
	if st.Next.Year() < 200_000 {
		t.Fatalf("Next for a score of 1e300: %v", st.Next)
	}

	// A dispatcher whose head job is centuries away sleeps MaxWait, not 0.
	var sent atomic.Int64
	rdb := redis.NewClient(&redis.Options{Addr: testAddr})
	t.Cleanup(func() { rdb.Close() })
	rdb.AddHook(roundTrips{&sent})
	db, err := NewBroker(rdb, BrokerOptions{Key: b.Key()})
	must(t, err)
	d, err := NewDispatcher(db, newAsynqClient(t, testAddr), DispatcherOptions{MaxWait: 100 * time.Millisecond, RecoveryInterval: -1})
	must(t, err)
	stop := runDispatcher(t, d)
	time.Sleep(300 * time.Millisecond)
	stop()
	// About 16 round trips, and 3 more for Run's one read of the periodic
	// definitions at its start (a pipeline, on a connection of its own);
	// a dispatcher that spins makes hundreds.
	if n := sent.Load(); n > 25 {
		t.Fatalf("%d round trips in 300ms with the head 1e300 s away: the dispatcher spins", n)
	}

	// Dead() on a key of the wrong type names it.
	must(t, b.rdb.Set(ctx, b.keys.dead, "x", 0).Err())
	_, err = listDead(b, 10)
	var wt *WrongTypeError
	if !errors.As(err, &wt) || wt.Key != b.keys.dead {
		t.Fatalf("Dead on a string: %v", err)
	}
}

// The middleware works as it did with WaitReplicas on a server with a
// replica: a smoke test of the idempotency store's waits.
func TestIdempotencyWaitsForReplica(t *testing.T) {
	t.Parallel()
	primary, replica := ownReplicaPair(t, nil)
	rrdb := serverClient(t, replica)
	prdb := serverClient(t, primary)
	// A wait long enough for a replica starved of CPU (a loaded machine
	// runs every test at once): each call returns as soon as it acks.
	i, err := NewIdempotency(prdb, IdempotencyOptions{WaitReplicas: 1, WaitTimeout: 10 * time.Second,
		Logger: slog.New(slog.DiscardHandler)})
	must(t, err)
	e, err := i.Begin(ctx, "k")
	must(t, err)
	must(t, e.Complete(ctx))
	if bucket, field := i.doneOf("k"); !rrdb.HExists(ctx, bucket, field).Val() {
		t.Fatal("the replica has no finished record")
	}
	i2, err := NewIdempotency(prdb, IdempotencyOptions{WaitReplicas: 2, WaitTimeout: 20 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
	must(t, err)
	_, err = i2.Begin(ctx, "k2")
	wantErr(t, err, ErrNotReplicated)
}

// A user that may not publish on the notice channel (an ACL) still
// schedules: the notice is skipped and logged once, the job is written and
// Schedule reports success; a dispatcher finds the job within MaxWait.
func TestScheduleWithoutPublishPermission(t *testing.T) {
	t.Parallel()
	srv := ownRedis(t)
	admin := serverClient(t, srv)
	must(t, admin.Do(ctx, "ACL", "SETUSER", "sched", "on", ">pw", "~*", "resetchannels", "+@all").Err())
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, Username: "sched", Password: "pw"})
	t.Cleanup(func() { rdb.Close() })
	if err := rdb.Publish(ctx, "x", "y").Err(); err == nil {
		t.Fatal("the user may publish: the test shows nothing")
	}
	var buf logbuf.Buffer
	b, err := NewBroker(rdb, BrokerOptions{Key: "delay:jobs", Logger: slog.New(slog.NewTextHandler(&buf, nil))})
	must(t, err)
	for i := range 3 {
		must(t, b.Schedule(ctx, Job{ID: "job-" + strconv.Itoa(i), RunAt: time.Now().Add(-time.Duration(i+1) * time.Second)}))
	}
	if n, _ := admin.ZCard(ctx, "delay:jobs").Result(); n != 3 {
		t.Fatalf("%d jobs written, want 3", n)
	}
	if n := strings.Count(buf.String(), "refused to publish"); n != 1 {
		t.Fatalf("%d warnings of the refused notice, want 1:\n%s", n, buf.String())
	}
	cs, err := b.Claim(ctx, 10)
	must(t, err)
	must(t, b.Retry(ctx, cs[0], time.Time{})) // its notice is skipped too
}

// Many claimers on connections of their own, every write waiting for a
// replica: each job (plain ZADD members, whose due rides in the in-flight
// member, and scheduled jobs with records) goes to exactly one claimer,
// every Ack lands, and the replica holds the same end state.
func TestClaimConcurrentWithWait(t *testing.T) {
	t.Parallel()
	primary, replica := ownReplicaPair(t, nil)
	rrdb := serverClient(t, replica)
	admin := serverClient(t, primary)
	opts := BrokerOptions{Key: "delay:jobs", WaitReplicas: 1, WaitTimeout: 10 * time.Second, Lease: time.Minute,
		Logger: slog.New(slog.DiscardHandler)} // a wait long enough for a replica starved of CPU
	b, err := NewBroker(admin, opts)
	must(t, err)
	const n, workers = 2000, 8
	due := time.Now().Add(-time.Second)
	var zs []redis.Z
	for i := range n / 2 {
		zs = append(zs, redis.Z{Score: float64(due.Unix()), Member: "plain-" + strconv.Itoa(i)})
	}
	must(t, admin.ZAdd(ctx, "delay:jobs", zs...).Err())
	must(t, b.Schedule(ctx, jobsDue(n/2, "job-", due)...))

	var mu sync.Mutex
	seen := map[string]int{}
	errs := make(chan error, workers)
	onOwnConnsAt(t, primary.Addr, workers, opts, func(_ int, wb *Broker) {
		for {
			cs, err := wb.Claim(ctx, 50)
			if err != nil {
				errs <- err
				return
			}
			if len(cs) == 0 {
				return
			}
			mu.Lock()
			for _, cl := range cs {
				seen[cl.ID]++
			}
			mu.Unlock()
			if lost, err := wb.AckMany(ctx, cs...); err != nil || len(lost) > 0 {
				errs <- fmt.Errorf("ack: %d lost, %v", len(lost), err)
				return
			}
		}
	})
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	eachOnce(t, seen, n, "claimed")
	for _, c := range []*redis.Client{admin, rrdb} {
		if s, _ := c.ZCard(ctx, "delay:jobs").Result(); s != 0 {
			t.Fatalf("%d left scheduled", s)
		}
		if f, _ := c.ZCard(ctx, b.keys.inflight).Result(); f != 0 {
			t.Fatalf("%d left in flight", f)
		}
	}
}

// Checks racing after a loss count it once, and a second process's
// broker notices the same loss on its own.
func TestStateLossCountedOnce(t *testing.T) {
	t.Parallel()
	srv := ownRedis(t)
	rdb := serverClient(t, srv)
	quiet := slog.New(slog.DiscardHandler)
	a, err := NewBroker(rdb, BrokerOptions{Key: "delay:jobs", Logger: quiet})
	must(t, err)
	b, err := NewBroker(serverClient(t, srv), BrokerOptions{Key: "delay:jobs", Logger: quiet})
	must(t, err)
	must(t, rdb.FlushAll(ctx).Err())
	var wg sync.WaitGroup
	for range 16 {
		for _, br := range []*Broker{a, b} {
			wg.Add(1)
			go func() { defer wg.Done(); br.state.check(ctx) }()
		}
	}
	wg.Wait()
	for i, br := range []*Broker{a, b} {
		if _, n := br.state.lost(); n != 1 {
			t.Errorf("broker %d counted %d losses, want 1", i, n)
		}
	}
	if a.state.current() != b.state.current() || a.state.current() == "" {
		t.Errorf("the brokers hold markers %q and %q", a.state.current(), b.state.current())
	}
}

// The recovery loop notices a lost state from the marker its pass reads.
func TestRecoveryLoopNoticesLoss(t *testing.T) {
	t.Parallel()
	srv := ownRedis(t)
	rdb := serverClient(t, srv)
	b, err := NewBroker(rdb, BrokerOptions{Key: "delay:jobs", Logger: slog.New(slog.DiscardHandler)})
	must(t, err)
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); b.RunRecovery(rctx, 5*time.Millisecond) }()
	defer func() {
		cancel()
		wait.Recv(t, done, 10*time.Second, "RunRecovery to return once its context was cancelled")
	}()
	time.Sleep(20 * time.Millisecond)
	if _, n := b.state.lost(); n != 0 {
		t.Fatalf("%d losses before any", n)
	}
	must(t, rdb.FlushAll(ctx).Err())
	waitFor(t, 10*time.Second, "the loss noticed", func() bool { _, n := b.state.lost(); return n == 1 })
}
