package zclaim

import (
	"context"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/zclaim/zclaim/internal/logbuf"
)

// Where asynq's dequeue script is not the one the adapter knows (as after
// an asynq upgrade that changed it; here the store is told to know
// another SHA1), the AsynqClient passes asynq's dequeues on as they are:
// every task still runs, once, and the store says so once, at Warn, with
// asynq's version; Stats().AdapterOff counts it, and Broker.Doctor shows
// it as a problem of the check "asynq adapter", from Redis, to any
// process of the store. With the script it knows, none of it.
func TestAdapterOffIsLoud(t *testing.T) {
	t.Parallel()
	for _, changed := range []bool{false, true} {
		t.Run("changed="+strconv.FormatBool(changed), func(t *testing.T) {
			t.Parallel()
			rdb := newClient(t)
			q := testQueue(t)
			prefix := testKey(t) + ":run:"
			var logs logbuf.Buffer
			idem := newIdem(t, rdb, IdempotencyOptions{Prefix: prefix, TakeoverQueues: []string{q},
				Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))})
			if changed {
				idem.adapter.dequeue = strings.Repeat("0", 40)
			}
			var mu sync.Mutex
			ran := map[string]int{}
			startAsynqOn(t, idem.AsynqClient(), testAddr, q, idem.Middleware()(asynq.HandlerFunc(
				func(ctx context.Context, _ *asynq.Task) error {
					id, _ := asynq.GetTaskID(ctx)
					mu.Lock()
					ran[id]++
					mu.Unlock()
					return nil
				})), asynq.Config{IsFailure: IsFailure, RetryDelayFunc: RetryDelay})
			c := newAsynqClient(t, testAddr)
			const n = 10
			for k := range n {
				_, err := c.Enqueue(asynq.NewTask("work", nil), asynq.Queue(q), asynq.TaskID("ad-"+strconv.Itoa(k)))
				must(t, err)
			}
			waitFor(t, 20*time.Second, "every task to run", func() bool {
				mu.Lock()
				defer mu.Unlock()
				return len(ran) == n
			})
			mu.Lock()
			for id, c := range ran {
				if c != 1 {
					t.Errorf("%s ran %d times", id, c)
				}
			}
			mu.Unlock()
			held, err := rdb.Exists(ctx, heldKey(q)).Result()
			must(t, err)
			other := newIdem(t, rdb, IdempotencyOptions{Prefix: prefix, DisableTakeover: true})
			checks, err := newBroker(t, BrokerOptions{}).Doctor(ctx, DoctorOptions{Store: other})
			must(t, err)
			var check *Checked
			for k := range checks {
				if checks[k].Check == "asynq adapter" {
					check = &checks[k]
				}
			}
			warns := strings.Count(logs.String(), "a part of the asynq adapter is off")
			if !changed {
				if warns != 0 || idem.Stats().AdapterOff != 0 || check == nil || check.Issue != nil {
					t.Fatalf("the known script: %d warnings, AdapterOff %d, doctor %+v; want none, 0, a pass\n%s",
						warns, idem.Stats().AdapterOff, check, logs.String())
				}
				return
			}
			if warns != 1 || !strings.Contains(logs.String(), "dequeue script") || !strings.Contains(logs.String(), "asynq=v0.26") {
				t.Fatalf("%d warnings, want one naming the dequeue script and asynq's version:\n%s", warns, logs.String())
			}
			if got := idem.Stats().AdapterOff; got != 1 {
				t.Fatalf("AdapterOff %d, want 1", got)
			}
			if held != 0 {
				t.Fatal("tasks were marked as held by a dequeue the adapter does not know")
			}
			if check == nil || check.Issue == nil || !strings.Contains(check.Result, "dequeue script") {
				t.Fatalf("doctor's asynq adapter check: %+v; want a problem naming the dequeue script", check)
			}
		})
	}
}
