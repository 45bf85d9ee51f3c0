package zclaim_test

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/zclaim/zclaim"
)

// The README's quick start: a Broker, a Dispatcher and the middleware wired
// into an asynq server.
func ExampleDispatcher_Run() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	rdb := redis.NewClient(&redis.Options{Addr: os.Getenv("REDIS_ADDR")}) // your client; zclaim never closes it
	defer rdb.Close()
	key := "zclaim-example:{dispatcher-run}" // e.g. "delay:jobs", the set your producers write

	broker, _ := zclaim.NewBroker(rdb, zclaim.BrokerOptions{Key: key})
	idem, _ := zclaim.NewIdempotency(rdb, zclaim.IdempotencyOptions{Prefix: key + ":run:"})

	handled := make(chan string)
	mux := asynq.NewServeMux()
	mux.Use(idem.Middleware())
	mux.HandleFunc("order:reminder", func(ctx context.Context, t *asynq.Task) error {
		handled <- string(t.Payload())
		return nil
	})
	queue := key // one queue per example run; yours is "default" or your own
	// On the store's AsynqClient, a run's Complete goes with asynq's done.
	srv := asynq.NewServerFromRedisClient(idem.AsynqClient(), asynq.Config{
		Queues:            map[string]int{queue: 1},
		IsFailure:         zclaim.IsFailure,
		RetryDelayFunc:    zclaim.RetryDelay,
		TaskCheckInterval: 20 * time.Millisecond, // asynq's default idle sleep is up to 1.5 s
		LogLevel:          asynq.FatalLevel,
	})
	_ = srv.Start(mux)
	defer srv.Shutdown()

	ap, _ := rdb.AutoPipeline() // enqueues of one moment share round trips
	d, _ := zclaim.NewDispatcher(broker, asynq.NewClientFromRedisClient(ap), zclaim.DispatcherOptions{
		TaskRetention: -1, // asynq keeps no finished task: the middleware's records stop a re-dispatch
	})
	go d.Run(ctx)

	_ = broker.Schedule(ctx, zclaim.Job{ID: "order-731:reminder", RunAt: time.Now().Add(50 * time.Millisecond),
		Type: "order:reminder", Payload: []byte(`{"order":731}`), Queue: queue})
	fmt.Println(<-handled)
	// Output: {"order":731}
}
