package zclaim

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Each script is bounded: over a million due members a claim takes at most
// MaxBatchSize, and over a million expired leases a recovery pass takes at
// most BatchSize; each call stays far below what would stall Redis.
func TestScriptsBounded(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("loads a million members")
	}
	const n = 1_000_000
	b := newBroker(t, BrokerOptions{BatchSize: 100, Lease: time.Minute})
	rdb := b.rdb
	past := float64(time.Now().Add(-time.Hour).Unix())
	pastMS := float64(time.Now().Add(-time.Hour).UnixMilli())
	for i := 0; i < n; i += 20000 {
		sched := make([]redis.Z, 0, 20000)
		infl := make([]redis.Z, 0, 20000)
		for j := i; j < i+20000; j++ {
			id := "j" + strconv.Itoa(j)
			sched = append(sched, redis.Z{Score: past, Member: id})
			infl = append(infl, redis.Z{Score: pastMS, Member: "x" + id + "|" + strconv.Itoa(j+1)})
		}
		p := rdb.Pipeline()
		p.ZAdd(ctx, b.keys.schedule, sched...)
		p.ZAdd(ctx, b.keys.inflight, infl...)
		_, err := p.Exec(ctx)
		must(t, err)
	}

	start := time.Now()
	cs, err := b.Claim(ctx, 5000)
	claimTook := time.Since(start)
	must(t, err)
	if len(cs) != MaxBatchSize {
		t.Fatalf("claimed %d, want MaxBatchSize %d", len(cs), MaxBatchSize)
	}
	if left, _ := rdb.ZCard(ctx, b.keys.schedule).Result(); left != n-MaxBatchSize {
		t.Fatalf("%d left scheduled, want %d", left, n-MaxBatchSize)
	}

	start = time.Now()
	r, err := b.Recover(ctx)
	recoverTook := time.Since(start)
	must(t, err)
	if r.Requeued+r.Dead != 100 {
		t.Fatalf("one pass recovered %+v, want its batch of 100", r)
	}
	// The claimed batch is in flight with a fresh lease; the pass took 100
	// of the expired ones.
	if infl, _ := rdb.ZCard(ctx, b.keys.inflight).Result(); infl != n+MaxBatchSize-100 {
		t.Fatalf("%d in flight, want %d", infl, n+MaxBatchSize-100)
	}
	t.Logf("over %d members: claim of %d took %v, recovery pass of 100 took %v", n, MaxBatchSize, claimTook, recoverTook)
	if claimTook > time.Second || recoverTook > time.Second {
		t.Fatalf("a bounded script took too long: claim %v, recover %v", claimTook, recoverTook)
	}

	// Expired batch leases (a dispatcher's claims): a pass takes whole
	// leases until it has touched its batch of jobs.
	bb := newBroker(t, BrokerOptions{BatchSize: 100, Lease: time.Minute})
	for i := 0; i < 100_000; i += 10000 {
		p := rdb.Pipeline()
		for j := i; j < i+10000; j++ {
			first := strconv.Itoa(1000*j + 1)
			p.ZAdd(ctx, bb.keys.batches, redis.Z{Score: pastMS, Member: first + ":3"})
			var blob strings.Builder
			for _, id := range []string{"a" + first, "b" + first, "c" + first} {
				fmt.Fprintf(&blob, "%d:%s0:", len(id), id) // no record
			}
			p.HSet(ctx, bb.keys.runs, "b"+first, blob.String())
		}
		_, err := p.Exec(ctx)
		must(t, err)
	}
	must(t, rdb.HSet(ctx, bb.keys.runs, "batched", 300_000).Err())
	r, err = bb.Recover(ctx)
	must(t, err)
	if r.Requeued+r.Dead != 102 || r.scanned != 102 {
		t.Fatalf("one pass over batch leases of 3 recovered %+v, want 34 leases, 102 jobs", r)
	}
}

// Lookups, pages and moves stay O(log n + page) on a schedule of a
// million jobs with a hundred thousand dead ones.
func TestInspectBounded(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("loads a million members")
	}
	const n = 1_000_000
	b := newBroker(t, BrokerOptions{Lease: time.Minute})
	rdb := b.rdb
	future := float64(time.Now().Add(time.Hour).Unix())
	for i := 0; i < n; i += 20000 {
		sched := make([]redis.Z, 0, 20000)
		dead := make([]redis.Z, 0, 2000)
		for j := i; j < i+20000; j++ {
			sched = append(sched, redis.Z{Score: future + float64(j/100), Member: "j" + strconv.Itoa(j)})
			if j%10 == 0 {
				dead = append(dead, redis.Z{Score: float64(j), Member: "d" + strconv.Itoa(j)})
			}
		}
		p := rdb.Pipeline()
		p.ZAdd(ctx, b.keys.schedule, sched...)
		p.ZAdd(ctx, b.keys.dead, dead...)
		_, err := p.Exec(ctx)
		must(t, err)
	}
	must(t, b.Schedule(ctx, Job{ID: "now", RunAt: time.Now().Add(-time.Second), Type: "t"}))
	_, err := b.Claim(ctx, 1)
	must(t, err)

	mid, err := b.List(ctx, StateScheduled, ListOptions{Limit: n / 2})
	if err == nil || mid.Jobs != nil {
		t.Fatal("a page beyond MaxListLimit was accepted")
	}
	// A cursor in the middle of the schedule, as a page of ids would give.
	cur := cursor{score: strconv.FormatFloat(future+5000, 'f', -1, 64), member: "j500000"}.String("scheduled")
	var took []time.Duration
	timed := func(f func() error) {
		start := time.Now()
		must(t, f())
		took = append(took, time.Since(start))
	}
	timed(func() error {
		l, err := b.List(ctx, StateScheduled, ListOptions{After: cur, Limit: MaxListLimit})
		if err == nil && (len(l.Jobs) != MaxListLimit || l.Jobs[0].ID != "j500001") {
			t.Errorf("page after j500000: %d jobs from %v", len(l.Jobs), l.Jobs[0].ID)
		}
		return err
	})
	timed(func() error {
		l, err := b.List(ctx, StateDead, ListOptions{After: "dead::0:500000:d500000", Limit: MaxListLimit})
		if err == nil && (len(l.Jobs) != MaxListLimit || l.Jobs[0].ID != "d500010") {
			t.Errorf("dead page: %d jobs from %v", len(l.Jobs), l.Jobs[0].ID)
		}
		return err
	})
	timed(func() error {
		j, err := b.Job(ctx, "j999999")
		if err == nil && j.State != StateScheduled {
			t.Errorf("j999999: %+v", j)
		}
		return err
	})
	timed(func() error { _, err := b.Job(ctx, "d999990"); return err })
	timed(func() error { _, err := b.Job(ctx, "now"); return err })
	timed(func() error { _, err := b.RunNow(ctx, "j1", "j999999"); return err })
	t.Logf("over %d scheduled and %d dead: list, dead page, lookups, run now took %v", n, n/10, took)
	for _, d := range took {
		if d > 250*time.Millisecond {
			t.Fatalf("an inspection took %v: %v", d, took)
		}
	}
}
