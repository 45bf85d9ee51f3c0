package zclaim

// Counts of a schedule at one instant.

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"sync/atomic"
	"time"
)

// Stats are counts of one schedule at one instant of Redis time.
type Stats struct {
	Scheduled int64     // jobs on the schedule
	Due       int64     // of those, due now
	Inflight  int64     // jobs claimed and not yet settled (those of a dispatcher's batch claims included)
	Expired   int64     // of those, past their lease and waiting for recovery
	Dead      int64     // jobs in the dead set
	Next      time.Time // due time of the earliest scheduled job; zero if none
	// OldestDue is how long the earliest scheduled job has been due, by
	// Redis' clock; zero when none is due.
	OldestDue time.Duration
	// StateLost is when this Broker last noticed that the server lost the
	// schedule's keys (restarted without persistence, flushed, failed over
	// to a replica that lacked them); zero if never. Counts read after a
	// loss describe what is left.
	StateLost time.Time
	// Running and Abandoned count, with BrokerOptions.Runs, the runs of
	// asynq tasks active now: running under the middleware, or abandoned
	// by a worker that is gone (taken over or about to be). Zero without.
	Running, Abandoned int64
}

// Stats returns the schedule's counts.
func (b *Broker) Stats(ctx context.Context) (Stats, error) {
	if err := ctx.Err(); err != nil {
		return Stats{}, wrap(ctx, "stats", err, nil)
	}
	cmds := b.eachShard(ctx, statsScript, func(k *keys) ([]string, []any) {
		return []string{k.schedule, k.inflight, k.dead, k.batches, k.runs, k.marker}, []any{b.ups}
	})
	st := Stats{}
	var next, now float64
	hasNext := false
	for i, cmd := range cmds {
		raw, err := cmd.Slice()
		if err != nil {
			return Stats{}, wrap(ctx, "stats", err, b.shards[i].types)
		}
		if len(raw) != 8 {
			return Stats{}, zerr("zclaim: stats: %w: reply of %d values", ErrCorrupt, len(raw))
		}
		// Shard 0's state marker came with its counts; only one that is
		// not the marker this Broker knows costs another round trip.
		if marker, _ := raw[7].(string); i == 0 && !b.state.knows(marker) {
			if _, err := b.state.check(ctx); err != nil {
				return Stats{}, wrap(ctx, "stats", err, nil)
			}
		}
		for j, p := range []*int64{&st.Scheduled, &st.Due, &st.Inflight, &st.Expired, &st.Dead} {
			n, _ := raw[j].(int64)
			*p += n
		}
		if s, ok := raw[5].(string); ok {
			if f, err := strconv.ParseFloat(s, 64); err == nil && (!hasNext || f < next) {
				next, hasNext = f, true
			}
		}
		if s, ok := raw[6].(string); ok {
			now, _ = strconv.ParseFloat(s, 64)
		}
	}
	st.StateLost, _ = b.state.lost()
	if b.opts.Runs != nil {
		// A queue whose active tasks cannot be listed (its active list of
		// another type, say) is passed over: the others' runs are counted.
		runs, _, err := b.opts.Runs.Runs(ctx, "", 0)
		var queueErr *QueueError
		if err != nil && !errors.As(err, &queueErr) {
			return Stats{}, err
		}
		for _, r := range runs {
			switch r.State {
			case RunLive:
				st.Running++
			case RunAbandoned, RunTakenOver:
				st.Abandoned++
			}
		}
	}
	if hasNext {
		st.Next = b.scoreTime(strconv.FormatFloat(next, 'f', -1, 64))
		if now > next {
			st.OldestDue = seconds((now - next) / float64(b.ups))
		}
	}
	return st, nil
}

// lagBuckets are the upper bounds of the buckets of DispatcherStats.Lag
// (LagBuckets returns a copy).
var lagBuckets = []time.Duration{
	time.Millisecond, 2500 * time.Microsecond, 5 * time.Millisecond, 10 * time.Millisecond, 25 * time.Millisecond,
	50 * time.Millisecond, 100 * time.Millisecond, 250 * time.Millisecond, 500 * time.Millisecond,
	time.Second, 2500 * time.Millisecond, 5 * time.Second, 10 * time.Second, 30 * time.Second, time.Minute,
}

// LagHistogram is a distribution of durations over LagBuckets().
type LagHistogram struct {
	// Counts[i] is how many durations were at most LagBuckets()[i]
	// (cumulative, as Prometheus counts them).
	Counts []uint64
	Count  uint64        // durations observed, those beyond the last bucket included
	Sum    time.Duration // their sum
}

// lagHistogram counts durations into lagBuckets without a lock.
type lagHistogram struct {
	counts [16]atomic.Uint64 // per bucket, the last one past every bound
	sum    atomic.Int64
}

func (h *lagHistogram) observe(d time.Duration) {
	d = max(d, 0)
	i := 0
	for i < len(lagBuckets) && d > lagBuckets[i] {
		i++
	}
	h.counts[i].Add(1)
	h.sum.Add(int64(d))
}

func (h *lagHistogram) snapshot() LagHistogram {
	out := LagHistogram{Counts: make([]uint64, len(lagBuckets)), Sum: time.Duration(h.sum.Load())}
	for i := range h.counts {
		out.Count += h.counts[i].Load()
		if i < len(lagBuckets) {
			out.Counts[i] = out.Count
		}
	}
	return out
}

// LagBuckets returns the upper bounds of the buckets of DispatcherStats.Lag
// (LagHistogram.Counts[i] counts durations of at most LagBuckets()[i]).
func LagBuckets() []time.Duration { return slices.Clone(lagBuckets) }
