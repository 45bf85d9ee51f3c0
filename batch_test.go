package zclaim

import (
	"errors"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// A batch claim (the dispatcher's) is one lease: settling it finishes its
// jobs but those given back or sent to the dead set, each with its record.
func TestBatchFinish(t *testing.T) {
	t.Parallel()
	b := newBroker(t, BrokerOptions{Lease: time.Minute, MaxAttempts: 2})
	past := time.Now().Add(-time.Second)
	must(t, b.Schedule(ctx, jobsDue(4, "job-", past)...))
	must(t, b.rdb.ZAdd(ctx, b.keys.schedule, redis.Z{Score: 1, Member: "bare"}).Err()) // no record

	res, err := b.claim(ctx, b.shards[0], 10, leaseBatch)
	must(t, err)
	if len(res.claims) != 5 || res.lease.n != 5 || res.lease.first != res.claims[0].Token {
		t.Fatalf("claimed %d, lease %+v", len(res.claims), res.lease)
	}
	place := map[string]int{}
	for k, c := range res.claims {
		place[c.ID] = res.index[k]
		if c.Attempt != 1 || c.Token != res.lease.first+int64(res.index[k]-1) {
			t.Fatalf("claim %+v at %d", c, res.index[k])
		}
	}
	if n, _ := b.rdb.ZCard(ctx, b.keys.inflight).Result(); n != 0 {
		t.Fatalf("a batch claim wrote %d in-flight members", n)
	}
	st, err := b.Stats(ctx)
	must(t, err)
	if st.Inflight != 5 || st.Scheduled != 0 {
		t.Fatalf("stats %+v", st)
	}
	// A job of a batch has no lease of its own to settle.
	wantErr(t, b.Ack(ctx, res.claims[0]), ErrLeaseLost)

	end := batchEnd{lease: res.lease,
		retry: map[int]time.Duration{place["job-1"]: 0, place["bare"]: 0},
		dead:  map[int]string{place["job-2"]: "no task type"}}
	lost, err := b.finishBatches(ctx, end)
	must(t, err)
	if len(lost) != 0 {
		t.Fatalf("lost %v", lost)
	}
	lost, err = b.finishBatches(ctx, end) // settled already
	must(t, err)
	if len(lost) != 1 {
		t.Fatalf("a second finish was not refused: %v", lost)
	}

	again, err := b.Claim(ctx, 10)
	must(t, err)
	if len(again) != 2 {
		t.Fatalf("re-claimed %+v", again)
	}
	for _, c := range again {
		switch {
		case c.ID == "job-1" && c.Attempt == 2 && string(c.Payload) == "p1" && c.Type == "t":
		case c.ID == "bare" && c.Attempt == 2:
		default:
			t.Fatalf("re-claim %+v", c)
		}
	}
	dead, err := listDead(b, 10)
	must(t, err)
	if len(dead) != 1 || dead[0].ID != "job-2" || dead[0].Reason != "no task type" || dead[0].PayloadSize != 2 || dead[0].Attempt != 1 {
		t.Fatalf("dead %+v", dead)
	}
	_, err = b.AckMany(ctx, again...)
	must(t, err)
	if n, _ := b.rdb.HGet(ctx, b.keys.runs, "batched").Int(); n != 0 {
		t.Fatalf("%d jobs still counted in batch leases", n)
	}
	if n, _ := b.rdb.HLen(ctx, b.keys.runs).Result(); n != 0 {
		t.Fatalf("%d run records left", n)
	}
}

// An expired batch lease comes back whole through recovery, each job with
// its record and one more attempt; a job on its last attempt goes to the
// dead set; an id scheduled again meanwhile keeps its newer entry. The old
// holder's finish then changes nothing.
func TestBatchLeaseRecovered(t *testing.T) {
	t.Parallel()
	b := newBroker(t, BrokerOptions{Lease: 20 * time.Millisecond, MaxAttempts: 2,
		Backoff: func(int) time.Duration { return 0 }})
	past := time.Now().Add(-time.Second)
	must(t, b.Schedule(ctx, jobsDue(3, "job-", past)...))
	res, err := b.claim(ctx, b.shards[0], 10, leaseBatch)
	must(t, err)
	must(t, b.Schedule(ctx, Job{ID: "job-0", RunAt: past, Payload: []byte("newer")}))
	time.Sleep(30 * time.Millisecond)
	st, err := b.Stats(ctx)
	must(t, err)
	if st.Inflight != 3 || st.Expired != 3 {
		t.Fatalf("stats %+v", st)
	}
	r, err := b.Recover(ctx)
	must(t, err)
	if r.Requeued != 3 || r.Dead != 0 || r.scanned != 3 {
		t.Fatalf("recovered %+v", r)
	}
	lost, err := b.finishBatches(ctx, batchEnd{lease: res.lease})
	must(t, err)
	if len(lost) != 1 {
		t.Fatal("the old holder's finish was not refused")
	}
	again, err := b.claim(ctx, b.shards[0], 10, leaseBatch)
	must(t, err)
	got := map[string]Claim{}
	for _, c := range again.claims {
		got[c.ID] = c
	}
	if c := got["job-0"]; string(c.Payload) != "newer" || c.Attempt != 1 {
		t.Fatalf("job-0 %+v: the newer entry should stand", c)
	}
	if c := got["job-1"]; string(c.Payload) != "p1" || c.Attempt != 2 {
		t.Fatalf("job-1 %+v", c)
	}
	time.Sleep(30 * time.Millisecond)
	r, err = b.Recover(ctx)
	must(t, err)
	if r.Dead != 2 || r.Requeued != 1 {
		t.Fatalf("recovered %+v, want job-1 and job-2 dead", r)
	}
	st, err = b.Stats(ctx)
	must(t, err)
	if st.Inflight != 0 || st.Dead != 2 || st.Scheduled != 1 {
		t.Fatalf("stats %+v", st)
	}
}

// A key of the wrong type fails a claim of either kind with an error that
// names it, and changes nothing; keys a kind of claim does not touch do not
// fail it.
func TestBatchClaimWrongType(t *testing.T) {
	t.Parallel()
	for _, mode := range []claimMode{leasePerJob, leaseBatch, leaseBatchIDs} {
		batch := mode != leasePerJob
		for _, which := range []string{"inflight", "tokens", "jobs", "runs", "batches"} {
			b := newBroker(t, BrokerOptions{})
			must(t, b.Schedule(ctx, jobsDue(2, "job-", time.Now().Add(-time.Second))...))
			bad := map[string]string{"inflight": b.keys.inflight, "tokens": b.keys.tokens, "jobs": b.keys.pending,
				"runs": b.keys.runs, "batches": b.keys.batches}[which]
			must(t, b.rdb.Del(ctx, bad).Err())
			must(t, b.rdb.SAdd(ctx, bad, "x").Err())
			res, err := b.claim(ctx, b.shards[0], 10, mode)
			untouched := (batch && which == "inflight") || (!batch && which == "batches")
			if untouched {
				must(t, err)
				if len(res.claims) != 2 {
					t.Fatalf("batch %v, %s a set: claimed %d", batch, which, len(res.claims))
				}
				continue
			}
			var wt *WrongTypeError
			if !errors.As(err, &wt) || wt.Key != bad || wt.Got != "set" {
				t.Fatalf("batch %v, %s a set: %v", batch, which, err)
			}
			if n, _ := b.rdb.ZCard(ctx, b.keys.schedule).Result(); n != 2 {
				t.Fatalf("batch %v, %s a set: a failed claim removed jobs", batch, which)
			}
			if which != "jobs" {
				if n, _ := b.rdb.HLen(ctx, b.keys.pending).Result(); n != 2 {
					t.Fatalf("batch %v, %s a set: a failed claim took records", batch, which)
				}
			}
		}
	}
}

// A settle of batch leases fails on a key of the wrong type that it would
// write, with an error that names it, and changes nothing; one whose jobs
// are all done writes only the batches and run records, so that the
// schedule, pending records or dead set of the wrong type do not fail it.
func TestFinishBatchesWrongType(t *testing.T) {
	t.Parallel()
	for _, which := range []string{"schedule", "jobs", "runs", "batches", "dead", "deadinfo"} {
		for _, retry := range []bool{false, true} {
			b := newBroker(t, BrokerOptions{})
			must(t, b.Schedule(ctx, jobsDue(3, "job-", time.Now().Add(-time.Second))...))
			res, err := b.claim(ctx, b.shards[0], 10, leaseBatchIDs)
			must(t, err)
			if res.lease.n != 3 {
				t.Fatalf("claimed %d", res.lease.n)
			}
			k := b.keys
			bad := map[string]string{"schedule": k.schedule, "jobs": k.pending, "runs": k.runs,
				"batches": k.batches, "dead": k.dead, "deadinfo": k.deadInfo}[which]
			must(t, b.rdb.Del(ctx, bad).Err())
			must(t, b.rdb.SAdd(ctx, bad, "x").Err())
			end := batchEnd{lease: res.lease}
			if retry {
				end.retry = map[int]time.Duration{2: 0}
			}
			lost, err := b.finishBatches(ctx, end)
			if !retry && which != "runs" && which != "batches" {
				if err != nil || len(lost) != 0 {
					t.Fatalf("all done, %s a set: lost %v, %v", which, lost, err)
				}
				if n, _ := b.rdb.ZCard(ctx, k.batches).Result(); n != 0 {
					t.Fatalf("all done, %s a set: the lease is still held", which)
				}
				continue
			}
			var wt *WrongTypeError
			if !errors.As(err, &wt) || wt.Key != bad || wt.Got != "set" {
				t.Fatalf("retry %v, %s a set: %v", retry, which, err)
			}
			if which != "batches" {
				if score, _ := b.rdb.ZScore(ctx, k.batches, res.lease.member()).Result(); score == 0 {
					t.Fatalf("retry %v, %s a set: a failed settle dropped the lease", retry, which)
				}
			}
			if which != "runs" {
				if n, _ := b.rdb.HLen(ctx, k.runs).Result(); n == 0 {
					t.Fatalf("retry %v, %s a set: a failed settle took the batch's records", retry, which)
				}
			}
		}
	}
}

// extendBatches moves held batch leases to a Lease from now, in one round
// trip for several, answers 0 for a lease no longer held (and does not bring it
// back), and fails with a WrongTypeError on a batches key of another type,
// changing nothing.
func TestExtendBatches(t *testing.T) {
	t.Parallel()
	b := newBroker(t, BrokerOptions{Lease: time.Minute})
	must(t, b.Schedule(ctx, jobsDue(3, "ext-", time.Now().Add(-time.Second))...))
	var leases []batchLease
	for range 3 {
		res, err := b.claim(ctx, b.shards[0], 1, leaseBatchIDs)
		must(t, err)
		leases = append(leases, res.lease)
	}
	k := b.keys
	// The second is lost: recovery took it back.
	must(t, b.rdb.ZAdd(ctx, k.batches, redis.Z{Score: 1, Member: leases[1].member()}).Err())
	if rec, err := b.Recover(ctx); err != nil || rec.Requeued != 1 {
		t.Fatalf("recover: %+v, %v", rec, err)
	}
	// The server learns the script, and the client opens a connection for
	// pipelines (go-redis from v9.23 keeps them in a pool of their own, and
	// a new connection's handshake would count as round trips below).
	_, err := b.extendBatches(ctx, []batchLease{leases[0], leases[0]}, b.opts.Lease)
	must(t, err)
	before := redisNow(t, b.rdb).Truncate(time.Millisecond) // the script's clock is in ms
	var trips atomic.Int64
	b.rdb.AddHook(roundTrips{&trips})
	got, err := b.extendBatches(ctx, leases, b.opts.Lease)
	must(t, err)
	if n := trips.Load(); n != 1 {
		t.Errorf("3 leases extended in %d round trips, want 1", n)
	}
	for i, l := range leases {
		score, err := b.rdb.ZScore(ctx, k.batches, l.member()).Result()
		switch {
		case i == 1 && (got[i] != 0 || err != redis.Nil):
			t.Errorf("lost lease: extended to %d, on Redis %v (%v)", got[i], score, err)
		case i != 1 && (time.UnixMilli(got[i]).Before(before.Add(time.Minute)) || int64(score) != got[i]):
			t.Errorf("lease %d: extended to %d, on Redis %v, want a minute past %v", i, got[i], score, before)
		}
	}

	must(t, b.rdb.Del(ctx, k.batches).Err())
	must(t, b.rdb.SAdd(ctx, k.batches, "x").Err())
	_, err = b.extendBatches(ctx, leases[:1], b.opts.Lease)
	var wt *WrongTypeError
	if !errors.As(err, &wt) || wt.Key != k.batches || !errors.Is(err, ErrWrongType) {
		t.Fatalf("batches a set: %v", err)
	}
	if members, _ := b.rdb.SMembers(ctx, k.batches).Result(); len(members) != 1 || members[0] != "x" {
		t.Fatalf("batches a set: changed to %v", members)
	}
}

// Batch claimers on their own connections race each other, per-job
// claimers and Broker.Claim's claimers (whose claims share a lease and
// are acked one by one, from two connections at once, some after an
// Extend) for the same jobs, hold their leases for random times, and
// some die holding them, while recovery runs beside them. Every job is
// settled exactly once: a batch whose lease was recovered can no longer
// be settled, its jobs come back to be claimed again, and a job acked
// from a shared lease does not come back with the rest.
func TestBatchClaimsRaceRecovery(t *testing.T) {
	t.Parallel()
	key := testKey(t)
	opts := BrokerOptions{Key: key, Lease: 30 * time.Millisecond, MaxAttempts: 1000,
		Backoff: func(int) time.Duration { return 0 }}
	b := newBroker(t, opts)
	const n, workers = 3000, 8
	must(t, b.Schedule(ctx, jobsDue(n, "job-", time.Now().Add(-time.Second))...))

	var mu sync.Mutex
	settled := make(map[string]int, n)
	var total atomic.Int64
	var lostBatches, dropped atomic.Int64
	errs := make(chan error, workers+1)
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // recovery
		defer wg.Done()
		for {
			select {
			case <-done:
				return
			case <-time.After(5 * time.Millisecond):
			}
			if _, err := b.Recover(ctx); err != nil {
				errs <- err
				return
			}
		}
	}()
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := ownConn(t)
			wb, err := NewBroker(c, opts)
			if err != nil {
				errs <- err
				return
			}
			for total.Load() < n {
				select {
				case <-done:
					return
				default:
				}
				modes := []claimMode{leasePerJob, leaseBatch, leaseBatchIDs, leasedClaim}
				mode := modes[w%len(modes)]
				var res claimResult
				var err error
				if mode == leasedClaim {
					res.claims, err = wb.Claim(ctx, 1+rand.IntN(100))
				} else {
					res, err = wb.claim(ctx, wb.shards[0], 1+rand.IntN(100), mode)
				}
				if err != nil {
					errs <- err
					return
				}
				if len(res.claims) == 0 {
					time.Sleep(time.Millisecond)
					continue
				}
				time.Sleep(time.Duration(rand.IntN(40)) * time.Millisecond) // some leases expire
				if rand.IntN(10) == 0 {
					dropped.Add(1) // dies holding the claims
					continue
				}
				var ok []Claim
				if mode == leasedClaim {
					if ok, err = ackApart(wb, b, res.claims); err != nil {
						errs <- err
						return
					}
					if len(ok) < len(res.claims) {
						lostBatches.Add(1)
					}
				} else if res.lease.n > 0 {
					lost, err := wb.finishBatches(ctx, batchEnd{lease: res.lease})
					if err != nil {
						errs <- err
						return
					}
					if len(lost) > 0 {
						lostBatches.Add(1)
					} else {
						ok = res.claims
					}
				} else {
					lost, err := wb.AckMany(ctx, res.claims...)
					if err != nil {
						errs <- err
						return
					}
					ok = slicesWithout(res.claims, lost)
				}
				mu.Lock()
				for _, c := range ok {
					settled[c.ID]++
				}
				mu.Unlock()
				total.Add(int64(len(ok)))
			}
		}()
	}
	deadline := time.After(30 * time.Second)
	for total.Load() < n {
		select {
		case err := <-errs:
			t.Fatal(err)
		case <-deadline:
			t.Fatalf("settled %d of %d", total.Load(), n)
		case <-time.After(10 * time.Millisecond):
		}
	}
	close(done)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for i := range n {
		if k := settled["job-"+strconv.Itoa(i)]; k != 1 {
			t.Fatalf("job-%d settled %d times", i, k)
		}
	}
	if len(settled) != n {
		t.Fatalf("%d ids settled, want %d", len(settled), n)
	}
	st, err := b.Stats(ctx)
	must(t, err)
	if st.Scheduled != 0 || st.Inflight != 0 || st.Dead != 0 {
		t.Fatalf("stats %+v", st)
	}
	if n, _ := b.rdb.HLen(ctx, b.keys.runs).Result(); n != 0 {
		t.Fatalf("%d run records left", n)
	}
	t.Logf("%d batches lost their lease, %d claims dropped by dying holders", lostBatches.Load(), dropped.Load())
	if lostBatches.Load() == 0 || dropped.Load() == 0 {
		t.Fatal("no lease was lost: the test did not test recovery")
	}
}

