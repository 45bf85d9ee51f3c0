// Package zclaimprom exports zclaim's counts to Prometheus: the counts of
// each schedule (read from Redis at each scrape, one round trip per
// schedule), and what dispatchers, recovery and the idempotency
// middleware did in this process.
//
//	reg.MustRegister(zclaimprom.NewCollector(zclaimprom.Options{
//		Brokers:     []*zclaim.Broker{broker},
//		Dispatchers: []*zclaim.Dispatcher{dispatcher},
//		Idempotency: []*zclaim.Idempotency{store},
//	}))
//
// Schedules are labelled by their key, middleware stores by their prefix.
// Several Brokers or Dispatchers of one key in a process are summed (the
// schedule's counts are read once).
package zclaimprom

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/zclaim/zclaim"
)

// DefaultTimeout bounds the Redis calls of one scrape when Options.Timeout is zero.
const DefaultTimeout = 5 * time.Second

// Options say what a Collector reports. Every field may be empty.
type Options struct {
	// Brokers whose schedules are counted (Broker.Stats) and whose
	// recovery passes are summed (Broker.RecoveryStats).
	Brokers []*zclaim.Broker
	// Dispatchers whose counts and lag are reported (Dispatcher.Stats).
	Dispatchers []*zclaim.Dispatcher
	// Idempotency stores whose middleware counts are reported.
	Idempotency []*zclaim.Idempotency
	// Timeout bounds the Redis calls of one scrape. Default: DefaultTimeout (5s).
	Timeout time.Duration
}

// NewCollector returns a prometheus.Collector of what opts name. A
// schedule that cannot be read at a scrape reports zclaim_up 0 and no
// counts.
//
// A nil entry in Options, or a negative Timeout, makes a collector that
// prometheus.Register refuses with an error that names it (and that
// MustRegister panics with, at start), not one that fails a scrape.
func NewCollector(opts Options) prometheus.Collector {
	if err := opts.check(); err != nil {
		return &collector{err: err}
	}
	if opts.Timeout == 0 {
		opts.Timeout = DefaultTimeout
	}
	return &collector{opts: opts}
}

func (o Options) check() error {
	switch {
	case slices.Contains(o.Brokers, nil):
		return errors.New("zclaimprom: a nil *zclaim.Broker in Options.Brokers")
	case slices.Contains(o.Dispatchers, nil):
		return errors.New("zclaimprom: a nil *zclaim.Dispatcher in Options.Dispatchers")
	case slices.Contains(o.Idempotency, nil):
		return errors.New("zclaimprom: a nil *zclaim.Idempotency in Options.Idempotency")
	case o.Timeout < 0:
		return fmt.Errorf("zclaimprom: Options.Timeout must not be negative, not %v", o.Timeout)
	}
	return nil
}

type collector struct {
	opts Options
	err  error // why the options are refused: Describe reports it
}

func desc(name, help string, labels ...string) *prometheus.Desc {
	return prometheus.NewDesc(name, help, labels, nil)
}

