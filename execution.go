package zclaim

// A run of a key: its Execution, and the calls that renew, complete or
// release its lease.

import (
	"context"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// execution is a run of key under token tok, with the keys of its records.
func (i *Idempotency) execution(key string, tok int64) *Execution {
	bucket, field := i.doneOf(key)
	keys := []string{i.recordKey(key), bucket}
	if !i.opts.NoHistory {
		keys = append(keys, historyOf(bucket, i.opts.Prefix))
	}
	return &Execution{Key: key, Token: tok, i: i, keys: keys, field: field}
}

// LeaseUntil is the lease deadline by Redis' clock as of the last Begin or Extend.
func (e *Execution) LeaseUntil() time.Time {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.leaseUntil
}

// settle runs settle.lua's op (extend, release) for e, or complete.lua for
// "complete". The record it leaves (running, released, or the bucket of
// finished ones) lives Lease + Retention. why is a release's failure, for
// the key's history.
func (e *Execution) settle(ctx context.Context, op, why string) (int64, error) {
	if err := ctx.Err(); err != nil {
		return 0, wrap(ctx, op, err, nil)
	}
	var cmd *redis.Cmd
	if op == "complete" {
		cmd = e.i.script(ctx, e.i.complete, e.keys, e.completeArgs()...)
	} else {
		cmd = e.i.script(ctx, e.i.settle, append(e.keys[:1:1], e.keys[2:]...), e.Token, op, e.field, thisProcess(),
			eventText(why))
	}
	return e.settled(ctx, op, cmd)
}

// completeArgs are complete.lua's arguments for e.
func (e *Execution) completeArgs() []any {
	e.mu.Lock()
	dl := e.leaseUntil.UnixMilli()
	e.mu.Unlock()
	// The run record as Begin or this run's last Extend left it:
	// complete.lua's fence is then one comparison.
	rec := strconv.AppendInt(append(strconv.AppendInt(append(make([]byte, 0, 40), "run "...), e.Token, 10), ' '), dl, 10)
	// The finished event (history.lua's form), at Redis' time as this
	// process reads it: its token is Redis' time at Begin (µs), and the
	// time since Begin's reply is the client's. That is no later than
	// Redis' clock when complete.lua runs (so no event written after it
	// reads earlier) and no earlier than the token, a round trip early at
	// most.
	ev := ""
	if len(e.keys) > 2 {
		at := time.UnixMicro(e.Token)
		if !e.replied.IsZero() {
			at = at.Add(time.Since(e.replied))
		}
		tok := strconv.FormatInt(e.Token, 10)
		ev = strconv.FormatInt(at.UnixMilli(), 10) + "\x1ff\x1f" + tok + "\x1f" + thisProcess() + "\x00\x1e"
	}
	args := []any{rec, e.field, dl, thisProcess(), ev}
	if e.i.sweepOdds <= 1 || rand.IntN(e.i.sweepOdds) == 0 {
		args = append(args, 1)
	}
	return args
}

// settled reads the reply of e's op: the number it returned, or
// ErrLeaseLost when the token was not current.
func (e *Execution) settled(ctx context.Context, op string, cmd *redis.Cmd) (int64, error) {
	reply, err := cmd.Result()
	if err != nil {
		return 0, e.i.wrap(ctx, op, e.keys, err)
	}
	n, ok := reply.(int64)
	if !ok {
		return 0, zerr("zclaim: %s: %w: reply %v", op, ErrCorrupt, reply)
	}
	if n == 0 {
		e.i.state.check(context.WithoutCancel(ctx))
		lost := e.state != "" && e.i.state.current() != e.state
		return 0, &LeaseLostError{Op: op, ID: e.Key, StateLost: lost}
	}
	return n, nil
}

// Extend renews the lease for another Lease from now by Redis' clock. It
// returns ErrLeaseLost, changing nothing, when another run has taken the key.
func (e *Execution) Extend(ctx context.Context) error {
	dl, err := e.settle(ctx, "extend", "")
	if err == nil {
		e.mu.Lock()
		e.leaseUntil = time.UnixMilli(dl)
		e.mu.Unlock()
	}
	return err
}

// Complete marks the key finished; it is kept for Retention. It returns
// ErrLeaseLost, changing nothing, when this run's token is no longer current.
func (e *Execution) Complete(ctx context.Context) error {
	_, err := e.settle(ctx, "complete", "")
	return err
}

// Release gives the key up without finishing it, so that the next run can
// start at once. It returns ErrLeaseLost, changing nothing, when this run's
// token is no longer current.
func (e *Execution) Release(ctx context.Context) error {
	_, err := e.settle(ctx, "release", "released")
	return err
}

// release releases the key after its handler failed with why; final: a
// failure that ends its task (asynq archives or revokes it), which the
// record says, so that a takeover leaves the task to asynq.
func (e *Execution) release(ctx context.Context, why string, final bool) error {
	op := "release"
	if final {
		op = "release-final"
	}
	_, err := e.settle(ctx, op, why)
	return err
}
