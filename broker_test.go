package zclaim

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/zclaim/zclaim/internal/wait"
)

var ctx = context.Background()

func jobsDue(n int, prefix string, at time.Time) []Job {
	jobs := make([]Job, n)
	for i := range jobs {
		jobs[i] = Job{ID: prefix + strconv.Itoa(i), RunAt: at, Type: "t", Payload: []byte("p" + strconv.Itoa(i))}
	}
	return jobs
}

// 16 goroutines, each with its own connection, race to claim 20,000 due
// jobs in random batch sizes: each id is claimed exactly once, none is
// lost, and tokens are never handed out twice.
func TestClaimConcurrentExactlyOnce(t *testing.T) {
	t.Parallel()
	key := testKey(t)
	b := newBroker(t, BrokerOptions{Key: key, Lease: time.Minute})
	const n, workers = 20000, 16
	must(t, b.Schedule(ctx, jobsDue(n, "job-", time.Now().Add(-time.Second))...))

	var mu sync.Mutex
	seen := make(map[string]int, n)
	tokens := make(map[int64]bool, n)
	errs := make(chan error, workers)
	onOwnConns(t, workers, BrokerOptions{Key: key, Lease: time.Minute}, func(_ int, wb *Broker) {
		for {
			cs, err := wb.Claim(ctx, 1+rand.IntN(200))
			if err != nil {
				errs <- err
				return
			}
			if len(cs) == 0 {
				return
			}
			mu.Lock()
			for _, c := range cs {
				seen[c.ID]++
				if tokens[c.Token] {
					errs <- fmt.Errorf("token %d handed out twice", c.Token)
				}
				tokens[c.Token] = true
				if string(c.Payload) != "p"+strings.TrimPrefix(c.ID, "job-") || c.Type != "t" || c.Attempt != 1 {
					errs <- fmt.Errorf("claim %+v carries the wrong record", c)
				}
			}
			mu.Unlock()
		}
	})
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	eachOnce(t, seen, n, "claimed")
	st, err := b.Stats(ctx)
	must(t, err)
	if st.Scheduled != 0 || st.Inflight != n {
		t.Fatalf("stats %+v, want 0 scheduled and %d in flight", st, n)
	}
}

// Acks racing from many goroutines: each claim acks exactly once; a second
// ack of the same claim is ErrLeaseLost.
func TestAckConcurrent(t *testing.T) {
	t.Parallel()
	key := testKey(t)
	b := newBroker(t, BrokerOptions{Key: key, Lease: time.Minute})
	must(t, b.Schedule(ctx, jobsDue(500, "a", time.Now().Add(-time.Second))...))
	cs, err := b.Claim(ctx, 1000)
	must(t, err)
	var mu sync.Mutex
	ok := map[int64]int{}
	onOwnConns(t, 8, BrokerOptions{Key: key}, func(_ int, wb *Broker) {
		for _, cl := range cs {
			err := wb.Ack(ctx, cl)
			mu.Lock()
			if err == nil {
				ok[cl.Token]++
			} else if !errors.Is(err, ErrLeaseLost) {
				ok[-1]++
			}
			mu.Unlock()
		}
	})
	if len(ok) != len(cs) || ok[-1] != 0 {
		t.Fatalf("acks %d of %d claims, %d unexpected errors", len(ok), len(cs), ok[-1])
	}
	for tok, k := range ok {
		if k != 1 {
			t.Fatalf("token %d acked %d times", tok, k)
		}
	}
	st, _ := b.Stats(ctx)
	if st.Inflight != 0 {
		t.Fatalf("%d still in flight", st.Inflight)
	}
}

// AckMany takes any number of claims in one call: more than Lua's unpack
// can pass to one command (about 8,000) too, all or nothing.
func TestAckManyMoreThanUnpackTakes(t *testing.T) {
	t.Parallel()
	b := newBroker(t, BrokerOptions{Lease: time.Minute})
	const n = 9000
	must(t, b.Schedule(ctx, jobsDue(n, "a", time.Now().Add(-time.Second))...))
	var cs []Claim
	for len(cs) < n {
		got, err := b.Claim(ctx, MaxBatchSize)
		must(t, err)
		if len(got) == 0 {
			t.Fatalf("claimed %d of %d", len(cs), n)
		}
		cs = append(cs, got...)
	}
	must(t, b.Ack(ctx, cs[0]))
	lost, err := b.AckMany(ctx, cs...)
	must(t, err)
	if len(lost) != 1 || lost[0].Token != cs[0].Token {
		t.Fatalf("lost %d claims, want only the one acked before", len(lost))
	}
	if st, _ := b.Stats(ctx); st.Inflight != 0 {
		t.Fatalf("%d still in flight", st.Inflight)
	}
	if n, _ := b.rdb.HLen(ctx, b.keys.runs).Result(); n != 0 {
		t.Fatalf("%d run records left", n)
	}
}