// ackApart acks each of cs on its own, the even places through b1 and the
// odd through b2 at the same time, after an Extend of one of them one time
// in four, and returns those acked; a lost lease is not an error.
func ackApart(b1, b2 *Broker, cs []Claim) ([]Claim, error) {
	if rand.IntN(4) == 0 {
		if _, err := b1.Extend(ctx, cs[rand.IntN(len(cs))], 30*time.Millisecond); err != nil && !errors.Is(err, ErrLeaseLost) {
			return nil, err
		}
	}
	var mu sync.Mutex
	var ok []Claim
	var firstErr error
	var wg sync.WaitGroup
	for k, b := range []*Broker{b1, b2} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := k; i < len(cs); i += 2 {
				err := b.Ack(ctx, cs[i])
				mu.Lock()
				switch {
				case err == nil:
					ok = append(ok, cs[i])
				case !errors.Is(err, ErrLeaseLost) && firstErr == nil:
					firstErr = err
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return ok, firstErr
}

func slicesWithout(cs, lost []Claim) []Claim {
	gone := map[int64]bool{}
	for _, c := range lost {
		gone[c.Token] = true
	}
	var out []Claim
	for _, c := range cs {
		if !gone[c.Token] {
			out = append(out, c)
		}
	}
	return out
}

// A batch lease whose record is damaged part-way: the jobs before the
// damage come back, and the unreadable rest is kept in the dead set.
func TestDamagedBatchRecord(t *testing.T) {
	t.Parallel()
	b := newBroker(t, BrokerOptions{Backoff: func(int) time.Duration { return 0 }})
	past := float64(time.Now().Add(-time.Hour).UnixMilli())
	must(t, b.rdb.ZAdd(ctx, b.keys.batches, redis.Z{Score: past, Member: "7:3"}).Err())
	must(t, b.rdb.HSet(ctx, b.keys.runs, "b7", "1:a0:"+"x7:garbage", "batched", 3).Err())
	r, err := b.Recover(ctx)
	must(t, err)
	if r.Requeued != 1 || r.Dead != 1 {
		t.Fatalf("recovered %+v, want a requeued and the rest dead", r)
	}
	dead, err := listDead(b, 10)
	must(t, err)
	if len(dead) != 1 || dead[0].ID != "zclaim:damaged-batch:7" || !strings.Contains(dead[0].Reason, "unread: x7:garbage") {
		t.Fatalf("dead set %+v", dead)
	}
	if _, err := b.rdb.ZScore(ctx, b.Key(), "a").Result(); err != nil {
		t.Fatal("the job before the damage is not back on the schedule")
	}
}

// A pending record that cannot be read is not overwritten by the claim:
// the job goes to the dead set with the reason, in both claim forms.
func TestCorruptPendingRecordKept(t *testing.T) {
	t.Parallel()
	for _, mode := range []claimMode{leasePerJob, leaseBatchIDs} {
		b := newBroker(t, BrokerOptions{})
		must(t, b.rdb.ZAdd(ctx, b.Key(), redis.Z{Score: 1, Member: "bad"}).Err())
		must(t, b.rdb.HSet(ctx, b.keys.pending, "bad", "garbage-record").Err())
		res, err := b.claim(ctx, b.shards[0], 10, mode)
		must(t, err)
		if mode == leasePerJob {
			if len(res.claims) != 0 {
				t.Fatalf("per-job claim handed out %+v", res.claims)
			}
			dead, err := listDead(b, 10)
			must(t, err)
			if len(dead) != 1 || !strings.Contains(dead[0].Reason, "corrupt record") {
				t.Fatalf("dead set %+v", dead)
			}
			continue
		}
		if len(res.corrupt) != 1 || res.corrupt[0].c.ID != "bad" {
			t.Fatalf("batch claim: corrupt %+v, claims %+v", res.corrupt, res.claims)
		}
	}
}

// A claim of a shared lease whose ID was changed names no job there:
// Retry and Kill, which take the job's record from the lease, refuse it
// and change nothing.
func TestLeasedClaimWithAnotherID(t *testing.T) {
	t.Parallel()
	b := newBroker(t, BrokerOptions{Lease: time.Minute})
	cs := claimDueJobs(t, b, 2)
	forged := cs[0]
	forged.ID = cs[1].ID
	wantErr(t, b.Retry(ctx, forged, time.Time{}), ErrLeaseLost)
	wantErr(t, b.Kill(ctx, forged, "forged"), ErrLeaseLost)
	if st, err := b.Stats(ctx); err != nil || st.Inflight != 2 || st.Scheduled != 0 || st.Dead != 0 {
		t.Fatalf("stats %+v, %v", st, err)
	}
	lost, err := b.AckMany(ctx, cs...)
	must(t, err)
	if len(lost) != 0 {
		t.Fatalf("lost %d of the real claims", len(lost))
	}
}

// Retry and Kill of a claim of a shared lease check the keys they write
// before writing any: a key of another type is ErrWrongType, and the
// claim stays held.
func TestLeasedSettleWrongType(t *testing.T) {
	t.Parallel()
	b := newBroker(t, BrokerOptions{Lease: time.Minute})
	cs := claimDueJobs(t, b, 1)
	must(t, b.rdb.Set(ctx, b.keys.dead, "oops", 0).Err())
	wantErr(t, b.Kill(ctx, cs[0], "killed"), ErrWrongType)
	must(t, b.rdb.Del(ctx, b.keys.dead).Err())
	must(t, b.rdb.Set(ctx, b.keys.pending, "oops", 0).Err())
	wantErr(t, b.Retry(ctx, cs[0], time.Time{}), ErrWrongType)
	must(t, b.rdb.Del(ctx, b.keys.pending).Err())
	must(t, b.Ack(ctx, cs[0]))
}

// A claim of a shared lease given twice to one AckMany is acked once, and
// its copy shares its outcome: both acked, or, once acked, both lost.
func TestAckManySameClaimTwice(t *testing.T) {
	t.Parallel()
	b := newBroker(t, BrokerOptions{Lease: time.Minute})
	cs := claimDueJobs(t, b, 3)
	lost, err := b.AckMany(ctx, cs[0], cs[1], cs[0])
	must(t, err)
	if len(lost) != 0 {
		t.Fatalf("lost %d of a claim, its copy and another", len(lost))
	}
	lost, err = b.AckMany(ctx, cs[0], cs[0], cs[2])
	must(t, err)
	if len(lost) != 2 || lost[0].ID != cs[0].ID || lost[1].ID != cs[0].ID {
		t.Fatalf("acked again: lost %v, want the acked claim twice", lost)
	}
	if st, err := b.Stats(ctx); err != nil || st.Inflight != 0 {
		t.Fatalf("stats %+v, %v", st, err)
	}
}

// claimDueJobs schedules n jobs due a second ago and claims them in one
// call of b.Claim.
func claimDueJobs(t *testing.T, b *Broker, n int) []Claim {
	t.Helper()
	must(t, b.Schedule(ctx, jobsDue(n, "job-", time.Now().Add(-time.Second))...))
	cs, err := b.Claim(ctx, n)
	must(t, err)
	if len(cs) != n {
		t.Fatalf("claimed %d of %d", len(cs), n)
	}
	return cs
}
