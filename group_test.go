package zclaim

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// roundTrips counts what a client sends: one per command or pipeline.
type roundTrips struct{ n *atomic.Int64 }

func (h roundTrips) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h roundTrips) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { h.n.Add(1); return next(ctx, cmd) }
}
func (h roundTrips) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error { h.n.Add(1); return next(ctx, cmds) }
}

// One store shared by many goroutines: every call gets its own answer
// although calls share pipelines, and they do share them.
func TestGroupCommitShared(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: testAddr, PoolSize: 8})
	t.Cleanup(func() { rdb.Close() })
	var trips atomic.Int64
	rdb.AddHook(roundTrips{&trips})
	i := newIdem(t, rdb, IdempotencyOptions{Lease: time.Minute})
	i.Begin(ctx, "warm-up") // loads the scripts

	const workers, each = 64, 20
	var calls atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	start := make(chan struct{})
	var contested atomic.Int32
	trips.Store(0)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			if _, err := i.Begin(ctx, "contested"); err == nil {
				contested.Add(1)
			} else if !errors.Is(err, ErrInProgress) {
				errs <- err
			}
			calls.Add(1)
			for k := range each {
				key := fmt.Sprintf("w%d-k%d", w, k)
				e, err := i.Begin(ctx, key)
				if err != nil {
					errs <- fmt.Errorf("begin %s: %w", key, err)
					return
				}
				if e.Key != key {
					errs <- fmt.Errorf("begin %s answered for %s", key, e.Key)
				}
				if err := e.Complete(ctx); err != nil {
					errs <- fmt.Errorf("complete %s: %w", key, err)
				}
				if _, err := i.Begin(ctx, key); !errors.Is(err, ErrAlreadyDone) {
					errs <- fmt.Errorf("begin %s again: %v", key, err)
				}
				calls.Add(3)
			}
		}()
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if contested.Load() != 1 {
		t.Fatalf("%d goroutines acquired the contested key", contested.Load())
	}
	t.Logf("%d calls in %d round trips", calls.Load(), trips.Load())
	if trips.Load() >= calls.Load() {
		t.Fatalf("%d calls took %d round trips: no call shared a pipeline", calls.Load(), trips.Load())
	}
}