// Nothing due is an empty slice, not an error; a job is never claimed
// before its due time by Redis' clock.
func TestClaimNeverEarly(t *testing.T) {
	t.Parallel()
	b := newBroker(t, BrokerOptions{})
	rdb := b.rdb
	cs, err := b.Claim(ctx, 10)
	if err != nil || len(cs) != 0 {
		t.Fatalf("empty schedule: %v, %v", cs, err)
	}
	due := redisNow(t, rdb).Add(60 * time.Millisecond)
	must(t, b.Schedule(ctx, Job{ID: "soon", RunAt: due}))
	for {
		before := redisNow(t, rdb)
		cs, err := b.Claim(ctx, 10)
		must(t, err)
		if len(cs) == 0 {
			if before.After(due.Add(5 * time.Second)) { // lateness is not what this tests
				t.Fatalf("job due at %v not claimed at %v", due, before)
			}
			time.Sleep(time.Millisecond)
			continue
		}
		claimedAt := cs[0].LeaseUntil.Add(-b.opts.Lease)
		if claimedAt.Before(due.Truncate(time.Millisecond)) {
			t.Fatalf("claimed at %v, due %v: early", claimedAt, due)
		}
		if !cs[0].RunAt.Equal(due.Truncate(time.Millisecond).Add(time.Millisecond)) && !cs[0].RunAt.Equal(due) {
			t.Fatalf("RunAt %v, want %v rounded up to the ms", cs[0].RunAt, due)
		}
		return
	}
}

// Due times beyond what time.UnixNano can hold (after 2262, such as a
// year-9999 "never", or before 1678) keep their place: far-future jobs are
// not due, far-past ones are, in both score units.
func TestScheduleFarTimes(t *testing.T) {
	t.Parallel()
	for _, unit := range []time.Duration{time.Second, time.Millisecond} {
		b := newBroker(t, BrokerOptions{ScoreUnit: unit})
		never := time.Date(9999, 12, 31, 23, 59, 59, 0, time.UTC)
		later := time.Date(2500, 1, 1, 0, 0, 0, 1, time.UTC) // rounds up to the next ms
		past := time.Date(1600, 1, 1, 0, 0, 0, 0, time.UTC)
		must(t, b.Schedule(ctx, Job{ID: "never", RunAt: never}, Job{ID: "later", RunAt: later}, Job{ID: "past", RunAt: past}))
		cs, err := b.Claim(ctx, 10)
		must(t, err)
		if len(cs) != 1 || cs[0].ID != "past" {
			t.Fatalf("%v: claimed %+v, want only the job due in 1600", unit, cs)
		}
		if !cs[0].RunAt.Equal(past) {
			t.Fatalf("%v: RunAt %v, want %v", unit, cs[0].RunAt, past)
		}
		for id, want := range map[string]time.Time{"never": never, "later": later.Truncate(time.Millisecond).Add(time.Millisecond)} {
			score, err := b.rdb.ZScore(ctx, b.keys.schedule, id).Result()
			must(t, err)
			if got := b.scoreTime(strconv.FormatFloat(score, 'f', -1, 64)); !got.Equal(want) {
				t.Fatalf("%v: %s is due %v, want %v", unit, id, got, want)
			}
		}
	}
}

// A lease expires, recovery takes the job back and voids the old token;
// the old holder's Ack, Extend, Retry and Kill all fail with ErrLeaseLost,
// the new holder's succeed. After MaxAttempts expiries the job is dead.
func TestLeaseExpiryRecoverReclaim(t *testing.T) {
	t.Parallel()
	b := newBroker(t, BrokerOptions{Lease: 20 * time.Millisecond, MaxAttempts: 3,
		Backoff: func(int) time.Duration { return 0 }})
	must(t, b.Schedule(ctx, Job{ID: "j", RunAt: time.Now().Add(-time.Second), Type: "email", Payload: []byte("x")}))
	old := claimOne(t, b)
	if old.Attempt != 1 {
		t.Fatalf("attempt %d", old.Attempt)
	}
	time.Sleep(30 * time.Millisecond)
	r, err := b.Recover(ctx)
	must(t, err)
	if r.Requeued != 1 || r.Dead != 0 {
		t.Fatalf("recovered %+v", r)
	}
	cur := claimOne(t, b)
	if cur.Attempt != 2 || cur.Token <= old.Token || cur.Type != "email" || string(cur.Payload) != "x" {
		t.Fatalf("re-claim %+v after %+v", cur, old)
	}
	wantErr(t, b.Ack(ctx, old), ErrLeaseLost)
	_, err = b.Extend(ctx, old, time.Second)
	wantErr(t, err, ErrLeaseLost)
	wantErr(t, b.Retry(ctx, old, time.Time{}), ErrLeaseLost)
	wantErr(t, b.Kill(ctx, old, "x"), ErrLeaseLost)
	cur, err = b.Extend(ctx, cur, time.Minute)
	must(t, err)
	must(t, b.Retry(ctx, cur, time.Now().Add(-time.Second)))
	third := claimOne(t, b)
	if third.Attempt != 3 {
		t.Fatalf("attempt %d", third.Attempt)
	}
	time.Sleep(30 * time.Millisecond)
	r, err = b.Recover(ctx)
	must(t, err)
	if r.Dead != 1 {
		t.Fatalf("recovered %+v, want 1 dead", r)
	}
	wantErr(t, b.Ack(ctx, third), ErrLeaseLost)
	st, err := b.Stats(ctx)
	must(t, err)
	if st.Dead != 1 || st.Scheduled != 0 || st.Inflight != 0 {
		t.Fatalf("stats %+v", st)
	}
	dead, err := listDead(b, 10)
	must(t, err)
	if len(dead) != 1 || dead[0].ID != "j" || dead[0].Reason != "lease expired" || dead[0].Attempt != 3 ||
		dead[0].Type != "email" || dead[0].PayloadSize != 1 || dead[0].Err != nil {
		t.Fatalf("dead %+v", dead)
	}
	// It died whole: revived, it carries its type and payload.
	n, err := b.Revive(ctx, "j")
	if err != nil || n != 1 {
		t.Fatalf("revive: %d %v", n, err)
	}
	if c := claimOne(t, b); c.Type != "email" || string(c.Payload) != "x" {
		t.Fatalf("revived %+v", c)
	}
}

