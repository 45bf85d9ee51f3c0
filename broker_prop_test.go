package zclaim

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"pgregory.net/rapid"
)

// The broker against a model. Random sequences of Schedule, Cancel, Claim,
// Ack, Extend, Retry, Kill, batch claims and their settling (the
// dispatcher's), Recover, Revive, DeleteDead and waiting (leases are 40 ms, so waits make them
// expire) must keep every run of a job in exactly one place:
// scheduled, in flight, dead or finished; at most one scheduled entry per id;
// tokens strictly increasing; nothing claimed before it is due; a stale
// token's operations failing with ErrLeaseLost and changing nothing.

const propLease = 40 * time.Millisecond

type mSched struct {
	payload  string // "" = no record written by Schedule
	attempts int    // claims already made of this run
	due      time.Time
	exact    bool      // due is the exact score; else an upper bound
	occ      time.Time // the occurrence's due: kept across retries and revival
	rec      bool      // a pending record was written (else the claim takes the due from the score)
}

// mDead is a dead job: why it died, and the payload it comes back with.
type mDead struct {
	reason, payload string
	occ             time.Time
}

type mClaim struct {
	c       Claim
	payload string
	rec     bool // the claim has a run record (else its due rides in its in-flight member)
}

// mBatch is a batch claim: one lease over its jobs, in claim order.
type mBatch struct {
	lease batchLease
	until time.Time
	jobs  []mClaim
}

// mLease is the lease of one Broker.Claim call, whose claims (in m.inflight
// while current) are settled one by one.
type mLease struct {
	lease  batchLease
	until  time.Time
	tokens []int64 // in place order
}

type brokerModel struct {
	b         *Broker
	scheduled map[string]mSched
	inflight  map[int64]mClaim  // current claims by token, those of leases too
	leases    map[int64]*mLease // current leases of Broker.Claim calls by first token
	batches   map[int64]mBatch  // current batch claims by first token
	allBatch  []mBatch          // every batch claim, current or stale
	dead      map[string]mDead
	all       []Claim // every claim ever handed out, current or stale (batch claims' jobs too: they have no lease of their own)
	lastToken int64
	finished  int
	n         int
}

func (m *brokerModel) now(t *rapid.T) time.Time {
	now, err := m.b.rdb.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	return now
}

func (m *brokerModel) pickClaim(t *rapid.T) (Claim, bool) {
	if len(m.all) == 0 {
		t.Skip("no claims yet")
	}
	c := rapid.SampledFrom(m.all).Draw(t, "claim")
	cur, ok := m.inflight[c.Token]
	if ok {
		c.LeaseUntil = cur.c.LeaseUntil
	}
	return c, ok
}

// settleBack mirrors settle_back: a run that did not finish goes back to
// the schedule, unless the id is scheduled already or its attempts are spent.
func (m *brokerModel) settleBack(mc mClaim, due time.Time, reason string, max int) (dead bool) {
	m.settle(mc.c)
	id := mc.c.ID
	if _, ok := m.scheduled[id]; ok {
		m.finished++ // superseded by the newer entry of the same id
		return false
	}
	if mc.c.Attempt >= max {
		m.dead[id] = mDead{reason, mc.payload, mc.c.Due}
		return true
	}
	m.scheduled[id] = mSched{payload: mc.payload, attempts: mc.c.Attempt, due: due, occ: mc.c.Due, rec: true}
	return false
}

// settle ends current claim c; the lease it shared goes with its last claim.
func (m *brokerModel) settle(c Claim) {
	delete(m.inflight, c.Token)
	if l := m.leases[c.lease.first]; c.lease.n > 0 && l != nil && len(m.unsettled(l)) == 0 {
		delete(m.leases, c.lease.first)
	}
}

// unsettled returns the current claims of lease l, in place order.
func (m *brokerModel) unsettled(l *mLease) []mClaim {
	var out []mClaim
	for _, tok := range l.tokens {
		if mc, ok := m.inflight[tok]; ok {
			out = append(out, mc)
		}
	}
	return out
}

// leasedClaim is the claim action's mode for Broker.Claim's own claims.
const leasedClaim claimMode = "leased"

