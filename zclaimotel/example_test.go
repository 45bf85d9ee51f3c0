package zclaimotel_test

import (
	"context"
	"log"
	"net/http"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/zclaim/zclaim"
	"github.com/zclaim/zclaim/zclaimotel"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// A request schedules a reminder inside its span; the dispatcher's
// enqueue and each run of the task are spans of the same trace, printed
// by the SDK's stdout exporter.
func Example() {
	ctx := context.Background()
	exp, err := stdouttrace.New(stdouttrace.WithPrettyPrint())
	if err != nil {
		log.Fatal(err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp))
	defer tp.Shutdown(ctx)
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(propagation.TraceContext{})

	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	broker, err := zclaim.NewBroker(rdb, zclaim.BrokerOptions{})
	if err != nil {
		log.Fatal(err)
	}
	idem, err := zclaim.NewIdempotency(rdb, zclaim.IdempotencyOptions{})
	if err != nil {
		log.Fatal(err)
	}

	// The producer: a job scheduled inside the request's span carries it.
	http.HandleFunc("POST /orders", func(w http.ResponseWriter, r *http.Request) {
		rctx, span := otel.Tracer("shop").Start(r.Context(), "POST /orders")
		defer span.End()
		job := zclaim.Job{ID: "order-731:reminder", RunAt: time.Now().Add(time.Hour), Type: "email:reminder"}
		zclaimotel.Inject(rctx, &job)
		if err := broker.Schedule(rctx, job); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
		}
	})

	// The dispatcher: its enqueue is a producer span of the job's trace.
	d, err := zclaim.NewDispatcher(broker, asynq.NewClientFromRedisClient(rdb), zclaim.DispatcherOptions{
		Enqueue: zclaimotel.EnqueueHook(),
	})
	if err != nil {
		log.Fatal(err)
	}
	go d.Run(ctx)

	// The worker: each run a consumer span under the enqueue's.
	mux := asynq.NewServeMux()
	mux.Use(idem.Middleware(), zclaimotel.Middleware())
	mux.HandleFunc("email:reminder", func(ctx context.Context, t *asynq.Task) error { return nil })
	srv := asynq.NewServerFromRedisClient(idem.AsynqClient(), asynq.Config{})
	go srv.Run(mux)

	// Metrics through the global MeterProvider.
	if _, err := zclaimotel.RegisterMetrics(zclaimotel.Metrics{Brokers: []*zclaim.Broker{broker},
		Dispatchers: []*zclaim.Dispatcher{d}, Idempotency: []*zclaim.Idempotency{idem}}); err != nil {
		log.Fatal(err)
	}
	log.Fatal(http.ListenAndServe("127.0.0.1:8080", nil))
}
