// Package zclaimotel ties zclaim's jobs to OpenTelemetry traces and
// exports its metrics through an OTel MeterProvider. It is a module of its
// own: the root module imports no OpenTelemetry.
//
// A job scheduled inside a request's span carries that span's context
// (Inject writes it into Job.Headers, which the schedule keeps and the
// Dispatcher copies into the asynq task's headers); the Dispatcher's
// enqueue is a producer span in that trace (EnqueueHook), and each run of
// the task a consumer span, a child of the enqueue's (Middleware): a retry
// and a run after a takeover are further spans of the same trace. A plain
// ZADD member carries no context, and its run starts a trace of its own.
//
//	zclaimotel.Inject(ctx, &job)                  // inside the request's span
//	broker.Schedule(ctx, job)
//
//	d, _ := zclaim.NewDispatcher(broker, client, zclaim.DispatcherOptions{
//		Enqueue: zclaimotel.EnqueueHook(),
//	})
//
//	mux.Use(idem.Middleware(), zclaimotel.Middleware()) // inside the idempotency middleware
//
// The run's span is a child of the enqueue's, not a link: one job, one
// enqueue, one causal chain, which trace views show as one tree from the
// request to each run. Runs of one task (retries, a takeover) are
// siblings under the enqueue.
package zclaimotel

import (
	"context"
	"time"

	"sync"

	"github.com/hibiken/asynq"
	"github.com/zclaim/zclaim"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// ScopeName is the instrumentation scope of zclaimotel's tracer and meter.
const ScopeName = "github.com/zclaim/zclaim/zclaimotel"

// Option configures Middleware, EnqueueHook and RegisterMetrics.
type Option func(*config)

type config struct {
	tp   trace.TracerProvider
	prop propagation.TextMapPropagator
	mp   metric.MeterProvider
}

// WithTracerProvider sets the TracerProvider. Default: the global one
// (otel.GetTracerProvider), looked up when the middleware or hook is made.
func WithTracerProvider(tp trace.TracerProvider) Option { return func(c *config) { c.tp = tp } }

// WithPropagator sets the propagator that reads and writes a job's trace
// context. Default: the global one (otel.GetTextMapPropagator).
func WithPropagator(p propagation.TextMapPropagator) Option { return func(c *config) { c.prop = p } }

// WithMeterProvider sets RegisterMetrics' MeterProvider. Default: the
// global one (otel.GetMeterProvider).
func WithMeterProvider(mp metric.MeterProvider) Option { return func(c *config) { c.mp = mp } }

func newConfig(opts []Option) *config {
	c := &config{}
	for _, o := range opts {
		if o != nil {
			o(c)
		}
	}
	if c.tp == nil {
		c.tp = otel.GetTracerProvider()
	}
	if c.prop == nil {
		c.prop = otel.GetTextMapPropagator()
	}
	if c.mp == nil {
		c.mp = otel.GetMeterProvider()
	}
	return c
}

// Inject writes the trace context of ctx into job's Headers through the
// global propagator (W3C traceparent and tracestate by default), so that
// it travels with the job through the schedule, the Dispatcher and asynq.
// A ctx with no span writes nothing.
func Inject(ctx context.Context, job *zclaim.Job) {
	inject(ctx, otel.GetTextMapPropagator(), job)
}

func inject(ctx context.Context, p propagation.TextMapPropagator, job *zclaim.Job) {
	if job == nil || !trace.SpanContextFromContext(ctx).IsValid() {
		return
	}
	if job.Headers == nil {
		job.Headers = map[string]string{}
	}
	p.Inject(ctx, propagation.MapCarrier(job.Headers))
}

// lagBounds are zclaim's lag buckets (zclaim.LagBuckets), in seconds.
func lagBounds() []float64 {
	var out []float64
	for _, b := range zclaim.LagBuckets() {
		out = append(out, b.Seconds())
	}
	return out
}

// Attribute keys of zclaim's own, beside the messaging conventions'.
const (
	AttrJobID    = attribute.Key("zclaim.job.id")
	AttrJobDue   = attribute.Key("zclaim.job.due")     // RFC 3339, milliseconds
	AttrAttempt  = attribute.Key("zclaim.job.attempt") // the schedule's attempt (1 for a first dispatch)
	AttrToken    = attribute.Key("zclaim.run.token")   // the run's fencing token
	AttrResumed  = attribute.Key("zclaim.run.resumed") // an earlier run of the occurrence began and did not complete
	AttrRetried  = attribute.Key("asynq.task.retried") // the times asynq retried the task before this run
	dueLayout    = "2006-01-02T15:04:05.000Z07:00"
	systemAsynq  = "asynq"
	opProcess    = "process"
	opSend       = "send"
	defaultQueue = "default"
)

// EnqueueHook returns the hook for DispatcherOptions.Enqueue: a producer
// span "send <queue>" around each enqueue, a child of the trace context
// the job carries (a root span for a job that carries none), whose own
// context replaces the job's in the task's headers, so that the runs'
// spans are its children.
func EnqueueHook(opts ...Option) func(ctx context.Context, job *zclaim.Job) func(error) {
	c := newConfig(opts)
	tracer := c.tp.Tracer(ScopeName)
	lag, _ := c.mp.Meter(ScopeName).Float64Histogram("zclaim.dispatch.lag", metric.WithUnit("s"),
		metric.WithDescription("Time from a job's due time (after a retry, its backoff's end) to the end of its enqueue."),
		metric.WithExplicitBucketBoundaries(lagBounds()...))
	return func(ctx context.Context, job *zclaim.Job) func(error) {
		parent := ctx
		if len(job.Headers) > 0 {
			parent = c.prop.Extract(ctx, propagation.MapCarrier(job.Headers))
		}
		queue := job.Queue
		if queue == "" {
			queue = defaultQueue
		}
		sctx, span := tracer.Start(parent, opSend+" "+queue, trace.WithSpanKind(trace.SpanKindProducer))
		due := job.RunAt
		enqueued := func(err error) { // the lag of an enqueue that landed
			if err == nil {
				lag.Record(ctx, time.Since(due).Seconds(), metric.WithAttributes(attribute.String("zclaim.queue", queue)))
			}
		}
		if !span.IsRecording() {
			if span.SpanContext().IsValid() { // sampled out: the runs follow its decision
				inject(sctx, c.prop, job)
			}
			return enqueued
		}
		span.SetAttributes(
			attribute.String("messaging.system", systemAsynq),
			attribute.String("messaging.operation.type", opSend),
			attribute.String("messaging.operation.name", opSend),
			attribute.String("messaging.destination.name", queue),
			AttrJobID.String(job.ID),
			AttrJobDue.String(job.RunAt.UTC().Format(dueLayout)),
		)
		inject(sctx, c.prop, job)
		return func(err error) {
			if err != nil {
				span.RecordError(err)
				span.SetStatus(codes.Error, err.Error())
			}
			enqueued(err)
			span.End()
		}
	}
}

// Middleware returns asynq middleware that runs each task's handler in a
// consumer span "process <queue>" (OTel's messaging conventions: system
// asynq, operation process, destination the queue, message id the task
// id), a child of the trace context in the task's headers (a root span
// for a task that carries none), with the job's id, due time and attempt
// (zclaim.JobFromContext), asynq's retry count, and, inside the
// idempotency middleware, the run's fencing token and whether it resumed
// a dead run (zclaim.Execution). The span's status is the handler's
// error. Put it inside the idempotency middleware:
// mux.Use(idem.Middleware(), zclaimotel.Middleware()).
func Middleware(opts ...Option) asynq.MiddlewareFunc {
	c := newConfig(opts)
	if _, off := c.tp.(noop.TracerProvider); off {
		return func(next asynq.Handler) asynq.Handler { return next } // nothing to record, nothing to pay
	}
	tracer := c.tp.Tracer(ScopeName)
	names := &spanNames{op: opProcess}
	return func(next asynq.Handler) asynq.Handler {
		return asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
			parent := ctx
			if h := t.Headers(); len(h) > 0 {
				parent = c.prop.Extract(ctx, propagation.MapCarrier(h))
			}
			queue, _ := asynq.GetQueueName(ctx)
			sctx, span := tracer.Start(parent, names.of(queue), consumer...)
			if !span.IsRecording() {
				if sctx == parent || !span.SpanContext().IsValid() {
					return next.ProcessTask(ctx, t)
				}
				return next.ProcessTask(sctx, t)
			}
			defer span.End()
			setRunAttributes(ctx, span, t, queue)
			err := next.ProcessTask(sctx, t)
			if err != nil {
				span.RecordError(err)
				span.SetStatus(codes.Error, err.Error())
			}
			return err
		})
	}
}

