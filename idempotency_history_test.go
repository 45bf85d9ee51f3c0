package zclaim

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// whats lists a History's steps, as "started failed ...".
func whats(h []Event) string {
	var w []string
	for _, e := range h {
		w = append(w, e.What)
	}
	return strings.Join(w, " ")
}

// A key's history tells each step of its runs, written by the scripts of
// the steps: a failure with its error, a skip while another run holds the
// key, a takeover (from which token, after how long), the finish, a skip
// once done, and a late Complete of the run taken over (its lease lost);
// each run's start comes from its token, with the process that ran it.
func TestRunHistory(t *testing.T) {
	t.Parallel()
	rdb := newClient(t)
	// A lease that a starved test's next Begin does not outlive.
	i := newIdem(t, rdb, IdempotencyOptions{Lease: 300 * time.Millisecond})
	const key = "order-7@2026-12-07T10:00:00.000Z"

	e1, err := i.Begin(ctx, key)
	must(t, err)
	must(t, e1.release(ctx, "smtp: 451\x1etry later", false))
	e2, err := i.Begin(ctx, key)
	must(t, err)
	var ip *InProgressError
	if _, err := i.Begin(ctx, key); !errors.As(err, &ip) {
		t.Fatalf("Begin while e2 runs: %v, want InProgressError", err)
	}
	time.Sleep(350 * time.Millisecond) // e2's lease runs out
	bucket, field := i.doneOf(key)
	raw, err := takeoverScript.Run(ctx, rdb, []string{i.recordKey(key), bucket, historyOf(bucket, i.Prefix())},
		strconv.FormatInt(e2.Token, 10), 60000, 300, field, 60000, "taker:42").Int64Slice()
	must(t, err)
	if raw[0] != 1 {
		t.Fatalf("takeover: %v", raw)
	}
	e3, err := i.Begin(ctx, key)
	must(t, err)
	must(t, e3.Complete(ctx))
	if _, err := i.Begin(ctx, key); !errors.Is(err, ErrAlreadyDone) {
		t.Fatalf("Begin once done: %v", err)
	}
	if err := e2.Complete(ctx); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("e2's late Complete: %v", err)
	}

	h, took, err := runEvents(ctx, i, key)
	must(t, err)
	const want = "started failed started skipped taken over started finished skipped lease lost"
	if got := whats(h); got != want {
		t.Fatalf("history %q, want %q: %+v", got, want, h)
	}
	me := thisProcess()
	checks := []struct {
		n     int
		token int64
		by    string
		in    string
	}{
		{0, e1.Token, me, "token " + strconv.FormatInt(e1.Token, 10)},
		{1, e1.Token, me, "smtp: 451 try later"}, // the separator made a space
		{2, e2.Token, me, ""},
		{3, e2.Token, me, "running it elsewhere"},
		{4, e2.Token, "taker:42", "from token " + strconv.FormatInt(e2.Token, 10)},
		{6, e3.Token, me, "token " + strconv.FormatInt(e3.Token, 10) + " on " + me},
		{7, 0, me, "had finished"},
		{8, e2.Token, me, "at its complete"},
	}
	for _, c := range checks {
		e := h[c.n]
		if e.Token != c.token || e.By != c.by || !strings.Contains(e.Detail, c.in) {
			t.Errorf("event %d: %+v, want token %d by %q saying %q", c.n, e, c.token, c.by, c.in)
		}
	}
	if !h[0].At.Equal(time.UnixMicro(e1.Token)) {
		t.Errorf("e1 started at %v, want its token's time", h[0].At)
	}
	for n := 1; n < len(h); n++ { // events keep their millisecond, starts their token's microsecond
		if h[n].At.Before(h[n-1].At.Truncate(time.Millisecond)) {
			t.Errorf("event %d (%s) before event %d (%s)", n, h[n].At, n-1, h[n-1].At)
		}
	}
	if took == nil || took.From != e2.Token || took.By != "taker:42" || took.Silent < 10*time.Millisecond {
		t.Errorf("takeover %+v", took)
	}

	// Bounded: a key skipped many times keeps its newest events within 1 KB.
	for range 100 {
		if _, err := i.Begin(ctx, key); !errors.Is(err, ErrAlreadyDone) {
			t.Fatal(err)
		}
	}
	v, err := rdb.HGet(ctx, historyOf(bucket, i.Prefix()), field).Result()
	must(t, err)
	if len(v) > 1024 {
		t.Errorf("history of %d bytes", len(v))
	}
	if h, _, _ := runEvents(ctx, i, key); len(h) < 5 || h[len(h)-1].What != "skipped" {
		t.Errorf("bounded history: %q", whats(h))
	}

	// NoHistory: nothing written.
	off := newIdem(t, rdb, IdempotencyOptions{Prefix: i.Prefix() + "off:", NoHistory: true})
	e, err := off.Begin(ctx, "k")
	must(t, err)
	must(t, e.release(ctx, "boom", false))
	e, err = off.Begin(ctx, "k")
	must(t, err)
	must(t, e.Complete(ctx))
	if h, _, err := runEvents(ctx, off, "k"); err != nil || len(h) != 0 {
		t.Errorf("NoHistory: %q, %v", whats(h), err)
	}
}

