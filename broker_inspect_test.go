package zclaim

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Job finds an id wherever it is, with what applies to its state, and
// passes over ids that only look like it (glob characters, a "|").
func TestJobLookup(t *testing.T) {
	t.Parallel()
	b := newBroker(t, BrokerOptions{Lease: time.Minute})
	_, err := b.Job(ctx, "nope")
	wantErr(t, err, ErrNotFound)

	due := time.UnixMilli(time.Now().Add(-time.Second).UnixMilli())
	ids := []string{"a*[x]", "a", "a|b", `a\`}
	for _, id := range ids {
		must(t, b.Schedule(ctx, Job{ID: id, RunAt: due, Type: "email", Queue: "mail", Payload: []byte("12345")}))
	}
	j, err := b.Job(ctx, "a*[x]")
	must(t, err)
	if j.State != StateScheduled || j.State.String() != "scheduled" || !j.Due.Equal(due) || !j.RunAt.Equal(due) ||
		j.Type != "email" || j.Queue != "mail" || j.PayloadSize != 5 || j.Attempt != 1 || j.Token != 0 {
		t.Fatalf("scheduled: %+v", j)
	}

	cs, err := b.Claim(ctx, 10)
	must(t, err)
	if len(cs) != len(ids) {
		t.Fatalf("claimed %d", len(cs))
	}
	for _, c := range cs {
		j, err := b.Job(ctx, c.ID)
		must(t, err)
		if j.State != StateInFlight || j.Token != c.Token || !j.LeaseUntil.Equal(c.LeaseUntil) || !j.Due.Equal(due) || j.Type != "email" || j.Attempt != 1 {
			t.Fatalf("in flight %q: %+v, claim %+v", c.ID, j, c)
		}
	}
	// Scheduled again while in flight: both entries, the run in flight first.
	must(t, b.Schedule(ctx, Job{ID: "a", RunAt: due.Add(time.Hour)}))
	all, err := b.Jobs(ctx, "a")
	must(t, err)
	if len(all) != 2 || all[0].State != StateInFlight || all[1].State != StateScheduled || !all[1].Due.Equal(due.Add(time.Hour)) || all[1].Type != "" {
		t.Fatalf("a in two places: %+v", all)
	}
	for _, c := range cs {
		if c.ID == "a|b" {
			must(t, b.Kill(ctx, c, "bad input"))
		}
	}
	j, err = b.Job(ctx, "a|b")
	must(t, err)
	if j.State != StateDead || j.Reason != "bad input" || j.DiedAt.IsZero() || !j.Due.Equal(due) || j.Type != "email" || j.Attempt != 1 {
		t.Fatalf("dead: %+v", j)
	}

	// A plain ZADD member (no record): its due is its score, claimed or not.
	plain := time.UnixMilli(time.Now().Add(-time.Minute).UnixMilli() / 1000 * 1000)
	must(t, b.rdb.ZAdd(ctx, b.keys.schedule, redis.Z{Score: float64(plain.Unix()), Member: "p"}).Err())
	j, err = b.Job(ctx, "p")
	must(t, err)
	if j.State != StateScheduled || !j.Due.Equal(plain) || j.Type != "" {
		t.Fatalf("plain scheduled: %+v", j)
	}
	pc, err := b.Claim(ctx, 1)
	must(t, err)
	j, err = b.Job(ctx, "p")
	must(t, err)
	if len(pc) != 1 || j.State != StateInFlight || !j.Due.Equal(plain) || j.Token != pc[0].Token {
		t.Fatalf("plain in flight: %+v", j)
	}

	// A dispatcher's batch lease.
	must(t, b.Schedule(ctx, Job{ID: "x1", RunAt: due, Type: "t"}, Job{ID: "x2", RunAt: due, Type: "t"}))
	res, err := b.claim(ctx, b.shards[0], 10, leaseBatchIDs)
	must(t, err)
	if len(res.claims) != 2 {
		t.Fatalf("batch claimed %d", len(res.claims))
	}
	for _, c := range res.claims {
		j, err := b.Job(ctx, c.ID)
		must(t, err)
		if j.State != StateInFlight || j.Token != c.Token || !j.Due.Equal(due) || j.Type != "t" {
			t.Fatalf("batch job %q: %+v, claim %+v", c.ID, j, c)
		}
	}

	// Bad input changes nothing and says so.
	_, err = b.Job(ctx, "")
	wantErr(t, err, ErrEmptyID)
	must(t, b.rdb.Set(ctx, b.keys.dead, "x", 0).Err())
	_, err = b.Job(ctx, "a")
	wantErr(t, err, ErrWrongType)
}

// Paging visits every job once, in order, with pages of any size, while
// the cursor's job leaves between pages.
func TestListPaging(t *testing.T) {
	t.Parallel()
	b := newBroker(t, BrokerOptions{Lease: time.Minute})
	base := time.Now().Add(time.Hour).Truncate(time.Second)
	var jobs []Job
	for i := range 250 {
		// Runs of ten share a due time: ties are ordered by id.
		jobs = append(jobs, Job{ID: fmt.Sprintf("j%03d", i), RunAt: base.Add(time.Duration(i/10) * time.Second), Type: "t"})
	}
	must(t, b.Schedule(ctx, jobs...))
	for _, limit := range []int{1, 7, 10, 249, 250, 1000} {
		var got []string
		after := ""
		for pages := 0; ; pages++ {
			l, err := b.List(ctx, StateScheduled, ListOptions{After: after, Limit: limit})
			must(t, err)
			for _, j := range l.Jobs {
				if j.State != StateScheduled || j.Type != "t" {
					t.Fatalf("listed %+v", j)
				}
				got = append(got, j.ID)
			}
			if l.Next == "" {
				break
			}
			after = l.Next
			if pages > 300 {
				t.Fatal("paging does not end")
			}
		}
		if len(got) != 250 || !slices.IsSorted(got) {
			t.Fatalf("limit %d: listed %d jobs, sorted %v", limit, len(got), slices.IsSorted(got))
		}
	}
	// The cursor's job is cancelled between pages: the next page starts
	// after it anyway, ties included.
	l, err := b.List(ctx, StateScheduled, ListOptions{Limit: 15})
	must(t, err)
	if ok, _ := b.Cancel(ctx, l.Jobs[14].ID); !ok {
		t.Fatal("cancel")
	}
	l2, err := b.List(ctx, StateScheduled, ListOptions{After: l.Next, Limit: 1})
	must(t, err)
	if l2.Jobs[0].ID != "j015" {
		t.Fatalf("after a cancelled cursor: %+v", l2.Jobs)
	}

	// In flight: per-job claims, then batch leases, paged together.
	must(t, b.Schedule(ctx, Job{ID: "due1", RunAt: time.Now().Add(-time.Second), Type: "t"}, Job{ID: "due2", RunAt: time.Now().Add(-time.Second), Type: "t"}))
	_, err = b.Claim(ctx, 2)
	must(t, err)
	var due []Job
	for i := range 5 {
		due = append(due, Job{ID: "bat" + strconv.Itoa(i), RunAt: time.Now().Add(-time.Second), Type: "t"})
	}
	must(t, b.Schedule(ctx, due...))
	_, err = b.claim(ctx, b.shards[0], 3, leaseBatchIDs)
	must(t, err)
	_, err = b.claim(ctx, b.shards[0], 3, leaseBatchIDs)
	must(t, err)
	for _, limit := range []int{1, 2, 3, 4, 100} {
		var got []string
		after := ""
		for {
			l, err := b.List(ctx, StateInFlight, ListOptions{After: after, Limit: limit})
			must(t, err)
			for _, j := range l.Jobs {
				got = append(got, j.ID)
			}
			if l.Next == "" {
				break
			}
			after = l.Next
		}
		want := []string{"due1", "due2", "bat0", "bat1", "bat2", "bat3", "bat4"}
		if !slices.Equal(got, want) {
			t.Fatalf("in flight, limit %d: %v, want %v", limit, got, want)
		}
	}

	// Bad input.
	_, err = b.List(ctx, StateScheduled, ListOptions{Limit: MaxListLimit + 1})
	wantErr(t, err, ErrInvalidArgument)
	_, err = b.List(ctx, StateUnknown, ListOptions{})
	wantErr(t, err, ErrInvalidArgument)
	_, err = b.List(ctx, StateDead, ListOptions{After: l.Next})
	wantErr(t, err, ErrInvalidArgument)
}

// RunNow keeps the occurrence; Reschedule of a job not yet claimed makes
// a new one, of a job waiting for its retry keeps it; both pass over ids
// that are not scheduled.
func TestMoves(t *testing.T) {
	t.Parallel()
	b := newBroker(t, BrokerOptions{Lease: time.Minute})
	later := time.UnixMilli(time.Now().Add(time.Hour).UnixMilli())
	must(t, b.Schedule(ctx, Job{ID: "r", RunAt: later, Type: "t"}, Job{ID: "s", RunAt: later, Type: "t"}))
	must(t, b.rdb.ZAdd(ctx, b.keys.schedule, redis.Z{Score: float64(later.Unix()), Member: "plain"}).Err())
	n, err := b.RunNow(ctx, "r", "plain", "missing")
	must(t, err)
	if n != 2 {
		t.Fatalf("RunNow moved %d, want 2", n)
	}
	cs, err := b.Claim(ctx, 10)
	must(t, err)
	if len(cs) != 2 {
		t.Fatalf("claimed %d after RunNow, want 2", len(cs))
	}
	for _, c := range cs {
		want := later
		if c.ID == "plain" {
			want = time.Unix(later.Unix(), 0)
		}
		if !c.Due.Equal(want) || c.Type != map[string]string{"r": "t", "plain": ""}[c.ID] {
			t.Fatalf("RunNow changed the occurrence: %+v", c)
		}
		// Waiting for its retry, then rescheduled: the same occurrence.
		must(t, b.Retry(ctx, c, time.Now().Add(time.Hour)))
	}
	soon := time.UnixMilli(time.Now().Add(-time.Millisecond).UnixMilli())
	n, err = b.Reschedule(ctx, soon, "r", "s", "plain")
	must(t, err)
	if n != 3 {
		t.Fatalf("Reschedule moved %d, want 3", n)
	}
	cs, err = b.Claim(ctx, 10)
	must(t, err)
	got := map[string]Claim{}
	for _, c := range cs {
		got[c.ID] = c
	}
	if !got["r"].Due.Equal(later) || got["r"].Attempt != 2 || !got["s"].Due.Equal(soon) || got["s"].Attempt != 1 ||
		got["plain"].Attempt != 2 || !got["plain"].Due.Equal(time.Unix(later.Unix(), 0)) {
		t.Fatalf("after Reschedule: %+v", got)
	}
	must(t, b.Schedule(ctx, Job{ID: "c1", RunAt: later}, Job{ID: "c2", RunAt: later}))
	if n, err := b.CancelMany(ctx, "c1", "c2", "c3"); err != nil || n != 2 {
		t.Fatalf("CancelMany: %d, %v", n, err)
	}
	_, err = b.Reschedule(ctx, time.Time{}, "r")
	wantErr(t, err, ErrRunAtRange)
	_, err = b.RunNow(ctx, "ok", "")
	wantErr(t, err, ErrEmptyID)
}

// RunNow and claims race on separate connections: every job is claimed
// once, and none is lost or left behind.
func TestRunNowRacesClaims(t *testing.T) {
	t.Parallel()
	b := newBroker(t, BrokerOptions{Lease: time.Minute})
	const n = 400
	var jobs []Job
	var ids []string
	for i := range n {
		id := "j" + strconv.Itoa(i)
		ids = append(ids, id)
		jobs = append(jobs, Job{ID: id, RunAt: time.Now().Add(time.Hour), Type: "t"})
	}
	must(t, b.Schedule(ctx, jobs...))
	var mu sync.Mutex
	seen := map[string]int{}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		bb, err := NewBroker(ownConn(t), b.opts)
		if err != nil {
			t.Error(err)
			return
		}
		for i := 0; i < n; i += 20 {
			if _, err := bb.RunNow(ctx, ids[i:i+20]...); err != nil {
				t.Error(err)
			}
		}
	}()
	onOwnConns(t, 6, b.opts, func(_ int, bb *Broker) {
		deadline := time.Now().Add(10 * time.Second)
		for time.Now().Before(deadline) {
			cs, err := bb.Claim(ctx, 7)
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			for _, c := range cs {
				seen[c.ID]++
			}
			done := len(seen) == n
			mu.Unlock()
			if done {
				return
			}
		}
	})
	wg.Wait()
	eachOnce(t, seen, n, "claimed")
	if l, err := b.List(ctx, StateInFlight, ListOptions{Limit: MaxListLimit}); err != nil || len(l.Jobs) != n {
		t.Fatalf("in flight: %d, %v", len(l.Jobs), err)
	}
}

// Doctor flags a server clock far from this machine's (here: this
// machine's clock made two seconds slow).
func TestDoctorClockSkew(t *testing.T) {
	b := newBroker(t, BrokerOptions{})
	check := func() *Problem {
		cs, err := b.Doctor(ctx, DoctorOptions{})
		must(t, err)
		for _, c := range cs {
			if c.Check == "clock" {
				return c.Issue
			}
		}
		t.Fatal("no clock check")
		return nil
	}
	if p := check(); p != nil {
		t.Fatalf("clock problem on this machine: %+v", p)
	}
	doctorNow = func() time.Time { return time.Now().Add(-2 * time.Second) }
	defer func() { doctorNow = time.Now }()
	p := check()
	if p == nil || !strings.Contains(p.Fix, "NTP") {
		t.Fatalf("a 2 s skew: %+v", p)
	}
	// The skew is measured over a round trip: on a loaded machine it reads
	// +1.9988s as well as +2.0004s.
	m := regexp.MustCompile(`clock is \+(\S+s) from`).FindStringSubmatch(p.Detail)
	if m == nil {
		t.Fatalf("a 2 s skew: %+v", p)
	}
	if d, err := time.ParseDuration(m[1]); err != nil || d < 1750*time.Millisecond || d > 2250*time.Millisecond {
		t.Fatalf("a 2 s skew measured as %s: %+v", m[1], p)
	}
}

// DueCounts buckets the scheduled jobs of every shard by due time; bad
// arguments are refused.
func TestDueCounts(t *testing.T) {
	t.Parallel()
	b := newBroker(t, BrokerOptions{Shards: 3})
	start := time.Now().Truncate(time.Second).Add(time.Hour)
	var jobs []Job
	for i := range 300 { // 10 in each of 30 one-minute buckets
		jobs = append(jobs, Job{ID: "d" + strconv.Itoa(i), RunAt: start.Add(time.Duration(i/10)*time.Minute + time.Duration(i%10)*time.Second), Type: "t"})
	}
	jobs = append(jobs, Job{ID: "edge", RunAt: start.Add(40 * time.Minute), Type: "t"}) // the start of bucket 40
	must(t, b.Schedule(ctx, jobs...))
	counts, err := b.DueCounts(ctx, start, time.Minute, 41)
	must(t, err)
	for i, n := range counts {
		want := int64(0)
		switch {
		case i < 30:
			want = 10
		case i == 40:
			want = 1
		}
		if n != want {
			t.Fatalf("bucket %d holds %d jobs, want %d (%v)", i, n, want, counts)
		}
	}
	for _, bad := range []struct {
		step time.Duration
		n    int
	}{{time.Minute, 0}, {time.Minute, MaxDueBuckets + 1}, {0, 10}, {time.Microsecond, 10}} {
		if _, err := b.DueCounts(ctx, start, bad.step, bad.n); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("DueCounts(step %v, n %d): %v, want ErrInvalidArgument", bad.step, bad.n, err)
		}
	}
}
