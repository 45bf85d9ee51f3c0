package zclaim

// The dispatcher's batches: each claim's jobs followed through the
// enqueueing workers, and their settling, gathered into one round trip.

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// ackLinger is how long the acker gathers finished batches before it
// settles them: one round trip costs Redis more than the batches in it,
// and a lease is long.
const ackLinger = 5 * time.Millisecond

// batchRun follows the jobs of one batch claim through the workers.
type batchRun struct {
	left   atomic.Int64 // jobs not yet dispatched
	noType atomic.Int64 // jobs dead for want of a task type
	mu     sync.Mutex
	end    batchEnd
}

// outcome is how one job's dispatch ended: done (the zero value), back to
// the schedule after retry, or dead with a reason (noType: for want of a
// task type).
type outcome struct {
	retry  time.Duration
	dead   string
	noType bool
}

// settled records the outcome of the job at place index; the last job of
// the batch hands the batch to the acker.
func (r *batchRun) settled(index int, o outcome, acks chan<- *batchRun) {
	if o.noType {
		r.noType.Add(1)
	}
	if o.retry > 0 || o.dead != "" {
		r.mu.Lock()
		if o.dead != "" {
			if r.end.dead == nil {
				r.end.dead = map[int]string{}
			}
			r.end.dead[index] = o.dead
		} else {
			if r.end.retry == nil {
				r.end.retry = map[int]time.Duration{}
			}
			r.end.retry[index] = o.retry
		}
		r.mu.Unlock()
	}
	if r.left.Add(-1) == 0 {
		acks <- r
	}
}

// acker settles finished batches from in, gathered over ackLinger, until
// in is closed.
func (d *Dispatcher) acker(in <-chan *batchRun) {
	batch := make([]batchEnd, 0, MaxBatchSize)
	linger := time.NewTimer(ackLinger)
	defer linger.Stop()
	for r := range in {
		d.logNoType(r)
		batch = append(batch[:0], r.end)
		resetTimer(linger, ackLinger)
	more:
		for len(batch) < MaxBatchSize {
			select {
			case r, ok := <-in:
				if !ok {
					break more
				}
				d.logNoType(r)
				batch = append(batch, r.end)
			case <-linger.C:
				break more
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), d.opts.EnqueueTimeout)
		lost, err := d.b.finishBatches(ctx, batch...)
		cancel()
		switch {
		case err != nil:
			// The batches stay in flight; after their lease, recovery puts
			// them back and the next dispatch of their jobs meets asynq's TaskID.
			d.log.LogAttrs(context.Background(), slog.LevelWarn,
				"zclaim: settling dispatched batches failed; recovery will settle them",
				slog.Int("batches", len(batch)), slog.String("error", err.Error()))
		case len(lost) > 0:
			// The enqueues outlived the lease and the jobs were recovered;
			// their next dispatch meets asynq's TaskID.
			d.log.LogAttrs(context.Background(), slog.LevelWarn,
				"zclaim: lease lost before dispatched batches were settled",
				slog.Int("batches", len(lost)), slog.Int("jobs", lost[0].lease.n))
		}
	}
}

// logNoType logs, once for the batch, the jobs of r that went to the dead
// set for want of a task type, with the fix.
func (d *Dispatcher) logNoType(r *batchRun) {
	if n := r.noType.Load(); n > 0 {
		d.log.LogAttrs(context.Background(), slog.LevelError,
			"zclaim: jobs without a task type sent to the dead set; set DispatcherOptions.DefaultType for members "+
				"added with a plain ZADD, then Broker.Revive them",
			slog.String("key", d.b.keys.schedule), slog.Int64("jobs", n))
	}
}

func resetTimer(t *time.Timer, d time.Duration) {
	t.Stop()
	select {
	case <-t.C:
	default:
	}
	t.Reset(d)
}
