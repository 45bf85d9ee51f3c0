package zclaimotel_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/zclaim/zclaim"
	"github.com/zclaim/zclaim/internal/redisproc"
	"github.com/zclaim/zclaim/zclaimotel"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

var addr string

var ctx = context.Background()

func TestMain(m *testing.M) {
	redis.SetLogger(redisproc.QuietRedis{})
	otel.SetTextMapPropagator(propagation.TraceContext{}) // Inject's
	if os.Getenv(workerRole) != "" {
		worker() // a child process of TestTakeoverSameTrace: runs until SIGKILLed
		return
	}
	srv, err := redisproc.Start()
	if err != nil {
		fmt.Fprintln(os.Stderr, "zclaimotel tests need a Redis 7 server (apt-get install redis-server):", err)
		os.Exit(2)
	}
	addr = srv.Addr
	code := m.Run()
	srv.Close()
	os.Exit(code)
}

// setup is one test's schedule, store, dispatcher and asynq server on a
// queue of its own, each traced into a recorder.
type setup struct {
	rdb    *redis.Client
	broker *zclaim.Broker
	idem   *zclaim.Idempotency
	tp     *sdktrace.TracerProvider
	rec    *tracetest.SpanRecorder
	queue  string
	key    string
}

var seq atomic.Int64

func newSetup(t *testing.T) *setup {
	t.Helper()
	s := &setup{rdb: redis.NewClient(&redis.Options{Addr: addr}), rec: tracetest.NewSpanRecorder()}
	t.Cleanup(func() { s.rdb.Close() })
	n := seq.Add(1)
	s.key = fmt.Sprintf("otel%d:{%s}", n, t.Name())
	s.queue = fmt.Sprintf("otel-%d-%d", n, time.Now().UnixNano())
	s.tp = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(s.rec))
	var err error
	if s.broker, err = zclaim.NewBroker(s.rdb, zclaim.BrokerOptions{Key: s.key}); err != nil {
		t.Fatal(err)
	}
	if s.idem, err = zclaim.NewIdempotency(s.rdb, zclaim.IdempotencyOptions{Prefix: s.key + ":run:", Lease: time.Second,
		TakeoverQueues: []string{s.queue}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.idem.Close() })
	return s
}

// dispatch runs a Dispatcher with zclaimotel's hook (and the options o
// gives) until the test ends, and returns it.
func (s *setup) dispatch(t *testing.T, o zclaim.DispatcherOptions) *zclaim.Dispatcher {
	t.Helper()
	o.TaskOptions = func(zclaim.Job) []asynq.Option { return []asynq.Option{asynq.Queue(s.queue)} }
	if o.Enqueue == nil {
		o.Enqueue = zclaimotel.EnqueueHook(zclaimotel.WithTracerProvider(s.tp))
	}
	d, err := zclaim.NewDispatcher(s.broker, asynq.NewClientFromRedisClient(s.rdb), o)
	if err != nil {
		t.Fatal(err)
	}
	dctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); d.Run(dctx) }()
	t.Cleanup(func() { stop(); <-done })
	return d
}

// serve runs an asynq server with the idempotency middleware and
// zclaimotel's inside it, until the test ends.
func (s *setup) serve(t *testing.T, h asynq.HandlerFunc) {
	t.Helper()
	mux := asynq.NewServeMux()
	mux.Use(s.idem.Middleware(), zclaimotel.Middleware(zclaimotel.WithTracerProvider(s.tp)))
	mux.Handle("work", h)
	srv := asynq.NewServerFromRedisClient(s.idem.AsynqClient(), asynq.Config{Queues: map[string]int{s.queue: 1},
		TaskCheckInterval: 10 * time.Millisecond, DelayedTaskCheckInterval: 20 * time.Millisecond,
		LogLevel: asynq.FatalLevel, IsFailure: zclaim.IsFailure,
		RetryDelayFunc: func(int, error, *asynq.Task) time.Duration { return 10 * time.Millisecond }})
	if err := srv.Start(mux); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
}

