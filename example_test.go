package zclaim_test

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/zclaim/zclaim"
)

func ExampleBroker_Schedule() {
	ctx := context.Background()
	// Your *redis.Client or *redis.ClusterClient (an empty Addr is localhost:6379).
	rdb := redis.NewClient(&redis.Options{Addr: os.Getenv("REDIS_ADDR")})
	defer rdb.Close()

	b, err := zclaim.NewBroker(rdb, zclaim.BrokerOptions{Key: "zclaim-example:{broker-schedule}"})
	if err != nil {
		panic(err)
	}
	err = b.Schedule(ctx,
		zclaim.Job{ID: "order-731:reminder", RunAt: time.Now().Add(time.Hour),
			Type: "email:reminder", Payload: []byte(`{"order":731}`)},
		zclaim.Job{ID: "order-732:reminder", RunAt: time.Now().Add(2 * time.Hour),
			Type: "email:reminder", Payload: []byte(`{"order":732}`)},
	)
	if err != nil {
		panic(err)
	}
	st, _ := b.Stats(ctx)
	fmt.Println("scheduled:", st.Scheduled, "due:", st.Due)
	// Output: scheduled: 2 due: 0
}

func ExampleBroker_Claim() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: os.Getenv("REDIS_ADDR")})
	defer rdb.Close()
	b, _ := zclaim.NewBroker(rdb, zclaim.BrokerOptions{Key: "zclaim-example:{broker-claim}", Lease: 10 * time.Second})
	_ = b.Schedule(ctx, zclaim.Job{ID: "order-731:reminder", RunAt: time.Now().Add(-time.Second),
		Type: "email:reminder", Payload: []byte(`{"order":731}`)})

	claims, err := b.Claim(ctx, 10)
	if err != nil {
		panic(err)
	}
	for _, c := range claims {
		fmt.Printf("%s %s %s attempt %d\n", c.ID, c.Type, c.Payload, c.Attempt)
		// ... do the work, calling b.Extend before c.LeaseUntil if it runs long ...
		if err := b.Ack(ctx, c); err != nil {
			// zclaim.ErrLeaseLost: the lease expired and the job was
			// recovered; another worker owns it now.
			fmt.Println(err)
		}
	}
	// Output: order-731:reminder email:reminder {"order":731} attempt 1
}

func ExampleBroker_Ack() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: os.Getenv("REDIS_ADDR")})
	defer rdb.Close()
	b, _ := zclaim.NewBroker(rdb, zclaim.BrokerOptions{
		Key:     "zclaim-example:{broker-ack}",
		Lease:   20 * time.Millisecond,
		Backoff: func(attempt int) time.Duration { return 0 }, // retry at once
	})
	_ = b.Schedule(ctx, zclaim.Job{ID: "order-731", RunAt: time.Now().Add(-time.Second)})

	claims, _ := b.Claim(ctx, 1)
	stale := claims[0]
	time.Sleep(30 * time.Millisecond) // the worker stalls past its lease
	r, _ := b.Recover(ctx)            // usually run by RunRecovery or a Dispatcher
	fmt.Println("requeued:", r.Requeued)

	claims, _ = b.Claim(ctx, 1)
	fmt.Println("stale ack:", b.Ack(ctx, stale))
	fmt.Println("current ack:", b.Ack(ctx, claims[0]), "attempt", claims[0].Attempt)
	// Output:
	// requeued: 1
	// stale ack: zclaim: ack order-731: lease lost
	// current ack: <nil> attempt 2
}

func ExampleBroker_Revive() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: os.Getenv("REDIS_ADDR")})
	defer rdb.Close()
	b, _ := zclaim.NewBroker(rdb, zclaim.BrokerOptions{Key: "zclaim-example:{broker-revive}"})
	_ = b.Schedule(ctx, zclaim.Job{ID: "order-731:invoice", RunAt: time.Now().Add(-time.Second),
		Type: "email:invoice", Payload: []byte(`{"order":731}`)})
	claims, _ := b.Claim(ctx, 1)
	_ = b.Kill(ctx, claims[0], "mail server refused the address") // or its last attempt failed

	dead, _ := b.List(ctx, zclaim.StateDead, zclaim.ListOptions{Limit: 10})
	fmt.Println("dead:", dead.Jobs[0].ID, "-", dead.Jobs[0].Reason)
	// ... the address is fixed: run it again, with no attempts spent ...
	n, err := b.Revive(ctx, dead.Jobs[0].ID)
	if err != nil {
		panic(err)
	}
	claims, _ = b.Claim(ctx, 1)
	fmt.Println("revived:", n, "claimed:", claims[0].ID, claims[0].Type, "attempt", claims[0].Attempt)
	// Output:
	// dead: order-731:invoice - mail server refused the address
	// revived: 1 claimed: order-731:invoice email:invoice attempt 1
}

// Where is job order-731, and what happened to it? Jobs finds every entry
// of the id: on the schedule, in flight, dead, and the asynq tasks a
// Dispatcher made of it, with asynq's state of each.
func ExampleBroker_Jobs() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: os.Getenv("REDIS_ADDR")})
	defer rdb.Close()

	b, err := zclaim.NewBroker(rdb, zclaim.BrokerOptions{Key: "zclaim-example:{broker-jobs}"})
	if err != nil {
		panic(err)
	}
	if err := b.Schedule(ctx, zclaim.Job{ID: "order-731", RunAt: time.Now().Add(time.Hour), Type: "email"}); err != nil {
		panic(err)
	}
	jobs, err := b.Jobs(ctx, "order-731")
	if err != nil {
		panic(err)
	}
	for _, j := range jobs {
		switch j.State {
		case zclaim.StateEnqueued: // the Dispatcher made it an asynq task
			fmt.Println(j.State, j.Queue, j.TaskID, j.TaskState, j.LastError)
		default:
			fmt.Println(j.State, j.Type)
		}
	}
	// Output: scheduled email
}