func claimOne(t *testing.T, b *Broker) Claim {
	t.Helper()
	cs, err := b.Claim(ctx, 10)
	must(t, err)
	if len(cs) != 1 {
		t.Fatalf("claimed %d, want 1", len(cs))
	}
	return cs[0]
}

// Retry on the last attempt sends the job to the dead set; Kill does so
// with its reason; Extend moves the lease by Redis' clock.
func TestRetryKillExtend(t *testing.T) {
	t.Parallel()
	b := newBroker(t, BrokerOptions{MaxAttempts: 2, Backoff: func(int) time.Duration { return 0 }})
	must(t, b.Schedule(ctx, Job{ID: "r", RunAt: time.Now()}, Job{ID: "k", RunAt: time.Now()}))
	time.Sleep(2 * time.Millisecond)
	cs, err := b.Claim(ctx, 2)
	must(t, err)
	if len(cs) != 2 {
		t.Fatalf("claimed %d", len(cs))
	}
	byID := map[string]Claim{cs[0].ID: cs[0], cs[1].ID: cs[1]}
	// The longest Duration there is: rounding it up to whole milliseconds
	// must not wrap around to a lease of 1ms.
	ext, err := b.Extend(ctx, byID["r"], math.MaxInt64)
	must(t, err)
	if d := time.Until(ext.LeaseUntil); d < 290*365*24*time.Hour {
		t.Fatalf("lease extended by the largest Duration ends in %v", d)
	}
	ext, err = b.Extend(ctx, byID["r"], time.Hour)
	must(t, err)
	if d := time.Until(ext.LeaseUntil); d < 59*time.Minute {
		t.Fatalf("extended lease ends in %v", d)
	}
	// Two extends in the same millisecond must both succeed.
	_, err = b.Extend(ctx, ext, time.Hour)
	must(t, err)
	must(t, b.Kill(ctx, byID["k"], "bad payload"))
	must(t, b.Retry(ctx, ext, time.Time{}))
	again := claimOne(t, b)
	if again.ID != "r" || again.Attempt != 2 {
		t.Fatalf("%+v", again)
	}
	must(t, b.Retry(ctx, again, time.Time{}))
	dead, err := listDead(b, 10)
	must(t, err)
	reasons := map[string]string{}
	for _, d := range dead {
		reasons[d.ID] = d.Reason
	}
	if reasons["k"] != "bad payload" || reasons["r"] != "attempts exhausted" {
		t.Fatalf("dead %+v", dead)
	}
	_, err = b.Extend(ctx, again, time.Second)
	wantErr(t, err, ErrLeaseLost)
}

// Scheduling an id while a run of it is in flight adds a new run and
// leaves the first alone: the first run's Ack does not delete the second's
// payload, and the second is claimed with its own payload and token.
func TestScheduleIDInFlight(t *testing.T) {
	t.Parallel()
	b := newBroker(t, BrokerOptions{})
	must(t, b.Schedule(ctx, Job{ID: "o", RunAt: time.Now().Add(-time.Second), Payload: []byte("first")}))
	first := claimOne(t, b)
	must(t, b.Schedule(ctx, Job{ID: "o", RunAt: time.Now().Add(-time.Second), Payload: []byte("second")}))
	must(t, b.Ack(ctx, first))
	second := claimOne(t, b)
	if string(second.Payload) != "second" || second.Attempt != 1 || second.Token <= first.Token {
		t.Fatalf("second run %+v", second)
	}
	// An expired first run that comes back while a newer run is scheduled
	// does not replace it.
	must(t, b.Schedule(ctx, Job{ID: "o", RunAt: time.Now().Add(time.Hour), Payload: []byte("third")}))
	time.Sleep(60 * time.Millisecond)
	r, err := b.Recover(ctx)
	must(t, err)
	if r.Requeued != 1 {
		t.Fatalf("%+v", r)
	}
	st, _ := b.Stats(ctx)
	if st.Scheduled != 1 || st.Next.Before(time.Now().Add(50*time.Minute)) {
		t.Fatalf("stats %+v: the newer entry was replaced", st)
	}
}

