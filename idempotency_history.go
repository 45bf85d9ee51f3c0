package zclaim

// A run key's history: the events the store's scripts write as its runs
// go (history.lua), read back for Broker.Jobs, Runs and zclaim show.
//
// begin.lua notes a run skipped (its key done, or running elsewhere),
// settle.lua a failure and a lost lease, complete.lua the finish (or a
// lost lease), takeover.lua a takeover: each in the script that already
// runs for that step, so the success path gains no round trip. A key's
// events are one field (the key's digest, as its finished record's) of a
// hash beside its bucket of finished records, in the same slot: a lookup
// is one HGET. The sweep that drops a bucket's expired finished records
// (one Complete in 32) drops the histories whose newest event is as old,
// and sets the hash to expire Retention + Lease later, as every event off
// the success path does: a Complete's "finished" alone is one HSETNX, its
// time the client's reading of Redis' clock (the run's token and the time
// since), made whole by the client, so that path asks Redis for nothing
// more. A hash not swept yet keeps what it holds until it is (about 32
// runs' worth). A run's start is its token (Redis' TIME in µs at Begin),
// which each of its events carries: the start costs no write of its own.

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// historyOf names the history bucket beside bucket, a bucket of finished
// records of the store with prefix: "<prefix>\x00done:h:..." where the
// bucket is "<prefix>\x00done:...", in its slot.
func historyOf(bucket, prefix string) string {
	return prefix + doneInfix + ":h" + bucket[len(prefix)+len(doneInfix):]
}

// rawEvent is one event as history.lua writes it.
type rawEvent struct {
	ms     int64  // when, by Redis' clock
	kind   byte   // what (one letter)
	a      string // the occurrence's due in ms (the schedule's), or a run's token (a store's)
	detail string
}

// parseEvents reads a history field, oldest first; it passes over what it
// cannot read.
func parseEvents(v string, into []rawEvent) []rawEvent {
	for ev := range strings.SplitSeq(v, "\x1e") {
		f := strings.SplitN(ev, "\x1f", 4)
		if len(f) != 4 || len(f[1]) != 1 {
			continue
		}
		ms, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			continue
		}
		into = append(into, rawEvent{ms: ms, kind: f[1][0], a: f[2], detail: f[3]})
	}
	return into
}

// eventText makes s fit an event's detail: without the separators, at
// most 200 bytes.
func eventText(s string) string {
	s = strings.Map(func(r rune) rune {
		if r == 0x1e || r == 0x1f || r == 0 {
			return ' '
		}
		return r
	}, s)
	if len(s) > 200 {
		s = strings.ToValidUTF8(s[:197], "") + "..."
	}
	return s
}

// runEvents reads the history of key from store i: its events, oldest
// first, and its last takeover (nil for none).
func runEvents(ctx context.Context, i *Idempotency, key string) ([]Event, *Takeover, error) {
	bucket, field := i.doneOf(key)
	v, err := i.rdb.HGet(ctx, historyOf(bucket, i.opts.Prefix), field).Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, nil, wrap(ctx, "job", err, nil)
	}
	ev, took := runStory(parseEvents(v, nil))
	return ev, took, nil
}

// runStory tells a run key's raw events as a History, with each run's
// start (its token's time) before the first event that names its token,
// and returns its last takeover.
func runStory(raw []rawEvent) ([]Event, *Takeover) {
	// The process that ran each token's run, told by an event of its own.
	ran := map[string]string{}
	for _, r := range raw {
		if by, _, _ := strings.Cut(r.detail, "\x00"); strings.IndexByte("frRl", r.kind) >= 0 && ran[r.a] == "" {
			ran[r.a] = by
		}
	}
	var out []Event
	var took *Takeover
	started := map[int64]bool{}
	for _, r := range raw {
		tok, _ := strconv.ParseInt(r.a, 10, 64)
		by, text, _ := strings.Cut(r.detail, "\x00")
		e := Event{At: time.UnixMilli(r.ms), Token: tok, By: by}
		switch r.kind {
		case 'f':
			e.What, e.Detail = "finished", "token "+r.a+" on "+by
		case 'r', 'R':
			e.What, e.Detail = "failed", text
			if r.kind == 'R' {
				e.Detail += " (its task is not retried)"
			}
		case 'l':
			e.What, e.Detail = "lease lost", "token "+r.a+" on "+by+" found another run at its "+text
		case 'k':
			e.What, e.Detail = "skipped", "on "+by+": the work had finished"
		case 'w':
			e.What, e.Detail = "skipped", "on "+by+": token "+r.a+" was running it elsewhere"
		case 'T':
			silent, _ := strconv.ParseInt(text, 10, 64)
			took = &Takeover{At: e.At, By: by, From: tok, Silent: time.Duration(silent) * time.Millisecond}
			e.What, e.Detail = "taken over", took.String()
		default:
			continue
		}
		if tok > 0 && !started[tok] {
			started[tok] = true
			s := Event{At: time.UnixMicro(tok), What: "started", Token: tok, By: ran[r.a], Detail: "token " + r.a}
			if s.By != "" {
				s.Detail += " on " + s.By
			}
			out = append(out, s)
		}
		out = append(out, e)
	}
	return out, took
}
