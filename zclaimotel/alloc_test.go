package zclaimotel_test

import (
	"context"
	"testing"

	"github.com/hibiken/asynq"
	"github.com/zclaim/zclaim/zclaimotel"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// allocs is the allocations a task of handler h costs.
func allocs(h asynq.Handler, task *asynq.Task) float64 {
	return testing.AllocsPerRun(1000, func() { h.ProcessTask(context.Background(), task) })
}

var nothing = asynq.HandlerFunc(func(context.Context, *asynq.Task) error { return nil })

// tasks are a task without headers (a plain member's) and one with a
// sampled trace context.
func tasks() map[string]*asynq.Task {
	return map[string]*asynq.Task{
		"no context": asynq.NewTask("work", nil),
		"a trace context": asynq.NewTaskWithHeaders("work", nil,
			map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}),
	}
}

// With a no-op provider the middleware adds no allocation to a task; with
// an SDK that samples nothing, none beyond what the SDK's own Start and
// the propagator's Extract make (nothing for attributes, names or
// status).
func TestNoopAddsNoAllocation(t *testing.T) {
	for tname, task := range tasks() {
		h := zclaimotel.Middleware(zclaimotel.WithTracerProvider(noop.NewTracerProvider()))(nothing)
		if n := allocs(h, task); n != 0 {
			t.Errorf("no-op provider, task with %s: %.1f allocations a task, want 0", tname, n)
		}
		tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.NeverSample()))
		h = zclaimotel.Middleware(zclaimotel.WithTracerProvider(tp))(nothing)
		tracer, prop := tp.Tracer(zclaimotel.ScopeName), propagation.TraceContext{}
		own := testing.AllocsPerRun(1000, func() {
			ctx := context.Background()
			if len(task.Headers()) > 0 {
				ctx = prop.Extract(ctx, propagation.MapCarrier(task.Headers()))
			}
			tracer.Start(ctx, "process ", trace.WithSpanKind(trace.SpanKindConsumer))
		})
		if n := allocs(h, task); n > own {
			t.Errorf("sampled-out SDK, task with %s: %.1f allocations a task, beyond the SDK's and the propagator's own %.1f",
				tname, n, own)
		}
	}
}

// BenchmarkMiddleware: a task through the middleware with each provider.
func BenchmarkMiddleware(b *testing.B) {
	for pname, tp := range map[string]trace.TracerProvider{"none": nil, "noop": noop.NewTracerProvider(),
		"sampled-out": sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.NeverSample())),
		"recording":   sdktrace.NewTracerProvider()} {
		h := asynq.Handler(nothing)
		if tp != nil {
			h = zclaimotel.Middleware(zclaimotel.WithTracerProvider(tp))(nothing)
		}
		task := tasks()["a trace context"]
		b.Run(pname, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				h.ProcessTask(context.Background(), task)
			}
		})
	}
}
