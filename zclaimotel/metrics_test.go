package zclaimotel_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/zclaim/zclaim"
	"github.com/zclaim/zclaim/zclaimotel"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// RegisterMetrics reports the schedule's counts, the dispatcher's and the
// middleware's through a MeterProvider, with the values Stats gives; the
// EnqueueHook records the dispatch lag; nil entries are refused.
func TestMetrics(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { mp.Shutdown(context.Background()) })
	s.serve(t, func(context.Context, *asynq.Task) error { return nil })
	d := s.dispatch(t, zclaim.DispatcherOptions{
		Enqueue: zclaimotel.EnqueueHook(zclaimotel.WithTracerProvider(s.tp), zclaimotel.WithMeterProvider(mp))})
	reg, err := zclaimotel.RegisterMetrics(zclaimotel.Metrics{Brokers: []*zclaim.Broker{s.broker},
		Dispatchers: []*zclaim.Dispatcher{d}, Idempotency: []*zclaim.Idempotency{s.idem}}, zclaimotel.WithMeterProvider(mp))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { reg.Unregister() })
	now := time.Now()
	var jobs []zclaim.Job
	for i := range 5 {
		jobs = append(jobs, zclaim.Job{ID: "m-" + string(rune('a'+i)), RunAt: now.Add(-time.Second), Type: "work"})
	}
	jobs = append(jobs, zclaim.Job{ID: "later", RunAt: now.Add(time.Hour), Type: "work"})
	if err := s.broker.Schedule(ctx, jobs...); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(15 * time.Second)
	for s.idem.Stats().Completed < 5 {
		if time.Now().After(deadline) {
			t.Fatalf("5 runs completed: %+v", s.idem.Stats())
		}
		time.Sleep(10 * time.Millisecond)
	}
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch data := m.Data.(type) {
			case metricdata.Gauge[float64]:
				for _, p := range data.DataPoints {
					got[m.Name+label(p.Attributes.ToSlice())] = p.Value
				}
			case metricdata.Sum[int64]:
				for _, p := range data.DataPoints {
					got[m.Name+label(p.Attributes.ToSlice())] = float64(p.Value)
				}
			case metricdata.Histogram[float64]:
				for _, p := range data.DataPoints {
					got[m.Name+":count"] += float64(p.Count)
				}
			}
		}
	}
	for k, want := range map[string]float64{
		"zclaim.schedule.up":                 1,
		"zclaim.schedule.jobs{scheduled}":    1,
		"zclaim.schedule.jobs{dead}":         0,
		"zclaim.dispatcher.jobs{enqueued}":   5,
		"zclaim.middleware.tasks{completed}": 5,
		"zclaim.middleware.abandoned_runs":   0,
		"zclaim.asynq_adapter.off":           0,
		"zclaim.dispatch.lag:count":          5,
	} {
		if v, ok := got[k]; !ok || v != want {
			t.Errorf("%s = %v (%v), want %v; all: %v", k, v, ok, want, got)
		}
	}
	for _, bad := range []zclaimotel.Metrics{{Brokers: []*zclaim.Broker{nil}}, {Dispatchers: []*zclaim.Dispatcher{nil}},
		{Idempotency: []*zclaim.Idempotency{nil}}, {Timeout: -1}} {
		if _, err := zclaimotel.RegisterMetrics(bad, zclaimotel.WithMeterProvider(mp)); err == nil ||
			!strings.HasPrefix(err.Error(), "zclaimotel: ") {
			t.Errorf("RegisterMetrics(%+v): %v", bad, err)
		}
	}
}

// label is the attribute values of a data point but its schedule and
// prefix, as "{a,b}", or "" when none.
func label(kvs []attribute.KeyValue) string {
	var vs []string
	for _, kv := range kvs {
		if kv.Key != "zclaim.schedule" && kv.Key != "zclaim.prefix" {
			vs = append(vs, kv.Value.Emit())
		}
	}
	if len(vs) == 0 {
		return ""
	}
	return "{" + strings.Join(vs, ",") + "}"
}
