package zclaim

// The dispatcher's batches: each claim's jobs followed through the
// enqueueing workers, their leases kept while the enqueues go on, and
// their settling, gathered into one round trip.

import (
	"context"
	"log/slog"
	"time"
)

// ackLinger is how long the acker gathers finished batches before it
// settles them: one round trip costs Redis more than the batches in it,
// and a lease is long.
const ackLinger = 5 * time.Millisecond

// outcome is how one job's dispatch ended: done (the zero value), back to
// the schedule after retry, or dead with a reason (noType: for want of a
// task type).
type outcome struct {
	retry  time.Duration
	dead   string
	noType bool
	sent   sentJob // enqueued: the task it became, for BrokerOptions.History
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
	if o.sent.id != "" && r.end.sent != nil {
		r.end.sent[index-1] = o.sent // this place alone (indexes count from 1): read once left is 0
	}
	if r.left.Add(-1) == 0 {
		acks <- r
	}
}

// acker settles finished batches from in, gathered over ackLinger, until
// in is closed.
func (d *Dispatcher) acker(in <-chan *batchRun) {
	runs := make([]*batchRun, 0, MaxBatchSize)
	batch := make([]batchEnd, 0, MaxBatchSize)
	linger := time.NewTimer(ackLinger)
	defer linger.Stop()
	for r := range in {
		d.logNoType(r)
		runs, batch = append(runs[:0], r), append(batch[:0], r.end)
		resetTimer(linger, ackLinger)
	more:
		for len(batch) < MaxBatchSize {
			select {
			case r, ok := <-in:
				if !ok {
					break more
				}
				d.logNoType(r)
				runs, batch = append(runs, r), append(batch, r.end)
			case <-linger.C:
				break more
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), d.opts.EnqueueTimeout)
		lost, err := d.b.finishBatches(ctx, batch...)
		cancel()
		for _, r := range runs {
			r.closed.Store(true) // settled, lost, or left to recovery: the keeper lets it go
		}
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

// keeping hands batch r to the keeper.
func (p *pipeline) keeping(r *batchRun) {
	p.kept.mu.Lock()
	p.kept.runs = append(p.kept.runs, r)
	p.kept.mu.Unlock()
}

// keep renews the lease of each batch in the pipeline's hands once a
// third of it has passed since its claim or its last renewal. A batch
// whose jobs are still being enqueued is renewed only if an enqueue of the
// pipeline ended meanwhile: a dispatcher whose enqueues go on, however
// slowly, keeps its claims, while one whose asynq hangs lets them run
// out, and recovery gives their jobs back (as it does a dead
// dispatcher's). A batch whose every job is dispatched waits for the
// acker's settle, and is renewed until the acker is done with it.
func (p *pipeline) keep() {
	lease := p.d.opts.Lease
	tick := time.NewTicker(max(lease/6, time.Millisecond))
	defer tick.Stop()
	for {
		select {
		case <-p.kept.stop:
			return
		case <-tick.C:
			p.renew(lease)
		}
	}
}

// renew renews the leases that keep says are due, in one round trip.
func (p *pipeline) renew(lease time.Duration) {
	now, ended := time.Now(), p.ended.Load()
	var due []*batchRun
	p.kept.mu.Lock()
	runs := p.kept.runs[:0]
	for _, r := range p.kept.runs {
		if r.closed.Load() || r.until.Load() == 0 { // settled, or lost
			continue
		}
		runs = append(runs, r)
		if now.Sub(r.renewed) >= lease/3 && (ended > r.mark || r.left.Load() == 0) {
			due = append(due, r)
		}
	}
	clear(p.kept.runs[len(runs):])
	p.kept.runs = runs
	p.kept.mu.Unlock()
	if len(due) == 0 {
		return
	}
	leases := make([]batchLease, len(due))
	for i, r := range due {
		leases[i] = r.end.lease
	}
	ctx, cancel := context.WithTimeout(context.Background(), p.d.opts.EnqueueTimeout)
	deadlines, err := p.d.b.extendBatches(ctx, leases, p.d.opts.Lease)
	cancel()
	if err != nil {
		p.d.keepWarn.warn(context.Background(), p.d.log, err.Error(),
			"zclaim: renewing the leases of dispatched batches failed; trying again",
			slog.Int("batches", len(due)), slog.String("error", err.Error()))
		return
	}
	for i, r := range due {
		switch {
		case deadlines[i] != 0:
			r.until.Store(deadlines[i])
			r.renewed, r.mark = now, ended
		case r.left.Load() > 0: // not handed to the acker, so not settled: recovery took it back
			r.until.Store(0)
			p.d.log.LogAttrs(context.Background(), slog.LevelWarn, "zclaim: lease of a batch being enqueued was lost; "+
				"its jobs not enqueued yet are not, and recovery gives them back",
				slog.Int("jobs", r.end.lease.n), slog.Int64("left", r.left.Load()))
		}
	}
}
