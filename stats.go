package zclaim

// Counts of a schedule at one instant.

import (
	"context"
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
	// StateLost is when this Broker last noticed that the server lost the
	// schedule's keys (restarted without persistence, flushed, failed over
	// to a replica that lacked them); zero if never. Counts read after a
	// loss describe what is left.
	StateLost time.Time
}

// Stats returns the schedule's counts.
func (b *Broker) Stats(ctx context.Context) (Stats, error) {
	if err := ctx.Err(); err != nil {
		return Stats{}, wrap(ctx, "stats", err, nil)
	}
	raw, err := statsScript.Run(ctx, b.rdb, []string{b.keys.schedule, b.keys.inflight, b.keys.dead, b.keys.batches, b.keys.runs, b.keys.marker}, b.ups).Slice()
	if err != nil {
		return Stats{}, wrap(ctx, "stats", err, b.keys.types)
	}
	if len(raw) != 8 {
		return Stats{}, zerr("zclaim: stats: %w: reply of %d values", ErrCorrupt, len(raw))
	}
	// The state marker came with the counts; only one that is not the
	// marker this Broker knows costs another round trip.
	if marker, _ := raw[7].(string); marker == "" || marker != b.state.current() {
		if _, err := b.state.check(ctx); err != nil {
			return Stats{}, wrap(ctx, "stats", err, nil)
		}
	}
	st := Stats{}
	st.StateLost, _ = b.state.lost()
	for i, p := range []*int64{&st.Scheduled, &st.Due, &st.Inflight, &st.Expired, &st.Dead} {
		*p, _ = raw[i].(int64)
	}
	if next, ok := raw[5].(string); ok {
		st.Next = b.scoreTime(next)
	}
	return st, nil
}
