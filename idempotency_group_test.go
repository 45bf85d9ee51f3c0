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

// pipelineSizes records the size of every pipeline of scripts a client sends, and
// holds the first single calls back for a while, so that the calls made
// meanwhile must wait and group.
type pipelineSizes struct {
	mu    sync.Mutex
	sizes []int
	held  *atomic.Int64
}

func (h *pipelineSizes) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *pipelineSizes) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() == "evalsha" && h.held.Add(-1) >= 0 {
			time.Sleep(50 * time.Millisecond)
		}
		return next(ctx, cmd)
	}
}
func (h *pipelineSizes) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if cmds[0].Name() == "evalsha" { // not the state marker's
			h.mu.Lock()
			h.sizes = append(h.sizes, len(cmds))
			h.mu.Unlock()
		}
		return next(ctx, cmds)
	}
}

// Begins and Completes made at the same moment go to Redis together, and
// grouping changes nothing they decide: of many goroutines beginning one
// key, exactly one acquires it; every distinct key is acquired and
// completed once; a lone call goes at once, alone.
func TestIdempotencyGroupCommit(t *testing.T) {
	t.Parallel()
	var held atomic.Int64
	hook := &pipelineSizes{held: &held}
	rdb := redis.NewClient(&redis.Options{Addr: testAddr, PoolSize: 2 * groupRounds})
	t.Cleanup(func() { rdb.Close() })
	rdb.AddHook(hook)
	i := newIdem(t, rdb, IdempotencyOptions{Lease: time.Minute})

	// A lone Begin and Complete: no pipeline.
	e, err := i.Begin(ctx, "lone")
	must(t, err)
	must(t, e.Complete(ctx))
	if len(hook.sizes) != 0 {
		t.Fatalf("a lone call went in pipelines %v", hook.sizes)
	}

	// The first groupRounds calls are held on their way; the rest wait.
	held.Store(groupRounds)
	const n = 64
	var acquired, done, skipped atomic.Int64
	var wg sync.WaitGroup
	for w := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := i.Begin(ctx, "same")
			switch {
			case err == nil:
				acquired.Add(1)
			case !errors.Is(err, ErrInProgress):
				t.Errorf("begin same: %v", err)
			}
			k := fmt.Sprintf("k%d", w)
			e2, err := i.Begin(ctx, k)
			if err != nil {
				t.Errorf("begin %s: %v", k, err)
				return
			}
			if err := e2.Complete(ctx); err != nil {
				t.Errorf("complete %s: %v", k, err)
				return
			}
			done.Add(1)
			if _, err := i.Begin(ctx, k); errors.Is(err, ErrAlreadyDone) {
				skipped.Add(1)
			} else {
				t.Errorf("begin %s after complete: %v", k, err)
			}
		}()
	}
	wg.Wait()
	if acquired.Load() != 1 || done.Load() != n || skipped.Load() != n {
		t.Fatalf("one key acquired %d times (want 1); %d of %d keys completed, %d skipped after", acquired.Load(), done.Load(), n, skipped.Load())
	}
	hook.mu.Lock()
	defer hook.mu.Unlock()
	calls, grouped := 3*n+n, 0
	for _, s := range hook.sizes {
		grouped += s
	}
	if len(hook.sizes) == 0 || grouped < n/2 {
		t.Fatalf("of %d calls made at once, %d went in %d pipelines: they did not group", calls, grouped, len(hook.sizes))
	}
	t.Logf("%d calls, %d of them in %d pipelines", calls, grouped, len(hook.sizes))
}