// Revive brings dead jobs back, due at once with their payload and no
// attempts spent; an id scheduled meanwhile keeps its newer entry;
// DeleteDead forgets dead jobs. Bad input changes nothing.
func TestReviveDeleteDead(t *testing.T) {
	t.Parallel()
	b := newBroker(t, BrokerOptions{Lease: time.Minute})
	past := time.Now().Add(-time.Second)
	must(t, b.Schedule(ctx, Job{ID: "a", RunAt: past, Type: "email", Queue: "q", Payload: []byte("x")},
		Job{ID: "b", RunAt: past}, Job{ID: "c", RunAt: past, Type: "t"}))
	cs, err := b.Claim(ctx, 10)
	must(t, err)
	for _, c := range cs {
		must(t, b.Kill(ctx, c, "killed by test"))
	}
	later := time.Now().Add(time.Hour)
	must(t, b.Schedule(ctx, Job{ID: "c", RunAt: later, Type: "newer"})) // c is scheduled again meanwhile

	for _, bad := range [][]string{{"a", ""}, {strings.Repeat("k", MaxIDLen+1)}} {
		_, err := b.Revive(ctx, bad...)
		if !errors.Is(err, ErrEmptyID) && !errors.Is(err, ErrIDTooLong) {
			t.Fatalf("revive %q: %v", bad, err)
		}
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	_, err = b.DeleteDead(cctx, "a")
	wantErr(t, err, context.Canceled)
	if st, _ := b.Stats(ctx); st.Dead != 3 {
		t.Fatalf("bad input changed the dead set: %+v", st)
	}

	before := redisNow(t, b.rdb)
	n, err := b.Revive(ctx, "a", "c", "nope")
	must(t, err)
	if n != 2 {
		t.Fatalf("revived %d, want 2", n)
	}
	cs, err = b.Claim(ctx, 10)
	must(t, err)
	if len(cs) != 1 || cs[0].ID != "a" || cs[0].Attempt != 1 || cs[0].Type != "email" || cs[0].Queue != "q" ||
		string(cs[0].Payload) != "x" || cs[0].RunAt.Before(before.Truncate(time.Millisecond)) {
		t.Fatalf("claimed %+v", cs)
	}
	if score, _ := b.rdb.ZScore(ctx, b.keys.schedule, "c").Result(); b.scoreTime(strconv.FormatFloat(score, 'f', -1, 64)).Before(later.Add(-time.Second)) {
		t.Fatal("reviving c moved its newer scheduled entry")
	}
	if rec, _ := b.rdb.HGet(ctx, b.keys.pending, "c").Result(); !strings.Contains(rec, "newer") {
		t.Fatalf("reviving c replaced its newer record with %q", rec)
	}

	n, err = b.DeleteDead(ctx, "b", "a")
	must(t, err)
	if n != 1 {
		t.Fatalf("deleted %d, want 1", n)
	}
	dead, err := listDead(b, 10)
	must(t, err)
	st, err := b.Stats(ctx)
	must(t, err)
	if len(dead) != 0 || st.Dead != 0 {
		t.Fatalf("dead %+v, stats %+v", dead, st)
	}
	if n, _ := b.rdb.HLen(ctx, b.keys.deadInfo).Result(); n != 0 {
		t.Fatalf("%d dead infos left", n)
	}

	must(t, b.rdb.Set(ctx, b.keys.dead, "oops", 0).Err())
	_, err = b.Revive(ctx, "a")
	wantErr(t, err, ErrWrongType)
}

// Many goroutines, each on its own connection, revive the same dead jobs:
// each comes back once.
func TestReviveConcurrent(t *testing.T) {
	t.Parallel()
	key := testKey(t)
	b := newBroker(t, BrokerOptions{Key: key, Lease: time.Minute})
	const n = 200
	ids := killAll(t, b, n, "r")
	var revived atomic.Int64
	onOwnConns(t, 8, BrokerOptions{Key: key}, func(_ int, wb *Broker) {
		for i := 0; i < len(ids); i += 10 {
			k, err := wb.Revive(ctx, ids[i:min(i+10, len(ids))]...)
			if err != nil {
				t.Error(err)
				return
			}
			revived.Add(int64(k))
		}
	})
	st, err := b.Stats(ctx)
	must(t, err)
	if revived.Load() != n || st.Scheduled != n || st.Dead != 0 {
		t.Fatalf("revived %d of %d; stats %+v", revived.Load(), n, st)
	}
}

// killAll schedules n due jobs named prefix0.., claims and kills them all,
// and returns their ids in order.
func killAll(t *testing.T, b *Broker, n int, prefix string) []string {
	t.Helper()
	must(t, b.Schedule(ctx, jobsDue(n, prefix, time.Now().Add(-time.Second))...))
	cs, err := b.Claim(ctx, n)
	must(t, err)
	if len(cs) != n {
		t.Fatalf("claimed %d of %d", len(cs), n)
	}
	ids := make([]string, n)
	for i := range ids {
		ids[i] = prefix + strconv.Itoa(i)
	}
	for _, c := range cs {
		must(t, b.Kill(ctx, c, "killed by test"))
	}
	return ids
}

// deadIDs lists the dead set, and fails the test unless the dead info
// hash holds exactly the same ids.
func deadIDs(t *testing.T, b *Broker) []string {
	t.Helper()
	ids, err := b.rdb.ZRange(ctx, b.keys.dead, 0, -1).Result()
	must(t, err)
	info, err := b.rdb.HKeys(ctx, b.keys.deadInfo).Result()
	must(t, err)
	slices.Sort(ids)
	slices.Sort(info)
	if !slices.Equal(ids, info) {
		t.Fatalf("dead set %v, dead info %v", ids, info)
	}
	return ids
}

// The recovery pass trims the dead set as asynq bounds its archive: deaths
// older than DeadRetention, then the oldest beyond DeadMax, at most
// BatchSize a pass, each with its info.
func TestDeadTrim(t *testing.T) {
	t.Parallel()
	key := testKey(t)
	b := newBroker(t, BrokerOptions{Key: key, Lease: time.Minute, BatchSize: 2})
	ids := killAll(t, b, 12, "d")
	// d<i> died i+1 hours ago; d9, d10 and d11 more than 90 days ago.
	now := redisNow(t, b.rdb)
	for i, id := range ids {
		age := time.Duration(i+1) * time.Hour
		if i >= 9 {
			age += DefaultDeadRetention
		}
		must(t, b.rdb.ZAddXX(ctx, b.keys.dead, redis.Z{Score: float64(now.Add(-age).UnixMilli()), Member: id}).Err())
	}
	for _, want := range []int{2, 1, 0} { // BatchSize 2 a pass
		r, err := b.Recover(ctx)
		must(t, err)
		if r.Trimmed != want {
			t.Fatalf("trimmed %d, want %d", r.Trimmed, want)
		}
	}
	if got := deadIDs(t, b); !slices.Equal(got, ids[:9]) {
		t.Fatalf("past DeadRetention: left %v", got)
	}

	// Unlimited keeps all, however old.
	off := newBroker(t, BrokerOptions{Key: key, DeadMax: -1, DeadRetention: -1})
	must(t, b.rdb.ZAddXX(ctx, b.keys.dead, redis.Z{Score: 1, Member: "d0"}).Err())
	if r, err := off.Recover(ctx); err != nil || r.Trimmed != 0 {
		t.Fatalf("unlimited trimmed %d (%v)", r.Trimmed, err)
	}

	// DeadMax 4, by RunRecovery: its passes follow one another at once
	// while each trims a full batch (3, 2), not an interval apart. d0, now
	// the oldest death, goes first.
	small := newBroker(t, BrokerOptions{Key: key, DeadMax: 4, DeadRetention: -1, BatchSize: 3})
	rctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); small.RunRecovery(rctx, time.Hour) }()
	waitFor(t, 20*time.Second, "the dead set down to DeadMax", func() bool {
		n, _ := b.rdb.ZCard(ctx, b.keys.dead).Result()
		return n == 4
	})
	stop()
	wait.Recv(t, done, 10*time.Second, "RunRecovery to return once its context was cancelled")
	if got := deadIDs(t, b); !slices.Equal(got, []string{"d1", "d2", "d3", "d4"}) {
		t.Fatalf("beyond DeadMax: left %v", got)
	}

	_, err := NewBroker(newClient(t), BrokerOptions{Key: key, DeadRetention: time.Microsecond})
	wantErr(t, err, ErrInvalidOptions)
}

