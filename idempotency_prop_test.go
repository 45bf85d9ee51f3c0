package zclaim

import (
	"errors"
	"testing"
	"time"

	"pgregory.net/rapid"
)

// The run-record store against a model: random Begin, Extend, Complete,
// Release by current and stale holders, with waits that let 30 ms leases
// pass. At most one holder is current; tokens strictly increase; a stale
// holder's calls fail with ErrLeaseLost; a finished key stays finished.
func TestIdempotencyProperties(t *testing.T) {
	t.Parallel()
	rdb := newClient(t)
	const lease = 30 * time.Millisecond
	rapid.Check(t, func(rt *rapid.T) {
		i, err := NewIdempotency(rdb, IdempotencyOptions{Prefix: testKey(t) + ":", Lease: lease, Retention: time.Minute})
		if err != nil {
			rt.Fatal(err)
		}
		keys := rapid.SampledFrom([]string{"x", "y"})
		type rec struct {
			cur      *Execution // the running holder, if any
			done     bool
			deadline time.Time
			last     int64
		}
		model := map[string]*rec{"x": {}, "y": {}}
		var all []*Execution
		now := func() time.Time { n, _ := rdb.Time(ctx).Result(); return n }
		settle := func(rt *rapid.T, op string, call func(*Execution) error) {
			if len(all) == 0 {
				rt.Skip("no executions")
			}
			e := rapid.SampledFrom(all).Draw(rt, "exec")
			m := model[e.Key]
			err := call(e)
			if m.cur == e {
				if err != nil {
					rt.Fatalf("%s by the current holder: %v", op, err)
				}
				switch op {
				case "extend":
					m.deadline = e.LeaseUntil()
				case "complete":
					m.cur, m.done = nil, true
				case "release":
					m.cur = nil
				}
			} else if !errors.Is(err, ErrLeaseLost) {
				rt.Fatalf("%s by a stale holder: %v", op, err)
			}
		}
		rt.Repeat(map[string]func(*rapid.T){
			"begin": func(rt *rapid.T) {
				k := keys.Draw(rt, "key")
				m := model[k]
				before := now()
				e, err := i.Begin(ctx, k)
				after := now()
				switch {
				case m.done:
					if !errors.Is(err, ErrAlreadyDone) {
						rt.Fatalf("begin of a finished key: %v", err)
					}
					return
				case m.cur != nil && m.deadline.After(after):
					if !errors.Is(err, ErrInProgress) {
						rt.Fatalf("begin under a live lease: %v", err)
					}
					return
				case m.cur == nil || !m.deadline.After(before):
					if err != nil {
						rt.Fatalf("begin of a free key: %v", err)
					}
				default: // the lease ended during the call: either answer
					if errors.Is(err, ErrInProgress) {
						return
					}
					if err != nil {
						rt.Fatal(err)
					}
				}
				if e.Token <= m.last {
					rt.Fatalf("token %d after %d", e.Token, m.last)
				}
				m.cur, m.last, m.deadline = e, e.Token, e.LeaseUntil()
				all = append(all, e)
			},
			"extend":   func(rt *rapid.T) { settle(rt, "extend", func(e *Execution) error { return e.Extend(ctx) }) },
			"complete": func(rt *rapid.T) { settle(rt, "complete", func(e *Execution) error { return e.Complete(ctx) }) },
			"release":  func(rt *rapid.T) { settle(rt, "release", func(e *Execution) error { return e.Release(ctx) }) },
			"wait": func(rt *rapid.T) {
				time.Sleep(time.Duration(rapid.IntRange(0, 40).Draw(rt, "ms")) * time.Millisecond)
			},
		})
	})
}