// A run's finished event is timed by Redis' clock as the client reads it: no
// later than Redis' time when complete.lua ran, so no event written after it
// reads earlier, even when Begin's request was slow to reach Redis (a
// loaded client: here 25 ms late), and no earlier than its start.
func TestRunHistoryFinishedTime(t *testing.T) {
	t.Parallel()
	rdb := newClient(t)
	late := &lateCalls{d: 25 * time.Millisecond}
	rdb.AddHook(late)
	i := newIdem(t, rdb, IdempotencyOptions{})
	late.on.Store(true)
	e, err := i.Begin(ctx, "k")
	late.on.Store(false)
	must(t, err)
	must(t, e.Complete(ctx))
	after, err := rdb.Time(ctx).Result()
	must(t, err)
	h, _, err := runEvents(ctx, i, "k")
	must(t, err)
	if got := whats(h); got != "started finished" {
		t.Fatalf("history %q", got)
	}
	if f := h[1].At; f.After(after) || f.Before(h[0].At.Truncate(time.Millisecond)) {
		t.Errorf("finished at %s: not within its start %s and Redis' time after it %s", f, h[0].At, after)
	}
}

// lateCalls holds each command d before sending it while on.
type lateCalls struct {
	d  time.Duration
	on atomic.Bool
}

func (l *lateCalls) DialHook(next redis.DialHook) redis.DialHook { return next }

func (l *lateCalls) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if l.on.Load() {
			time.Sleep(l.d)
		}
		return next(ctx, cmd)
	}
}

func (l *lateCalls) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if l.on.Load() {
			time.Sleep(l.d)
		}
		return next(ctx, cmds)
	}
}

// The Complete that sweeps a bucket's finished records past Retention drops
// the histories whose newest event is as old, and keeps the others.
func TestRunHistorySwept(t *testing.T) {
	t.Parallel()
	rdb := newClient(t)
	// Windows wide enough that a starved test does not outlive the new
	// run's records (they expire Retention + Lease after its Complete).
	i := newIdem(t, rdb, IdempotencyOptions{Lease: 50 * time.Millisecond, Retention: 250 * time.Millisecond, DoneBuckets: 1})
	i.sweepOdds = 1 // every Complete sweeps
	run := func(key string) {
		e, err := i.Begin(ctx, key)
		must(t, err)
		must(t, e.Complete(ctx))
	}
	run("old")
	time.Sleep(350 * time.Millisecond) // past Lease + Retention
	run("new")
	bucket, _ := i.doneOf("old")
	n, err := rdb.HLen(ctx, historyOf(bucket, i.Prefix())).Result()
	must(t, err)
	h, _, err := runEvents(ctx, i, "new")
	must(t, err)
	if n != 1 || whats(h) != "started finished" {
		t.Fatalf("after the sweep: %d histories, new's %q", n, whats(h))
	}
	// -1: no expiry (-2: already expired, on a slow machine).
	if ttl, err := rdb.Do(ctx, "PTTL", historyOf(bucket, i.Prefix())).Int(); err != nil || ttl == -1 || ttl > 300 {
		t.Fatalf("the swept histories expire in %d ms (%v), want Retention + Lease", ttl, err)
	}
}