// Trimming races revivals of the same dead jobs on 8 connections: each
// job is revived once, trimmed or still dead, never two of these, and no
// dead info outlives its job.
func TestDeadTrimConcurrent(t *testing.T) {
	t.Parallel()
	key := testKey(t)
	b := newBroker(t, BrokerOptions{Key: key, Lease: time.Minute})
	const n, keep = 300, 50
	ids := killAll(t, b, n, "t")
	var revived, trimmed atomic.Int64
	onOwnConns(t, 8, BrokerOptions{Key: key, DeadMax: keep, BatchSize: 7}, func(w int, wb *Broker) {
		for i := w * 13 % n; i < n; i += 17 {
			var err error
			if w%2 == 0 {
				var k int
				k, err = wb.Revive(ctx, ids[i:min(i+5, n)]...)
				revived.Add(int64(k))
			} else {
				var r Recovered
				r, err = wb.Recover(ctx)
				trimmed.Add(int64(r.Trimmed))
			}
			if err != nil {
				t.Error(err)
				return
			}
		}
	})
	last := newBroker(t, BrokerOptions{Key: key, DeadMax: keep})
	for {
		rec, err := last.Recover(ctx)
		must(t, err)
		trimmed.Add(int64(rec.Trimmed))
		if rec.Trimmed == 0 {
			break
		}
	}
	dead := deadIDs(t, b)
	st, err := b.Stats(ctx)
	must(t, err)
	if len(dead) > keep || int64(len(dead))+revived.Load()+trimmed.Load() != n || st.Scheduled != revived.Load() {
		t.Fatalf("%d dead (keep %d), %d revived, %d trimmed, of %d; stats %+v", len(dead), keep, revived.Load(), trimmed.Load(), n, st)
	}
	for _, id := range dead {
		if _, err := b.rdb.ZScore(ctx, key, id).Result(); err == nil {
			t.Fatalf("%s is both dead and scheduled", id)
		}
	}
}

// Cancel removes a scheduled job and its payload, and reports whether it was there.
func TestCancel(t *testing.T) {
	t.Parallel()
	b := newBroker(t, BrokerOptions{})
	must(t, b.Schedule(ctx, Job{ID: "c", RunAt: time.Now(), Payload: []byte("x")}))
	ok, err := b.Cancel(ctx, "c")
	if err != nil || !ok {
		t.Fatalf("cancel: %v %v", ok, err)
	}
	ok, err = b.Cancel(ctx, "c")
	if err != nil || ok {
		t.Fatalf("second cancel: %v %v", ok, err)
	}
	n, _ := b.rdb.HLen(ctx, b.keys.pending).Result()
	if n != 0 {
		t.Fatalf("%d payloads left", n)
	}
}