// consumer is the span options of a run, made once.
var consumer = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindConsumer)}

// spanNames keeps the span name of each queue for one operation, so that
// a task does not build one.
type spanNames struct {
	op string
	mu sync.RWMutex
	m  map[string]string
}

func (n *spanNames) of(queue string) string {
	n.mu.RLock()
	name, ok := n.m[queue]
	n.mu.RUnlock()
	if ok {
		return name
	}
	name = n.op + " " + queue
	n.mu.Lock()
	if n.m == nil {
		n.m = map[string]string{}
	}
	if len(n.m) < 1000 { // queues without end: build each name instead
		n.m[queue] = name
	}
	n.mu.Unlock()
	return name
}

func setRunAttributes(ctx context.Context, span trace.Span, t *asynq.Task, queue string) {
	id, _ := asynq.GetTaskID(ctx)
	retried, _ := asynq.GetRetryCount(ctx)
	attrs := []attribute.KeyValue{
		attribute.String("messaging.system", systemAsynq),
		attribute.String("messaging.operation.type", opProcess),
		attribute.String("messaging.operation.name", opProcess),
		attribute.String("messaging.destination.name", queue),
		attribute.String("messaging.message.id", id),
		attribute.String("asynq.task.type", t.Type()),
		AttrRetried.Int(retried),
	}
	if j, ok := zclaim.JobFromTask(t); ok {
		attrs = append(attrs, AttrJobID.String(j.ID), AttrJobDue.String(j.Due.UTC().Format(dueLayout)),
			AttrAttempt.Int(j.Attempt))
	}
	if e, ok := zclaim.ExecutionFromContext(ctx); ok {
		attrs = append(attrs, AttrToken.Int64(e.Token), AttrResumed.Bool(e.Resumed))
	}
	span.SetAttributes(attrs...)
}