var (
	upDesc = desc("zclaim_up",
		"Whether the last scrape read the schedule's counts from Redis (1) or not (0).", "key")
	scheduledDesc = desc("zclaim_scheduled_jobs", "Jobs on the schedule.", "key")
	dueDesc       = desc("zclaim_due_jobs", "Scheduled jobs that are due now, by Redis' clock.", "key")
	inflightDesc  = desc("zclaim_inflight_jobs", "Jobs claimed and not yet settled.", "key")
	expiredDesc   = desc("zclaim_expired_jobs", "In-flight jobs past their lease, waiting for recovery.", "key")
	deadDesc      = desc("zclaim_dead_jobs", "Jobs in the dead set.", "key")
	oldestDesc    = desc("zclaim_oldest_due_seconds",
		"How long the earliest scheduled job has been due (0 when none is).", "key")
	lostDesc = desc("zclaim_state_lost_timestamp_seconds",
		"When a Broker of this process last noticed that Redis lost the schedule's keys (absent if never).", "key")

	claimedDesc   = desc("zclaim_dispatcher_claimed_total", "Jobs the dispatchers claimed off the schedule.", "key")
	enqueuedDesc  = desc("zclaim_dispatcher_enqueued_total", "Tasks the dispatchers enqueued into asynq.", "key")
	conflictsDesc = desc("zclaim_dispatcher_conflicts_total",
		"Claims whose occurrence asynq already had (settled, not enqueued again).", "key")
	failedDesc = desc("zclaim_dispatcher_errors_total",
		"Enqueues that failed, or were not made because the claim's lease ran out first; their jobs "+
			"went back with backoff.", "key")
	dispDeadDesc = desc("zclaim_dispatcher_dead_total",
		"Claims that could not become tasks, sent to the dead set.", "key")
	lagDesc = desc("zclaim_dispatch_lag_seconds",
		"Time from a job's due time to the end of its enqueue (first attempts), by Redis' clock.", "key")

	requeuedDesc = desc("zclaim_recovery_requeued_total", "Expired runs that recovery put back on the schedule.", "key")
	recDeadDesc  = desc("zclaim_recovery_dead_total",
		"Expired runs on their last attempt that recovery sent to the dead set.", "key")
	trimmedDesc = desc("zclaim_recovery_trimmed_total",
		"Jobs removed from the dead set by DeadRetention or DeadMax.", "key")

	runsDesc = desc("zclaim_middleware_tasks_total",
		"Tasks the idempotency middleware handled, by outcome: skipped (finished before), in_progress (running "+
			"elsewhere), completed, released (failed), lease_lost.", "prefix", "outcome")
	stateLostDesc = desc("zclaim_middleware_state_lost_total",
		"Times the idempotency store noticed that Redis lost its records.", "prefix")
	takeoverDesc = desc("zclaim_middleware_takeovers_total",
		"Abandoned runs (their worker gone) this process took over: their tasks put back on their queue.", "prefix")
	adapterOffDesc = desc("zclaim_asynq_adapter_off",
		"Parts of the asynq adapter (what zclaim knows of asynq's own keys and scripts) that this process found "+
			"not to apply under the asynq it runs; 0 while all apply. zclaim doctor names them.", "prefix")
	abandonedDesc = desc("zclaim_middleware_abandoned_runs",
		"Runs of active asynq tasks whose worker is gone (lease run out, or taken over and not yet begun again), "+
			"read from Redis.", "prefix")
)

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	if c.err != nil {
		ch <- prometheus.NewInvalidDesc(c.err)
		return
	}
	for _, d := range []*prometheus.Desc{upDesc, scheduledDesc, dueDesc, inflightDesc, expiredDesc,
		deadDesc, oldestDesc, lostDesc,
		claimedDesc, enqueuedDesc, conflictsDesc, failedDesc, dispDeadDesc, lagDesc,
		requeuedDesc, recDeadDesc, trimmedDesc, runsDesc, stateLostDesc, takeoverDesc, abandonedDesc, adapterOffDesc} {
		ch <- d
	}
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	if c.err != nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.opts.Timeout)
	defer cancel()
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	counter := func(d *prometheus.Desc, v int64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}

	// Schedules: counts read once per key; recovery summed per key.
	var recovered sums[zclaim.Recovered]
	for _, b := range c.opts.Brokers {
		if !recovered.add(b.Key(), b.RecoveryStats(), func(sum *zclaim.Recovered, r zclaim.Recovered) {
			sum.Requeued += r.Requeued
			sum.Dead += r.Dead
			sum.Trimmed += r.Trimmed
		}) {
			continue
		}
		key := b.Key()
		st, err := b.Stats(ctx)
		if err != nil {
			gauge(upDesc, 0, key)
			continue
		}
		gauge(upDesc, 1, key)
		gauge(scheduledDesc, float64(st.Scheduled), key)
		gauge(dueDesc, float64(st.Due), key)
		gauge(inflightDesc, float64(st.Inflight), key)
		gauge(expiredDesc, float64(st.Expired), key)
		gauge(deadDesc, float64(st.Dead), key)
		gauge(oldestDesc, st.OldestDue.Seconds(), key)
		if !st.StateLost.IsZero() {
			gauge(lostDesc, float64(st.StateLost.UnixMilli())/1000, key)
		}
	}
	for _, key := range recovered.keys {
		r := recovered.by[key]
		counter(requeuedDesc, int64(r.Requeued), key)
		counter(recDeadDesc, int64(r.Dead), key)
		counter(trimmedDesc, int64(r.Trimmed), key)
	}

	// Dispatchers, summed per key.
	var disp sums[zclaim.DispatcherStats]
	for _, d := range c.opts.Dispatchers {
		disp.add(d.Broker().Key(), d.Stats(), func(sum *zclaim.DispatcherStats, st zclaim.DispatcherStats) {
			sum.Claimed += st.Claimed
			sum.Enqueued += st.Enqueued
			sum.Conflicts += st.Conflicts
			sum.Failed += st.Failed
			sum.Dead += st.Dead
			sum.Lag.Count += st.Lag.Count
			sum.Lag.Sum += st.Lag.Sum
			for i := range sum.Lag.Counts {
				sum.Lag.Counts[i] += st.Lag.Counts[i]
			}
		})
	}
	for _, key := range disp.keys {
		st := disp.by[key]
		counter(claimedDesc, st.Claimed, key)
		counter(enqueuedDesc, st.Enqueued, key)
		counter(conflictsDesc, st.Conflicts, key)
		counter(failedDesc, st.Failed, key)
		counter(dispDeadDesc, st.Dead, key)
		bounds := zclaim.LagBuckets()
		buckets := make(map[float64]uint64, len(bounds))
		for i, b := range bounds {
			buckets[b.Seconds()] = st.Lag.Counts[i]
		}
		ch <- prometheus.MustNewConstHistogram(lagDesc, st.Lag.Count, st.Lag.Sum.Seconds(), buckets, key)
	}

	// Middleware stores, summed per prefix.
	var mw sums[zclaim.IdempotencyStats]
	for _, s := range c.opts.Idempotency {
		if !mw.add(s.Prefix(), s.Stats(), func(sum *zclaim.IdempotencyStats, st zclaim.IdempotencyStats) {
			sum.Skipped += st.Skipped
			sum.InProgress += st.InProgress
			sum.Completed += st.Completed
			sum.Released += st.Released
			sum.LeaseLost += st.LeaseLost
			sum.StateLost += st.StateLost
			sum.Takeovers += st.Takeovers
			sum.AdapterOff = max(sum.AdapterOff, st.AdapterOff)
		}) {
			continue
		}
		// Abandoned runs are read from Redis, once per prefix, so the
		// gauge survives the restart of the process that watched them.
		// A queue whose active tasks cannot be listed is passed over: the
		// others' runs are counted.
		runs, _, err := s.Runs(ctx, "", 0)
		var queueErr *zclaim.QueueError
		if err == nil || errors.As(err, &queueErr) {
			n := 0
			for _, r := range runs {
				if r.State == zclaim.RunAbandoned || r.State == zclaim.RunTakenOver {
					n++
				}
			}
			gauge(abandonedDesc, float64(n), s.Prefix())
		}
	}
	for _, p := range mw.keys {
		st := mw.by[p]
		counter(runsDesc, st.Skipped, p, "skipped")
		counter(runsDesc, st.InProgress, p, "in_progress")
		counter(runsDesc, st.Completed, p, "completed")
		counter(runsDesc, st.Released, p, "released")
		counter(runsDesc, st.LeaseLost, p, "lease_lost")
		counter(stateLostDesc, st.StateLost, p)
		counter(takeoverDesc, st.Takeovers, p)
		gauge(adapterOffDesc, float64(st.AdapterOff), p)
	}
}

// sums adds up the stats of several Brokers, Dispatchers or stores of one
// key, in the order the keys first came.
type sums[V any] struct {
	keys []string
	by   map[string]*V
}

// add counts v under key, with plus for every v after the key's first;
// it tells whether v was the key's first.
func (s *sums[V]) add(key string, v V, plus func(sum *V, v V)) bool {
	if sum := s.by[key]; sum != nil {
		plus(sum, v)
		return false
	}
	if s.by == nil {
		s.by = map[string]*V{}
	}
	s.by[key] = &v
	s.keys = append(s.keys, key)
	return true
}