// A set written by plain ZADD, scored in seconds (with and without a
// fraction) or in milliseconds, is adopted as it is.
func TestAdoptPlainZADD(t *testing.T) {
	t.Parallel()
	for _, unit := range []time.Duration{time.Second, time.Millisecond} {
		t.Run(unit.String(), func(t *testing.T) {
			key := plainKey(t)
			rdb := newClient(t)
			now := redisNow(t, rdb)
			score := func(at time.Time) float64 {
				if unit == time.Millisecond {
					return float64(at.UnixMilli())
				}
				return float64(at.UnixMilli()) / 1000
			}
			must(t, rdb.ZAdd(ctx, key,
				redis.Z{Score: float64(now.Add(-time.Hour).Unix()), Member: "order-1"},
				redis.Z{Score: score(now.Add(-time.Second)), Member: "order-2"},
				redis.Z{Score: score(now.Add(time.Hour)), Member: "order-3"},
			).Err())
			b, err := NewBroker(rdb, BrokerOptions{Key: key, ScoreUnit: unit, Lease: 30 * time.Millisecond,
				Backoff: func(int) time.Duration { return 0 }})
			must(t, err)
			cs, err := b.Claim(ctx, 10)
			must(t, err)
			if len(cs) != 2 || cs[0].ID != "order-1" || cs[1].ID != "order-2" {
				t.Fatalf("claims %+v", cs)
			}
			for _, c := range cs {
				if c.Type != "" || c.Payload != nil || c.Attempt != 1 || c.RunAt.After(now) {
					t.Fatalf("claim %+v", c)
				}
			}
			if d := cs[1].RunAt.Sub(now.Add(-time.Second).Truncate(time.Millisecond)); d < 0 || d > time.Millisecond {
				t.Fatalf("RunAt %v, want %v", cs[1].RunAt, now.Add(-time.Second))
			}
			must(t, b.Ack(ctx, cs[0]))
			time.Sleep(40 * time.Millisecond)
			r, err := b.Recover(ctx)
			must(t, err)
			if r.Requeued != 1 {
				t.Fatalf("%+v", r)
			}
			// The producer's own key still holds the requeued id, scored in its unit.
			sc, err := rdb.ZScore(ctx, key, "order-2").Result()
			must(t, err)
			if sc > score(redisNow(t, rdb))+1 || sc < score(now) {
				t.Fatalf("requeued score %v out of range", sc)
			}
			again := claimOne(t, b)
			if again.ID != "order-2" || again.Attempt != 2 {
				t.Fatalf("%+v", again)
			}
		})
	}
}

// Bad input gets a clear zclaim error and writes nothing.
func TestBadInput(t *testing.T) {
	t.Parallel()
	b := newBroker(t, BrokerOptions{})
	rdb := b.rdb
	now := time.Now()
	for _, tc := range []struct {
		name string
		job  Job
		want error
	}{
		{"empty id", Job{RunAt: now}, ErrEmptyID},
		{"long id", Job{ID: strings.Repeat("x", MaxIDLen+1), RunAt: now}, ErrIDTooLong},
		{"zero RunAt", Job{ID: "z"}, ErrNoRunAt},
		{"big payload", Job{ID: "p", RunAt: now, Payload: make([]byte, MaxPayloadLen+1)}, ErrPayloadTooLarge},
	} {
		err := b.Schedule(ctx, Job{ID: "good", RunAt: now}, tc.job)
		wantErr(t, err, tc.want)
		wantErr(t, err, ErrInvalidJob)
		var je *JobError
		if !errors.As(err, &je) || je.Index != 1 || !strings.HasPrefix(err.Error(), "zclaim: ") {
			t.Fatalf("%s: %v", tc.name, err)
		}
	}
	if n, _ := rdb.Exists(ctx, b.keys.schedule, b.keys.pending).Result(); n != 0 {
		t.Fatal("a refused batch wrote something")
	}
	for _, max := range []int{0, -1} {
		_, err := b.Claim(ctx, max)
		wantErr(t, err, ErrInvalidArgument)
	}
	// max above MaxBatchSize is capped.
	must(t, b.Schedule(ctx, jobsDue(MaxBatchSize+5, "cap", now.Add(-time.Second))...))
	cs, err := b.Claim(ctx, 5000)
	must(t, err)
	if len(cs) != MaxBatchSize {
		t.Fatalf("claimed %d, want the cap %d", len(cs), MaxBatchSize)
	}
	_, err = b.Extend(ctx, cs[0], 0)
	wantErr(t, err, ErrInvalidArgument)
	wantErr(t, b.Ack(ctx, Claim{Job: Job{ID: "x"}}), ErrInvalidArgument)
	_, err = b.Cancel(ctx, "")
	wantErr(t, err, ErrEmptyID)

	cctx, cancel := context.WithCancel(ctx)
	cancel()
	before, _ := b.Stats(ctx)
	wantErr(t, b.Schedule(cctx, Job{ID: "c", RunAt: now}), context.Canceled)
	_, err = b.Claim(cctx, 1)
	wantErr(t, err, context.Canceled)
	wantErr(t, b.Ack(cctx, cs[0]), context.Canceled)
	_, err = b.Recover(cctx)
	wantErr(t, err, context.Canceled)
	after, _ := b.Stats(ctx)
	if before.Scheduled != after.Scheduled || before.Inflight != after.Inflight {
		t.Fatalf("a cancelled context changed something: %+v -> %+v", before, after)
	}

	for _, o := range []BrokerOptions{
		{BatchSize: MaxBatchSize + 1}, {BatchSize: -1}, {ScoreUnit: time.Minute},
		{Lease: -time.Second}, {MaxAttempts: -1},
	} {
		_, err := NewBroker(rdb, o)
		wantErr(t, err, ErrInvalidOptions)
	}
	_, err = NewBroker(nil, BrokerOptions{})
	wantErr(t, err, ErrInvalidOptions)
}

