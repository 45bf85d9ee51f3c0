package zclaim_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/zclaim/zclaim"
)

// Wrap a ServeMux so every handler runs at most once at a time per job,
// and not again once it finished.
func ExampleIdempotency_Middleware() {
	rdb := redis.NewClient(&redis.Options{Addr: os.Getenv("REDIS_ADDR")}) // the Redis of your asynq server, or another
	defer rdb.Close()

	idem, err := zclaim.NewIdempotency(rdb, zclaim.IdempotencyOptions{
		Prefix:    "zclaim-example:{idempotency-middleware}:",
		Lease:     30 * time.Second, // renewed every 10s while a handler runs
		Retention: 24 * time.Hour,   // a finished job is skipped for a day
		// The default key is the asynq task id (the job id, for tasks from a
		// Dispatcher). Here the work is keyed on the order in the payload, so
		// two tasks enqueued for one order run once.
		Key: func(_ context.Context, t *asynq.Task) (string, error) {
			var p struct{ Order int }
			if err := json.Unmarshal(t.Payload(), &p); err != nil {
				return "", err
			}
			return fmt.Sprintf("order-%d:reminder", p.Order), nil
		},
	})
	if err != nil {
		panic(err)
	}
	mux := asynq.NewServeMux()
	mux.Use(idem.Middleware())
	mux.HandleFunc("email:reminder", func(ctx context.Context, t *asynq.Task) error {
		e, _ := zclaim.ExecutionFromContext(ctx)
		// Hand e.Key and e.Token to downstream writes: a store that keeps the
		// highest token per key can refuse a stale worker's late write.
		fmt.Println("sending reminder", e.Key, e.Token > 0)
		return nil
	})

	// Your server: asynq.NewServerFromRedisClient(idem.AsynqClient(), asynq.Config{
	//     IsFailure:      zclaim.IsFailure,  // "in progress elsewhere" is not a failure
	//     RetryDelayFunc: zclaim.RetryDelay, // and is retried soon
	// }).Run(mux)
	// Here two tasks for one order reach the handler, as asynq would hand them:
	for range 2 {
		task := asynq.NewTask("email:reminder", []byte(`{"order":731}`))
		if err := mux.ProcessTask(context.Background(), task); err != nil {
			fmt.Println(err)
		}
	}
	// Output: sending reminder order-731:reminder true
}