// spans waits until the recorder holds n ended spans named name.
func (s *setup) spans(t *testing.T, name string, n int) []sdktrace.ReadOnlySpan {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		var out []sdktrace.ReadOnlySpan
		for _, sp := range s.rec.Ended() {
			if sp.Name() == name {
				out = append(out, sp)
			}
		}
		if len(out) >= n {
			return out
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d spans %q ended, want %d", len(out), name, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func attr(sp sdktrace.ReadOnlySpan, k attribute.Key) attribute.Value {
	for _, kv := range sp.Attributes() {
		if kv.Key == k {
			return kv.Value
		}
	}
	return attribute.Value{}
}

// A job scheduled inside a request's span is enqueued in a producer span
// of that trace, and each run of its task (a failure, then the retry) is
// a consumer span under it, with the job's and the run's attributes and
// the handler's error as its status.
func TestTraceFromScheduleToHandler(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	var runs atomic.Int32
	s.serve(t, func(ctx context.Context, _ *asynq.Task) error {
		if runs.Add(1) == 1 {
			return errors.New("smtp: 451 try later")
		}
		return nil
	})
	s.dispatch(t, zclaim.DispatcherOptions{})
	rctx, request := s.tp.Tracer("app").Start(ctx, "POST /orders")
	job := zclaim.Job{ID: "order-1", RunAt: time.Now().Add(-time.Second), Type: "work"}
	zclaimotel.Inject(rctx, &job)
	if job.Headers["traceparent"] == "" {
		t.Fatalf("Inject wrote %v", job.Headers)
	}
	if err := s.broker.Schedule(rctx, job); err != nil {
		t.Fatal(err)
	}
	request.End()
	send := s.spans(t, "send "+s.queue, 1)[0]
	runsSpans := s.spans(t, "process "+s.queue, 2)
	tid := request.SpanContext().TraceID()
	if send.SpanContext().TraceID() != tid || send.Parent().SpanID() != request.SpanContext().SpanID() ||
		send.SpanKind() != trace.SpanKindProducer || attr(send, "zclaim.job.id").AsString() != "order-1" {
		t.Fatalf("send span: trace %v parent %v kind %v attrs %v", send.SpanContext().TraceID(), send.Parent().SpanID(),
			send.SpanKind(), send.Attributes())
	}
	var failed, ok int
	for _, sp := range runsSpans {
		if sp.SpanContext().TraceID() != tid || sp.Parent().SpanID() != send.SpanContext().SpanID() ||
			sp.SpanKind() != trace.SpanKindConsumer {
			t.Fatalf("run span not under the send span: %v %v", sp.Parent(), sp.SpanKind())
		}
		if attr(sp, "messaging.system").AsString() != "asynq" || attr(sp, "messaging.destination.name").AsString() != s.queue ||
			!strings.HasPrefix(attr(sp, "messaging.message.id").AsString(), "order-1@") ||
			attr(sp, "zclaim.job.id").AsString() != "order-1" || attr(sp, "zclaim.run.token").AsInt64() == 0 {
			t.Fatalf("run span attributes: %v", sp.Attributes())
		}
		switch sp.Status().Code {
		case codes.Error:
			failed++
			if sp.Status().Description != "smtp: 451 try later" || attr(sp, "asynq.task.retried").AsInt64() != 0 {
				t.Fatalf("failed run: %v %v", sp.Status(), sp.Attributes())
			}
		default:
			ok++
			if attr(sp, "asynq.task.retried").AsInt64() != 1 || !attr(sp, "zclaim.run.resumed").AsBool() {
				t.Fatalf("the retry: %v", sp.Attributes())
			}
		}
	}
	if failed != 1 || ok != 1 {
		t.Fatalf("%d failed and %d ok runs, want one each", failed, ok)
	}
}

// A plain ZADD member carries no trace context: its enqueue and its run
// start a trace of their own.
func TestPlainMemberRootSpan(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	s.serve(t, func(context.Context, *asynq.Task) error { return nil })
	if err := s.rdb.ZAdd(ctx, s.key, redis.Z{Score: float64(time.Now().Unix() - 1), Member: "legacy-1"}).Err(); err != nil {
		t.Fatal(err)
	}
	s.dispatch(t, zclaim.DispatcherOptions{DefaultType: "work"})
	send := s.spans(t, "send "+s.queue, 1)[0]
	run := s.spans(t, "process "+s.queue, 1)[0]
	if send.Parent().IsValid() || run.Parent().SpanID() != send.SpanContext().SpanID() {
		t.Fatalf("send parent %v, run parent %v (send %v)", send.Parent(), run.Parent(), send.SpanContext())
	}
}

const workerRole = "ZCLAIMOTEL_TEST_WORKER"

// worker is a worker process: the middleware and zclaimotel's around a
// handler that marks its start and never returns.
func worker() {
	rdb := redis.NewClient(&redis.Options{Addr: os.Getenv("ZCLAIMOTEL_ADDR")})
	idem, err := zclaim.NewIdempotency(rdb, zclaim.IdempotencyOptions{Prefix: os.Getenv("ZCLAIMOTEL_KEY") + ":run:",
		Lease: time.Second, TakeoverQueues: []string{os.Getenv("ZCLAIMOTEL_QUEUE")}})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	mux := asynq.NewServeMux()
	mux.Use(idem.Middleware(), zclaimotel.Middleware())
	mux.HandleFunc("work", func(ctx context.Context, _ *asynq.Task) error {
		rdb.Set(ctx, os.Getenv("ZCLAIMOTEL_KEY")+":started", "1", time.Minute)
		select {}
	})
	srv := asynq.NewServerFromRedisClient(idem.AsynqClient(), asynq.Config{
		Queues: map[string]int{os.Getenv("ZCLAIMOTEL_QUEUE"): 1}, TaskCheckInterval: 10 * time.Millisecond,
		LogLevel: asynq.FatalLevel})
	if err := srv.Run(mux); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
}

// A worker SIGKILLed mid-handler: a live process takes its run over, and
// the run it starts is a span of the job's trace, under the enqueue's.
func TestTakeoverSameTrace(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), workerRole+"=1", "ZCLAIMOTEL_ADDR="+addr, "ZCLAIMOTEL_KEY="+s.key,
		"ZCLAIMOTEL_QUEUE="+s.queue)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	s.dispatch(t, zclaim.DispatcherOptions{})
	rctx, request := s.tp.Tracer("app").Start(ctx, "POST /orders")
	job := zclaim.Job{ID: "order-9", RunAt: time.Now().Add(-time.Second), Type: "work"}
	zclaimotel.Inject(rctx, &job)
	if err := s.broker.Schedule(rctx, job); err != nil {
		t.Fatal(err)
	}
	request.End()
	deadline := time.Now().Add(15 * time.Second)
	for s.rdb.Exists(ctx, s.key+":started").Val() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the worker never started the handler")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	s.serve(t, func(context.Context, *asynq.Task) error { return nil })
	send := s.spans(t, "send "+s.queue, 1)[0]
	run := s.spans(t, "process "+s.queue, 1)[0]
	if run.SpanContext().TraceID() != request.SpanContext().TraceID() || run.Parent().SpanID() != send.SpanContext().SpanID() ||
		!attr(run, "zclaim.run.resumed").AsBool() {
		t.Fatalf("the run after the takeover: trace %v parent %v attrs %v", run.SpanContext().TraceID(), run.Parent(),
			run.Attributes())
	}
}