// A key of the wrong Redis type is named in the error, and nothing is written.
func TestWrongType(t *testing.T) {
	t.Parallel()
	b := newBroker(t, BrokerOptions{})
	rdb := b.rdb
	must(t, rdb.Set(ctx, b.keys.schedule, "oops", 0).Err())
	err := b.Schedule(ctx, Job{ID: "x", RunAt: time.Now(), Payload: []byte("p")})
	wantErr(t, err, ErrWrongType)
	var wt *WrongTypeError
	if !errors.As(err, &wt) || wt.Key != b.keys.schedule || wt.Got != "string" || wt.Want != "zset" ||
		!strings.Contains(err.Error(), b.keys.schedule) {
		t.Fatalf("%v", err)
	}
	if n, _ := rdb.Exists(ctx, b.keys.pending).Result(); n != 0 {
		t.Fatal("wrote a payload beside a wrong-typed schedule")
	}
	_, err = b.Claim(ctx, 1)
	wantErr(t, err, ErrWrongType)
	_, err = b.Stats(ctx)
	wantErr(t, err, ErrWrongType)
	must(t, rdb.Del(ctx, b.keys.schedule).Err())

	must(t, b.Schedule(ctx, Job{ID: "y", RunAt: time.Now().Add(-time.Second)}))
	must(t, rdb.HSet(ctx, b.keys.tokens, "f", "v").Err())
	_, err = b.Claim(ctx, 1)
	if !errors.As(err, &wt) || wt.Key != b.keys.tokens {
		t.Fatalf("%v", err)
	}
	if n, _ := rdb.ZCard(ctx, b.keys.schedule).Result(); n != 1 {
		t.Fatal("a failed claim removed the job")
	}
	// A token counter no larger exact token can follow is corrupt, in every
	// claim mode, and nothing moves.
	for _, v := range []string{"9007199254740990", "1e400", "nan"} {
		must(t, rdb.Set(ctx, b.keys.tokens, v, 0).Err())
		for _, mode := range []claimMode{leasePerJob, leaseBatch, leaseBatchIDs} {
			_, err = b.claim(ctx, b.shards[0], 1, mode)
			wantErr(t, err, ErrCorrupt)
			if !strings.Contains(err.Error(), b.keys.tokens) {
				t.Fatalf("the error does not name the counter: %v", err)
			}
		}
		if n, _ := rdb.ZCard(ctx, b.keys.schedule).Result(); n != 1 {
			t.Fatal("a failed claim removed the job")
		}
		if got, _ := rdb.Get(ctx, b.keys.tokens).Result(); got != v {
			t.Fatalf("counter %q became %q", v, got)
		}
	}
}

// Derived keys share the schedule key's cluster slot, with or without a
// hash tag of its own; a key that cannot is refused on a cluster client.
func TestClusterKeys(t *testing.T) {
	t.Parallel()
	for _, key := range []string{"delay:jobs", "zclaim:{orders}", DefaultKey, "a{b"} {
		k, err := deriveKeys(key, true)
		must(t, err)
		for _, d := range []string{k.inflight, k.tokens, k.pending, k.runs, k.dead, k.deadInfo} {
			if slot(d) != slot(key) {
				t.Fatalf("%q and %q in different slots", key, d)
			}
		}
	}
	if slot("{user1000}.following") != slot("{user1000}.followers") || slot("123456789") != 12739 {
		t.Fatal("Slot disagrees with Redis Cluster's spec")
	}
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{testAddr}})
	defer cc.Close()
	for _, key := range []string{"x{}y", "}x{"} {
		_, err := NewBroker(cc, BrokerOptions{Key: key})
		wantErr(t, err, ErrInvalidOptions)
		if !strings.Contains(err.Error(), "hash tag") {
			t.Fatalf("error does not say how to fix it: %v", err)
		}
	}
	_, err := NewBroker(cc, BrokerOptions{Key: "delay:jobs"})
	must(t, err)
}

// A record that cannot be decoded sends the job to the dead set with a
// reason, instead of handing out a half-read job.
func TestCorruptRecord(t *testing.T) {
	t.Parallel()
	b := newBroker(t, BrokerOptions{})
	must(t, b.Schedule(ctx, Job{ID: "bad", RunAt: time.Now().Add(-time.Second)}, Job{ID: "good", RunAt: time.Now().Add(-time.Second)}))
	must(t, b.rdb.HSet(ctx, b.keys.pending, "bad", "0:9zz").Err())
	cs, err := b.Claim(ctx, 10)
	must(t, err)
	if len(cs) != 1 || cs[0].ID != "good" {
		t.Fatalf("%+v", cs)
	}
	dead, err := listDead(b, 10)
	must(t, err)
	if len(dead) != 1 || !strings.HasPrefix(dead[0].Reason, "corrupt record") {
		t.Fatalf("%+v", dead)
	}
}

