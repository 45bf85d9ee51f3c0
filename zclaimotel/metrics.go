package zclaimotel

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/zclaim/zclaim"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// Metrics names what RegisterMetrics reports: the same set zclaimprom
// exports, named by OTel's conventions.
type Metrics struct {
	// Brokers whose schedules are counted (Broker.Stats, one round trip
	// per schedule at each collection) and whose recovery passes are
	// summed (Broker.RecoveryStats).
	Brokers []*zclaim.Broker
	// Dispatchers whose counts are reported (Dispatcher.Stats).
	Dispatchers []*zclaim.Dispatcher
	// Idempotency stores whose middleware counts are reported, and whose
	// abandoned runs are read from Redis at each collection.
	Idempotency []*zclaim.Idempotency
	// Timeout bounds the Redis calls of one collection. Default: 5s.
	Timeout time.Duration
}

// RegisterMetrics registers observable instruments on the MeterProvider
// (WithMeterProvider; default the global one) that report m at each
// collection, and returns their registration (Unregister stops them):
//
//	zclaim.schedule.up                 gauge {zclaim.schedule}: 1 when the counts were read
//	zclaim.schedule.jobs               gauge {zclaim.schedule, zclaim.state}: scheduled, due, in_flight, expired, dead
//	zclaim.schedule.oldest_due         gauge s {zclaim.schedule}
//	zclaim.schedule.state_lost.time    gauge s {zclaim.schedule}: when Redis last lost the schedule's keys (Unix)
//	zclaim.dispatcher.jobs             counter {zclaim.schedule, zclaim.outcome}: claimed, enqueued, conflict, error, dead
//	zclaim.recovery.jobs               counter {zclaim.schedule, zclaim.outcome}: requeued, dead, trimmed
//	zclaim.middleware.tasks            counter {zclaim.prefix, zclaim.outcome}: skipped, in_progress, completed, released, lease_lost
//	zclaim.middleware.state_lost       counter {zclaim.prefix}
//	zclaim.middleware.takeovers        counter {zclaim.prefix}
//	zclaim.middleware.abandoned_runs   gauge {zclaim.prefix}: read from Redis
//	zclaim.asynq_adapter.off           gauge {zclaim.prefix}
//
// The dispatch lag (zclaim.dispatch.lag, a histogram in seconds) is
// recorded by EnqueueHook as each enqueue ends. A nil entry or a negative
// Timeout is an error, and nothing is registered.
func RegisterMetrics(m Metrics, opts ...Option) (metric.Registration, error) {
	switch {
	case slices.Contains(m.Brokers, nil):
		return nil, errors.New("zclaimotel: a nil *zclaim.Broker in Metrics.Brokers")
	case slices.Contains(m.Dispatchers, nil):
		return nil, errors.New("zclaimotel: a nil *zclaim.Dispatcher in Metrics.Dispatchers")
	case slices.Contains(m.Idempotency, nil):
		return nil, errors.New("zclaimotel: a nil *zclaim.Idempotency in Metrics.Idempotency")
	case m.Timeout < 0:
		return nil, fmt.Errorf("zclaimotel: Metrics.Timeout must not be negative, not %v", m.Timeout)
	case m.Timeout == 0:
		m.Timeout = 5 * time.Second
	}
	meter := newConfig(opts).mp.Meter(ScopeName)
	var errs []error
	gauge := func(name, unit, desc string) metric.Float64ObservableGauge {
		g, err := meter.Float64ObservableGauge(name, metric.WithUnit(unit), metric.WithDescription(desc))
		errs = append(errs, err)
		return g
	}
	counter := func(name, unit, desc string) metric.Int64ObservableCounter {
		c, err := meter.Int64ObservableCounter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		errs = append(errs, err)
		return c
	}
	up := gauge("zclaim.schedule.up", "1", "Whether the last collection read the schedule's counts from Redis (1) or not (0).")
	jobs := gauge("zclaim.schedule.jobs", "{job}", "Jobs of the schedule by state: scheduled, due (scheduled and due now), in_flight, expired (in flight past their lease), dead.")
	oldest := gauge("zclaim.schedule.oldest_due", "s", "How long the earliest scheduled job has been due (0 when none is).")
	lost := gauge("zclaim.schedule.state_lost.time", "s", "When a Broker of this process last noticed that Redis lost the schedule's keys, Unix time.")
	disp := counter("zclaim.dispatcher.jobs", "{job}", "Jobs the dispatchers handled, by outcome: claimed, enqueued, conflict (asynq had the task), error (went back), dead.")
	rec := counter("zclaim.recovery.jobs", "{job}", "Jobs recovery handled, by outcome: requeued (lease expired), dead (last attempt), trimmed (dead set).")
	tasks := counter("zclaim.middleware.tasks", "{task}", "Tasks the idempotency middleware handled, by outcome: skipped, in_progress, completed, released, lease_lost.")
	stateLost := counter("zclaim.middleware.state_lost", "{event}", "Times the idempotency store noticed that Redis lost its records.")
	takeovers := counter("zclaim.middleware.takeovers", "{run}", "Abandoned runs this process took over.")
	abandoned := gauge("zclaim.middleware.abandoned_runs", "{run}", "Runs of active asynq tasks whose worker is gone, read from Redis.")
	adapterOff := gauge("zclaim.asynq_adapter.off", "{part}", "Parts of the asynq adapter that do not apply under the asynq this process runs.")
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("zclaimotel: %w", err)
	}
	schedule := func(key string) attribute.KeyValue { return attribute.String("zclaim.schedule", key) }
	prefix := func(p string) attribute.KeyValue { return attribute.String("zclaim.prefix", p) }
	outcome := func(o string) attribute.KeyValue { return attribute.String("zclaim.outcome", o) }
	return meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		ctx, cancel := context.WithTimeout(context.Background(), m.Timeout)
		defer cancel()
		seen := map[string]bool{}
		for _, b := range m.Brokers {
			key := b.Key()
			if seen[key] {
				continue
			}
			seen[key] = true
			st, err := b.Stats(ctx)
			if err != nil {
				o.ObserveFloat64(up, 0, metric.WithAttributes(schedule(key)))
				continue
			}
			o.ObserveFloat64(up, 1, metric.WithAttributes(schedule(key)))
			for state, n := range map[string]int64{"scheduled": st.Scheduled, "due": st.Due, "in_flight": st.Inflight,
				"expired": st.Expired, "dead": st.Dead} {
				o.ObserveFloat64(jobs, float64(n), metric.WithAttributes(schedule(key), attribute.String("zclaim.state", state)))
			}
			o.ObserveFloat64(oldest, st.OldestDue.Seconds(), metric.WithAttributes(schedule(key)))
			if !st.StateLost.IsZero() {
				o.ObserveFloat64(lost, float64(st.StateLost.UnixMilli())/1000, metric.WithAttributes(schedule(key)))
			}
		}
		recovered := map[string]*zclaim.Recovered{}
		for _, b := range m.Brokers {
			r := b.RecoveryStats()
			if sum := recovered[b.Key()]; sum != nil {
				sum.Requeued, sum.Dead, sum.Trimmed = sum.Requeued+r.Requeued, sum.Dead+r.Dead, sum.Trimmed+r.Trimmed
			} else {
				recovered[b.Key()] = &r
			}
		}
		for key, r := range recovered {
			for name, n := range map[string]int{"requeued": r.Requeued, "dead": r.Dead, "trimmed": r.Trimmed} {
				o.ObserveInt64(rec, int64(n), metric.WithAttributes(schedule(key), outcome(name)))
			}
		}
		dispatched := map[string]map[string]int64{}
		for _, d := range m.Dispatchers {
			st, key := d.Stats(), d.Broker().Key()
			if dispatched[key] == nil {
				dispatched[key] = map[string]int64{}
			}
			for name, n := range map[string]int64{"claimed": st.Claimed, "enqueued": st.Enqueued,
				"conflict": st.Conflicts, "error": st.Failed, "dead": st.Dead} {
				dispatched[key][name] += n
			}
		}
		for key, by := range dispatched {
			for name, n := range by {
				o.ObserveInt64(disp, n, metric.WithAttributes(schedule(key), outcome(name)))
			}
		}
		byPrefix := map[string]map[string]int64{}
		for _, s := range m.Idempotency {
			st, p := s.Stats(), s.Prefix()
			if byPrefix[p] == nil {
				byPrefix[p] = map[string]int64{}
				runs, _, err := s.Runs(ctx, "", 0)
				var queueErr *zclaim.QueueError
				if err == nil || errors.As(err, &queueErr) { // a queue passed over: the others' runs count
					n := 0
					for _, r := range runs {
						if r.State == zclaim.RunAbandoned || r.State == zclaim.RunTakenOver {
							n++
						}
					}
					o.ObserveFloat64(abandoned, float64(n), metric.WithAttributes(prefix(p)))
				}
			}
			for name, n := range map[string]int64{"skipped": st.Skipped, "in_progress": st.InProgress,
				"completed": st.Completed, "released": st.Released, "lease_lost": st.LeaseLost,
				"state_lost": st.StateLost, "takeovers": st.Takeovers} {
				byPrefix[p][name] += n
			}
			byPrefix[p]["adapter_off"] = max(byPrefix[p]["adapter_off"], st.AdapterOff)
		}
		for p, by := range byPrefix {
			for _, name := range []string{"skipped", "in_progress", "completed", "released", "lease_lost"} {
				o.ObserveInt64(tasks, by[name], metric.WithAttributes(prefix(p), outcome(name)))
			}
			o.ObserveInt64(stateLost, by["state_lost"], metric.WithAttributes(prefix(p)))
			o.ObserveInt64(takeovers, by["takeovers"], metric.WithAttributes(prefix(p)))
			o.ObserveFloat64(adapterOff, float64(by["adapter_off"]), metric.WithAttributes(prefix(p)))
		}
		return nil
	}, up, jobs, oldest, lost, disp, rec, tasks, stateLost, takeovers, abandoned, adapterOff)
}