func (m *brokerModel) actions() map[string]func(*rapid.T) {
	ids := rapid.SampledFrom([]string{"a", "b", "c", "d"})
	max := m.b.opts.MaxAttempts
	// takeDead revives (back on the schedule, unless a newer entry of the
	// id is there) or deletes a dead job.
	takeDead := func(revive bool) func(*rapid.T) {
		return func(t *rapid.T) {
			id := ids.Draw(t, "id")
			op := m.b.DeleteDead
			if revive {
				op = m.b.Revive
			}
			n, err := op(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			d, was := m.dead[id]
			if (n == 1) != was {
				t.Fatalf("revive %v of %q answered %d, model dead: %v", revive, id, n, was)
			}
			if !was {
				return
			}
			delete(m.dead, id)
			if _, ok := m.scheduled[id]; ok || !revive {
				m.finished++ // deleted, or the newer scheduled entry stands for the work
				return
			}
			m.scheduled[id] = mSched{payload: d.payload, due: m.now(t), occ: d.occ, rec: true} // due by now, the same occurrence
		}
	}
	return map[string]func(*rapid.T){
		"schedule": func(t *rapid.T) {
			id := ids.Draw(t, "id")
			delay := rapid.SampledFrom([]time.Duration{-10 * time.Millisecond, 0, 15 * time.Millisecond, time.Hour}).Draw(t, "delay")
			payload := ""
			if rapid.Bool().Draw(t, "payload") {
				m.n++
				payload = fmt.Sprintf("p%d", m.n)
			}
			j := Job{ID: id, RunAt: m.now(t).Add(delay)}
			if payload != "" {
				j.Type, j.Payload = "t", []byte(payload)
			}
			if err := m.b.Schedule(ctx, j); err != nil {
				t.Fatal(err)
			}
			if _, ok := m.scheduled[id]; ok {
				m.finished++ // the replaced entry's run ends here
			}
			m.scheduled[id] = mSched{payload: payload, due: m.b.scoreTime(m.b.score(j.RunAt)), exact: true,
				occ: m.b.dueTime(m.b.score(j.RunAt)), rec: payload != ""}
		},
		// A producer's plain ZADD of an id that is not scheduled (a new
		// member with no record) or that waits as a retry (new work: a new
		// occurrence at the ZADD's score, which keeps the record's payload).
		// Its score is half a millisecond off every score the broker
		// writes, so it never lands on a retry's own score.
		"zadd": func(t *rapid.T) {
			id := ids.Draw(t, "id")
			s, ok := m.scheduled[id]
			if ok && s.attempts == 0 {
				t.Skip("a first attempt that a ZADD moves keeps its record's due")
			}
			delay := rapid.SampledFrom([]time.Duration{-10 * time.Millisecond, 0, 15 * time.Millisecond, time.Hour}).Draw(t, "delay")
			f := float64(m.now(t).Add(delay).UnixMilli())/1000 + 0.0005 // scores in seconds
			score := strconv.FormatFloat(f, 'f', -1, 64)
			if err := m.b.rdb.ZAdd(ctx, m.b.Key(), redis.Z{Score: f, Member: id}).Err(); err != nil {
				t.Fatal(err)
			}
			m.scheduled[id] = mSched{payload: s.payload, due: m.b.scoreTime(score), exact: true,
				occ: m.b.dueTime(score), rec: s.rec}
		},
		"cancel": func(t *rapid.T) {
			id := ids.Draw(t, "id")
			ok, err := m.b.Cancel(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			_, want := m.scheduled[id]
			if ok != want {
				t.Fatalf("cancel %s: %v, model %v", id, ok, want)
			}
			delete(m.scheduled, id)
		},
		"claim": func(t *rapid.T) {
			n := rapid.IntRange(1, 5).Draw(t, "max")
			mode := rapid.SampledFrom([]claimMode{leasePerJob, leaseBatch, leaseBatchIDs, leasedClaim}).Draw(t, "mode")
			batch := mode == leaseBatch || mode == leaseBatchIDs
			before := m.now(t)
			var res claimResult
			var err error
			if mode == leasedClaim {
				res.claims, err = m.b.Claim(ctx, n)
			} else {
				res, err = m.b.claim(ctx, m.b.shards[0], n, mode)
			}
			if err != nil {
				t.Fatal(err)
			}
			cs := res.claims
			var ml *mLease
			if mode == leasedClaim && len(cs) > 0 {
				ml = &mLease{lease: cs[0].lease, until: cs[0].LeaseUntil}
				if ml.lease.n != len(cs) || ml.lease.first != cs[0].Token {
					t.Fatalf("lease %+v for %d claims from token %d", ml.lease, len(cs), cs[0].Token)
				}
				m.leases[ml.lease.first] = ml
			}
			var mb mBatch
			if batch && len(cs) > 0 {
				mb = mBatch{lease: res.lease, until: cs[0].LeaseUntil}
				if res.lease.n != len(cs) || res.lease.first != cs[0].Token || len(res.corrupt) > 0 {
					t.Fatalf("batch lease %+v for %d claims from token %d", res.lease, len(cs), cs[0].Token)
				}
			}
			after := m.now(t)
			dueBefore := 0
			for _, s := range m.scheduled {
				if !s.due.After(before) {
					dueBefore++
				}
			}
			if len(cs) < min(n, dueBefore) {
				t.Fatalf("claimed %d of max %d with %d due", len(cs), n, dueBefore)
			}
			for _, c := range cs {
				s, ok := m.scheduled[c.ID]
				if !ok {
					t.Fatalf("claimed %q, which the model has not scheduled", c.ID)
				}
				claimedAt := c.LeaseUntil.Add(-propLease)
				if mode == leaseBatchIDs {
					if !c.RunAt.IsZero() {
						t.Fatalf("a claim without due times has RunAt %v", c.RunAt)
					}
				} else if c.RunAt.After(after) || c.RunAt.After(claimedAt.Add(time.Millisecond)) || (s.exact && !c.RunAt.Equal(s.due)) {
					t.Fatalf("claim %+v early or wrong due time (model %v, claimed at %v)", c, s.due, claimedAt)
				}
				if c.Token <= m.lastToken {
					t.Fatalf("token %d after %d", c.Token, m.lastToken)
				}
				m.lastToken = c.Token
				if string(c.Payload) != s.payload || c.Attempt != s.attempts+1 || !c.Due.Equal(s.occ) {
					t.Fatalf("claim %+v, model %+v", c, s)
				}
				delete(m.scheduled, c.ID)
				switch {
				case batch:
					mb.jobs = append(mb.jobs, mClaim{c: c, payload: s.payload})
				case ml != nil:
					if c.lease != ml.lease || c.Token != ml.lease.first+int64(len(ml.tokens)) {
						t.Fatalf("claim %+v in lease %+v", c, ml.lease)
					}
					ml.tokens = append(ml.tokens, c.Token)
					m.inflight[c.Token] = mClaim{c: c, payload: s.payload}
				default:
					m.inflight[c.Token] = mClaim{c: c, payload: s.payload, rec: s.rec}
				}
				m.all = append(m.all, c)
			}
			if mb.lease.n > 0 {
				m.batches[mb.lease.first] = mb
				m.allBatch = append(m.allBatch, mb)
			}
		},
		"finish": func(t *rapid.T) {
			if len(m.allBatch) == 0 {
				t.Skip("no batch claims yet")
			}
			mb := rapid.SampledFrom(m.allBatch).Draw(t, "batch")
			_, cur := m.batches[mb.lease.first]
			end := batchEnd{lease: mb.lease, retry: map[int]time.Duration{}, dead: map[int]string{}}
			outcomes := make([]int, len(mb.jobs))
			for i := range mb.jobs {
				switch outcomes[i] = rapid.IntRange(0, 2).Draw(t, "outcome"); outcomes[i] {
				case 1:
					end.retry[i+1] = 0
				case 2:
					end.dead[i+1] = "dead by test"
				}
			}
			lost, err := m.b.finishBatches(ctx, end)
			if err != nil {
				t.Fatal(err)
			}
			if (len(lost) == 1) == cur {
				t.Fatalf("finish of a batch (current %v): lost %v", cur, lost)
			}
			if !cur {
				return
			}
			delete(m.batches, mb.lease.first)
			now := m.now(t)
			for i, mc := range mb.jobs {
				switch outcomes[i] {
				case 0:
					m.finished++
				case 1:
					m.settleBack(mc, now, "attempts exhausted", max)
				case 2:
					m.dead[mc.c.ID] = mDead{"dead by test", mc.payload, mc.c.Due}
				}
			}
		},
		"ack": func(t *rapid.T) {
			c, cur := m.pickClaim(t)
			err := m.b.Ack(ctx, c)
			m.expect(t, "ack", err, cur)
			if cur {
				m.settle(c)
				m.finished++
			}
		},
		"extend": func(t *rapid.T) {
			c, cur := m.pickClaim(t)
			nc, err := m.b.Extend(ctx, c, propLease)
			m.expect(t, "extend", err, cur)
			if !cur {
				return
			}
			toks := []int64{c.Token}
			if l := m.leases[c.lease.first]; c.lease.n > 0 {
				// The lease is the claims': all that are current move.
				toks, l.until = l.tokens, nc.LeaseUntil
			}
			for _, tok := range toks {
				if mc, ok := m.inflight[tok]; ok {
					mc.c.LeaseUntil = nc.LeaseUntil
					m.inflight[tok] = mc
				}
			}
		},
		"retry": func(t *rapid.T) {
			c, cur := m.pickClaim(t)
			err := m.b.Retry(ctx, c, time.Time{})
			m.expect(t, "retry", err, cur)
			if cur {
				m.settleBack(m.inflight[c.Token], m.now(t), "attempts exhausted", max)
			}
		},
		"kill": func(t *rapid.T) {
			c, cur := m.pickClaim(t)
			err := m.b.Kill(ctx, c, "killed by test")
			m.expect(t, "kill", err, cur)
			if cur {
				m.dead[c.ID] = mDead{"killed by test", m.inflight[c.Token].payload, c.Due}
				m.settle(c)
			}
		},
		"recover": func(t *rapid.T) {
			before := m.now(t)
			r, err := m.b.Recover(ctx)
			if err != nil {
				t.Fatal(err)
			}
			after := m.now(t)
			var gone []mClaim
			for _, mc := range m.inflight {
				if mc.c.lease.n > 0 {
					continue // with its lease, below
				}
				dl := mc.c.LeaseUntil
				switch {
				case !dl.After(before):
					gone = append(gone, mc)
				case dl.After(after):
				default: // expired during the call: look whether recovery took it
					if _, err := m.b.rdb.ZScore(ctx, m.b.keys.inflight, mc.c.member()).Result(); err != nil {
						gone = append(gone, mc)
					}
				}
			}
			// The script walks expired members by deadline, then member name,
			// and then expired batch leases the same way, each job in order.
			sort.Slice(gone, func(i, j int) bool {
				a, b := gone[i].c, gone[j].c
				if !a.LeaseUntil.Equal(b.LeaseUntil) {
					return a.LeaseUntil.Before(b.LeaseUntil)
				}
				return a.member() < b.member()
			})
			var goneBatches []mBatch
			all := slices.Collect(maps.Values(m.batches))
			for _, l := range m.leases {
				all = append(all, mBatch{lease: l.lease, until: l.until, jobs: m.unsettled(l)})
			}
			for _, mb := range all {
				switch {
				case !mb.until.After(before):
					goneBatches = append(goneBatches, mb)
				case mb.until.After(after):
				default:
					if _, err := m.b.rdb.ZScore(ctx, m.b.keys.batches, mb.lease.member()).Result(); err != nil {
						goneBatches = append(goneBatches, mb)
					}
				}
			}
			sort.Slice(goneBatches, func(i, j int) bool {
				a, b := goneBatches[i], goneBatches[j]
				if !a.until.Equal(b.until) {
					return a.until.Before(b.until)
				}
				return a.lease.member() < b.lease.member()
			})
			for _, mb := range goneBatches {
				delete(m.batches, mb.lease.first)
				delete(m.leases, mb.lease.first)
				for _, mc := range mb.jobs {
					m.inflight[mc.c.Token] = mc // settleBack takes it from here
					gone = append(gone, mc)
				}
			}
			dead := 0
			for _, mc := range gone {
				if m.settleBack(mc, after, "lease expired", max) {
					dead++
				}
			}
			if r.Requeued+r.Dead != len(gone) || r.Dead != dead {
				t.Fatalf("recovered %+v, model expects %d with %d dead", r, len(gone), dead)
			}
		},
		"revive":     takeDead(true),
		"deleteDead": takeDead(false),
		"wait": func(t *rapid.T) {
			time.Sleep(time.Duration(rapid.IntRange(0, 50).Draw(t, "ms")) * time.Millisecond)
		},
		"": m.check,
	}
}

func (m *brokerModel) expect(t *rapid.T, op string, err error, current bool) {
	switch {
	case current && err != nil:
		t.Fatalf("%s of a current claim: %v", op, err)
	case !current && !errors.Is(err, ErrLeaseLost):
		t.Fatalf("%s of a stale claim: %v, want ErrLeaseLost", op, err)
	}
}

// check compares Redis with the model.
func (m *brokerModel) check(t *rapid.T) {
	rdb, k := m.b.rdb, m.b.keys
	sched, err := rdb.ZRangeWithScores(ctx, k.schedule, 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(sched) != len(m.scheduled) {
		t.Fatalf("schedule holds %d ids, model %d", len(sched), len(m.scheduled))
	}
	for _, z := range sched {
		id := z.Member.(string)
		s, ok := m.scheduled[id]
		if !ok {
			t.Fatalf("%q scheduled in Redis, not in the model", id)
		}
		rec, err := rdb.HGet(ctx, k.pending, id).Result()
		var j Job
		attempts := 0
		if err == nil {
			attempts, _, err = decodeRecord(rec, &j)
			if err != nil {
				t.Fatal(err)
			}
			// A retry found at another score than it was put back at is
			// a new occurrence to the claim (claim.lua).
			head, _, _ := strings.Cut(rec, ":")
			if _, back, ok := strings.Cut(head, "~"); ok {
				if f, err := strconv.ParseFloat(back, 64); err != nil || f != z.Score {
					attempts = 0
				}
			}
		}
		if string(j.Payload) != s.payload || attempts != s.attempts {
			t.Fatalf("%q pending record %q, model %+v", id, rec, s)
		}
	}
	infl, err := rdb.ZRange(ctx, k.inflight, 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	perJob := 0
	for _, mc := range m.inflight {
		if mc.c.lease.n > 0 {
			continue
		}
		perJob++
		if _, err := rdb.ZScore(ctx, k.inflight, mc.c.member()).Result(); err != nil {
			t.Fatalf("claim %s missing from the in-flight set", mc.c.member())
		}
	}
	if len(infl) != perJob {
		t.Fatalf("in flight %v, model %d", infl, perJob)
	}
	runs, err := rdb.HKeys(ctx, k.runs).Result()
	if err != nil {
		t.Fatal(err)
	}
	withRecord := len(m.batches) + len(m.leases) // one record of each batch's jobs
	for _, mc := range m.inflight {
		if mc.rec && mc.c.lease.n == 0 {
			withRecord++
		}
	}
	batched := 0
	members := []string{}
	for _, mb := range m.batches {
		batched += len(mb.jobs)
		members = append(members, mb.lease.member())
	}
	for _, l := range m.leases {
		left := len(m.unsettled(l))
		batched += left
		members = append(members, l.lease.member())
		if left < l.lease.n {
			withRecord++ // its settled places
			if !slices.Contains(runs, "s"+strconv.FormatInt(l.lease.first, 10)) {
				t.Fatalf("lease %s: no settled places in %v", l.lease.member(), runs)
			}
		}
	}
	for _, mbr := range members {
		if _, err := rdb.ZScore(ctx, k.batches, mbr).Result(); err != nil {
			t.Fatalf("batch lease %s missing", mbr)
		}
	}
	if n, _ := rdb.ZCard(ctx, k.batches).Result(); int(n) != len(members) {
		t.Fatalf("%d batch leases, model %d", n, len(members))
	}
	if batched > 0 {
		withRecord++
		if n, _ := rdb.HGet(ctx, k.runs, "batched").Int(); n != batched {
			t.Fatalf("%d jobs counted in batch leases, model %d", n, batched)
		}
	}
	if len(runs) != withRecord {
		t.Fatalf("run records %v, model %d", runs, withRecord)
	}
	st, err := m.b.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Inflight != int64(perJob+batched) || st.Scheduled != int64(len(m.scheduled)) {
		t.Fatalf("stats %+v, model %d in flight, %d scheduled", st, perJob+batched, len(m.scheduled))
	}
	dead, err := rdb.ZRange(ctx, k.dead, 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(dead) != len(m.dead) {
		t.Fatalf("dead %v, model %v", dead, m.dead)
	}
	for _, id := range dead {
		if _, ok := m.dead[id]; !ok {
			t.Fatalf("%q dead in Redis, not in the model", id)
		}
	}
}

func TestBrokerProperties(t *testing.T) {
	t.Parallel()
	rdb := newClient(t)
	rapid.Check(t, func(rt *rapid.T) {
		key := testKey(t) // deleted when the whole test ends
		b, err := NewBroker(rdb, BrokerOptions{Key: key, Lease: propLease, MaxAttempts: 3,
			Backoff: func(int) time.Duration { return 0 }})
		if err != nil {
			rt.Fatal(err)
		}
		m := &brokerModel{b: b, scheduled: map[string]mSched{}, inflight: map[int64]mClaim{}, leases: map[int64]*mLease{}, batches: map[int64]mBatch{}, dead: map[string]mDead{}}
		rt.Repeat(m.actions())
	})
}