// Errors name the operation once and say "zclaim:" once, and still match
// with errors.Is.
func TestErrorsSayItOnce(t *testing.T) {
	t.Parallel()
	b := newBroker(t, BrokerOptions{})
	_, err := b.Cancel(ctx, "")
	if err == nil || err.Error() != "zclaim: cancel: empty id" || !errors.Is(err, ErrEmptyID) {
		t.Errorf("Cancel(\"\"): %v", err)
	}
	_, err = b.Claim(ctx, 0)
	if err == nil || err.Error() != "zclaim: claim: invalid argument: max must be positive, not 0" || !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("Claim(0): %v", err)
	}
	must(t, b.Schedule(ctx, Job{ID: "order-731", RunAt: time.Now().Add(-time.Second)}))
	cs, err := b.Claim(ctx, 1)
	must(t, err)
	must(t, b.Ack(ctx, cs[0]))
	err = b.Ack(ctx, cs[0])
	if err == nil || err.Error() != "zclaim: ack order-731: lease lost" || !errors.Is(err, ErrLeaseLost) {
		t.Errorf("a second Ack: %v", err)
	}
	for _, e := range []error{err} {
		if strings.Count(e.Error(), "zclaim:") != 1 {
			t.Errorf("%q says zclaim more than once", e)
		}
	}
}

// claimByID claims up to 10 due jobs of b's first shard in mode, and
// fails t unless they are want jobs of distinct ids.
func claimByID(t *testing.T, b *Broker, mode claimMode, want int) map[string]Claim {
	t.Helper()
	res, err := b.claim(ctx, b.shards[0], 10, mode)
	must(t, err)
	got := map[string]Claim{}
	for _, c := range res.claims {
		got[c.ID] = c
	}
	if len(got) != want || len(res.claims) != want {
		t.Fatalf("claimed %+v, want %d jobs", res.claims, want)
	}
	return got
}

// A claim of jobs with records reads their scores only where a record
// does not give one: a first attempt's RunAt is its record's due; a
// retried job's, a plain member's and a job's run now are their scores,
// in one claim, per job and as a batch that reads due times.
func TestClaimRunAtFromRecords(t *testing.T) {
	t.Parallel()
	for name, mode := range map[string]claimMode{"per job": leasePerJob, "batch": leaseBatch} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			rdb := newClient(t)
			b := newBroker(t, BrokerOptions{Lease: time.Minute})
			now, err := rdb.Time(ctx).Result()
			must(t, err)
			typed := now.Add(-3 * time.Second).Truncate(time.Millisecond)
			must(t, b.Schedule(ctx, Job{ID: "typed", RunAt: typed, Type: "t", Payload: []byte("p")},
				Job{ID: "retried", RunAt: typed.Add(-time.Second), Type: "t"}))
			// The retried job: claimed once, retried a moment ago (its
			// score moves, its record says attempt 1).
			cs, err := b.Claim(ctx, 1)
			must(t, err)
			if len(cs) != 1 || cs[0].ID != "retried" {
				t.Fatalf("first claim %+v", cs)
			}
			retryAt := now.Add(-500 * time.Millisecond).Truncate(time.Millisecond)
			must(t, b.Retry(ctx, cs[0], retryAt))
			plain := now.Add(-2 * time.Second).Truncate(time.Millisecond)
			must(t, rdb.ZAdd(ctx, b.Key(), redis.Z{Score: float64(plain.UnixMilli()) / 1000, Member: "plain"}).Err())
			// A job due in an hour, run now: its occurrence stays, its score moves.
			later := now.Add(time.Hour).Truncate(time.Millisecond)
			must(t, b.Schedule(ctx, Job{ID: "moved", RunAt: later, Type: "t"}))
			before := redisNow(t, rdb)
			_, err = b.RunNow(ctx, "moved")
			must(t, err)
			got := claimByID(t, b, mode, 4)
			if c := got["typed"]; !c.RunAt.Equal(typed) || !c.Due.Equal(typed) || c.Attempt != 1 || string(c.Payload) != "p" {
				t.Errorf("typed: RunAt %v Due %v attempt %d payload %q, want %v", c.RunAt, c.Due, c.Attempt, c.Payload, typed)
			}
			if c := got["retried"]; c.Attempt != 2 || !c.Due.Equal(typed.Add(-time.Second)) || !c.RunAt.Equal(retryAt) {
				t.Errorf("retried: RunAt %v Due %v attempt %d; want %v, %v, 2", c.RunAt, c.Due, c.Attempt, retryAt, typed.Add(-time.Second))
			}
			if c := got["plain"]; !c.RunAt.Equal(plain) || !c.Due.Equal(plain) {
				t.Errorf("plain: RunAt %v Due %v, want %v", c.RunAt, c.Due, plain)
			}
			if c := got["moved"]; !c.Due.Equal(later) || c.RunAt.Before(before.Truncate(time.Millisecond)) || c.RunAt.After(later.Add(-time.Minute)) {
				t.Errorf("moved: RunAt %v Due %v; want RunAt the time of RunNow (%v), Due %v", c.RunAt, c.Due, before, later)
			}
		})
	}
}
