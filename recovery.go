package zclaim

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"
)

// maxDelays bounds the backoff ranges handed to one recovery script; later
// attempts reuse the last one.
const maxDelays = 64

// jitterDraws is how many times a pass draws Backoff per attempt to find
// the range its jobs' delays are spread over.
const jitterDraws = 4

// Recovered counts what one recovery pass did.
type Recovered struct {
	Requeued int // expired runs put back on the schedule (or covered by a newer entry of the same id)
	Dead     int // expired runs that had spent their attempts, now in the dead set
	Trimmed  int // jobs removed from the dead set: dead longer than DeadRetention, or the oldest beyond DeadMax
	scanned  int
	marker   string // the schedule's state marker, read with the pass
}

// Recover runs one bounded recovery pass: up to BatchSize in-flight runs
// whose lease has passed by Redis' clock go back to the schedule after
// their backoff (each its own, spread over the range of a few draws of
// BrokerOptions.Backoff), or to the dead set with the reason "lease expired" when
// they were on their last attempt. Their tokens are voided either way, so
// a late Ack, Extend, Retry or Kill by the old holder gets ErrLeaseLost.
//
// The pass then trims the dead set, up to BatchSize jobs: those dead for
// longer than DeadRetention, then the oldest deaths beyond DeadMax.
func (b *Broker) Recover(ctx context.Context) (Recovered, error) {
	if err := ctx.Err(); err != nil {
		return Recovered{}, wrap(ctx, "recover", err, nil)
	}
	deadMax, deadKeep := int64(-1), int64(-1)
	if b.opts.DeadMax >= 0 { // shared among the shards
		deadMax = int64((b.opts.DeadMax + len(b.shards) - 1) / len(b.shards))
	}
	if b.opts.DeadRetention >= 0 {
		deadKeep = ms(b.opts.DeadRetention)
	}
	n := min(b.opts.MaxAttempts, maxDelays)
	bucket, expire := b.history.bucket(time.Now())
	args := make([]any, 0, 8+2*n)
	args = append(args, b.opts.BatchSize, b.ups, b.opts.MaxAttempts, "", deadMax, deadKeep, 1+rand.Int64N(1<<31-2), expire)
	for a := 1; a <= n; a++ {
		// The range of the backoff, from a few draws: a fixed Backoff
		// stays fixed, a jittered one spreads the jobs of one pass.
		lo := b.opts.Backoff(a)
		hi := lo
		for range jitterDraws - 1 {
			d := b.opts.Backoff(a)
			lo, hi = min(lo, d), max(hi, d)
		}
		args = append(args, strconv.FormatInt(lo.Milliseconds(), 10), strconv.FormatInt(hi.Milliseconds(), 10))
	}
	// Every shard, each its own pass (with one shard, one call); the state
	// marker is shard 0's.
	shardArgs := func(k *keys) ([]string, []any) {
		a := append([]any(nil), args...)
		a[3] = b.notice(k)
		keys := append(k.settleKeys(), k.batches, k.marker)
		if b.history.keep > 0 {
			keys = append(keys, k.sent+bucket)
		}
		return keys, a
	}
	cmds := b.writeShards(ctx, recoverScript, b.shards, shardArgs)
	var r Recovered
	for i, cmd := range cmds {
		k := b.shards[i]
		raw, err := cmd.Slice()
		if err != nil {
			return r, wrap(ctx, "recover", err, k.types)
		}
		if len(raw) != 5 {
			return r, zerr("zclaim: recover: %w: reply of %d values", ErrCorrupt, len(raw))
		}
		n4 := make([]int64, 4)
		for i := range n4 {
			n4[i], _ = raw[i].(int64)
		}
		r.Requeued += int(n4[0])
		r.Dead += int(n4[1])
		r.scanned = max(r.scanned, int(n4[2]))
		r.Trimmed += int(n4[3])
		b.recovered.requeued.Add(n4[0])
		b.recovered.dead.Add(n4[1])
		b.recovered.trimmed.Add(n4[3])
		if k.shard == 0 {
			r.marker, _ = raw[4].(string)
		}
	}
	if r.scanned > 0 {
		b.log.LogAttrs(ctx, slog.LevelInfo, "zclaim: recovered expired leases",
			slog.String("key", b.opts.Key), slog.Int("requeued", r.Requeued), slog.Int("dead", r.Dead))
	}
	if r.Trimmed > 0 {
		b.log.LogAttrs(ctx, slog.LevelInfo, "zclaim: trimmed the dead set",
			slog.String("key", b.keys.dead), slog.Int("removed", r.Trimmed))
	}
	return r, nil
}

// RecoveryStats returns what this Broker's recovery passes (Recover and
// RunRecovery) did since it was made, summed.
func (b *Broker) RecoveryStats() Recovered {
	return Recovered{Requeued: int(b.recovered.requeued.Load()), Dead: int(b.recovered.dead.Load()),
		Trimmed: int(b.recovered.trimmed.Load())}
}

// serverCheckInterval is how often RunRecovery checks the server's
// eviction policy again (a variable for the tests).
var serverCheckInterval = time.Minute

// DefaultRecoveryInterval is RunRecovery's interval when every is not positive.
const DefaultRecoveryInterval = time.Second

// quietRecovery is the longest a recovery loop rests while its Broker's
// claims find nothing due and nothing in flight.
const quietRecovery = 30 * time.Second

// RunRecovery runs Recover every interval until ctx is done, and at once
// again after a pass that found a full batch (of expired leases, or of dead
// jobs to trim). While this Broker's claims find nothing due and nothing in
// flight (an idle dispatcher), passes rest, for up to 30 s. Errors are
// logged and the
// loop goes on. It returns nil when ctx is done. every <= 0 means
// DefaultRecoveryInterval.
func (b *Broker) RunRecovery(ctx context.Context, every time.Duration) error {
	if every <= 0 {
		every = DefaultRecoveryInterval
	}
	t := time.NewTimer(0)
	defer t.Stop()
	var checked, lastPass time.Time
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		// The server's settings can change while it runs (CONFIG SET).
		if time.Since(checked) >= serverCheckInterval {
			checked = time.Now()
			if err := checkServer(ctx, b.rdb, b.keys.schedule, b.opts.AllowEviction, false, b.log); err != nil {
				b.log.LogAttrs(ctx, slog.LevelError, "zclaim: "+strings.TrimPrefix(err.Error(), "zclaim: "),
					slog.String("key", b.keys.schedule))
			}
		}
		// A schedule whose last claims found nothing due and nothing in
		// flight has nothing to recover: an idle dispatcher rests, and
		// looks again at least every quietRecovery.
		if b.quietShards.all() && time.Since(lastPass) < quietRecovery {
			t.Reset(every)
			continue
		}
		lastPass = time.Now()
		r, err := b.Recover(ctx)
		// So can its state (a restart without persistence, a failover):
		// the pass read the marker; only another one costs a round trip.
		if err == nil && !b.state.knows(r.marker) {
			b.state.check(ctx)
		}
		switch {
		case err != nil && ctx.Err() == nil:
			b.log.LogAttrs(ctx, slog.LevelWarn, "zclaim: recovery pass failed",
				slog.String("key", b.keys.schedule), slog.String("error", err.Error()))
			t.Reset(every)
		case r.scanned >= b.opts.BatchSize || r.Trimmed >= b.opts.BatchSize:
			t.Reset(0)
		default:
			t.Reset(every)
		}
	}
}
