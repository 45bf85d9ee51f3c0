package zclaim

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/zclaim/zclaim/internal/wait"
)

// newIdem returns a store on the test server under a prefix of the test's own.
func newIdem(t testing.TB, rdb redis.UniversalClient, opts IdempotencyOptions) *Idempotency {
	t.Helper()
	if opts.Prefix == "" {
		opts.Prefix = testKey(t) + ":run:"
	}
	if opts.Lease == 0 {
		opts.Lease = 60 * time.Millisecond
	}
	// Takeovers only where a test names its queues: a loop that looks at
	// every queue of the shared server would cost every test.
	if opts.TakeoverQueues == nil {
		opts.DisableTakeover = true
	}
	i, err := NewIdempotency(rdb, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { i.Close() })
	return i
}

// fastRetry retries tasks that met a run in progress as RetryDelay says,
// and other failures after 10 ms (asynq's default waits seconds).
func fastRetry(n int, err error, t *asynq.Task) time.Duration {
	if errors.Is(err, ErrInProgress) {
		return RetryDelay(n, err, t)
	}
	return 10 * time.Millisecond
}

func payloadKey(_ context.Context, t *asynq.Task) (string, error) { return string(t.Payload()), nil }

// Begin, Complete, Release and Extend follow the run record; a stale
// holder's calls fail with ErrLeaseLost and change nothing.
func TestIdempotencyFencing(t *testing.T) {
	t.Parallel()
	rdb := newClient(t)
	// Long enough for two calls in a row on a loaded machine, where 30 ms
	// was not, 50 times running.
	const lease = 200 * time.Millisecond
	i := newIdem(t, rdb, IdempotencyOptions{Lease: lease})
	// A second Begin within the lease meets the first run. On a loaded
	// machine the second call can come after the lease: that attempt
	// proves nothing, and the next one starts over on a key of its own.
	// (The lease's deadline is in whole milliseconds of Redis' clock: it
	// can end up to 1 ms sooner than a Lease after the call.)
	var e1 *Execution
	k := ""
	for try := 0; ; try++ {
		k = fmt.Sprintf("k%d", try)
		start := time.Now()
		var err error
		e1, err = i.Begin(ctx, k)
		must(t, err)
		_, err = i.Begin(ctx, k)
		if err == nil && time.Since(start) >= lease-time.Millisecond && try < 50 {
			continue
		}
		wantErr(t, err, ErrInProgress)
		var ip *InProgressError
		if !errors.As(err, &ip) || ip.LeaseLeft <= 0 || ip.LeaseLeft > lease {
			t.Fatalf("%v", err)
		}
		break
	}
	time.Sleep(lease + 10*time.Millisecond)
	e2, err := i.Begin(ctx, k) // e1's lease passed without renewal
	must(t, err)
	if e2.Token <= e1.Token {
		t.Fatalf("token %d after %d", e2.Token, e1.Token)
	}
	wantErr(t, e1.Extend(ctx), ErrLeaseLost)
	wantErr(t, e1.Complete(ctx), ErrLeaseLost)
	wantErr(t, e1.Release(ctx), ErrLeaseLost)
	// Extend moves the lease to a Lease from its call by Redis' clock (a
	// check by this process' clock fails when the machine stalls it for a
	// lease). 2 ms on, that is past where Begin put it.
	time.Sleep(2 * time.Millisecond)
	before := redisNow(t, rdb).Truncate(time.Millisecond)
	must(t, e2.Extend(ctx))
	if until := e2.LeaseUntil(); until.Before(before.Add(lease)) {
		t.Fatalf("extended lease ends at %v, before Redis' clock at the call + Lease (%v)", until, before.Add(lease))
	}
	must(t, e2.Release(ctx))
	e3, err := i.Begin(ctx, k) // released: the next run starts at once
	must(t, err)
	if e3.Token <= e2.Token {
		t.Fatalf("token %d after %d", e3.Token, e2.Token)
	}
	wantErr(t, e2.Complete(ctx), ErrLeaseLost)
	must(t, e3.Complete(ctx))
	_, err = i.Begin(ctx, k)
	wantErr(t, err, ErrAlreadyDone)
	wantErr(t, e3.Complete(ctx), ErrLeaseLost)
	// Finished: the run record is gone, the finish is a field of its bucket.
	if n, _ := rdb.Exists(ctx, i.recordKey(k)).Result(); n != 0 {
		t.Fatal("a finished run kept its run record")
	}
	bucket, field := i.doneOf(k)
	if fin, err := rdb.HGet(ctx, bucket, field).Int64(); err != nil || time.Since(time.UnixMilli(fin)).Abs() > time.Minute {
		t.Fatalf("finished record %d (%v)", fin, err)
	}
}

// Many goroutines, each on its own connection, Begin one key at once:
// exactly one acquires.
func TestBeginConcurrentOneWinner(t *testing.T) {
	t.Parallel()
	prefix := testKey(t) + ":run:"
	for round := 0; round < 20; round++ {
		key := fmt.Sprintf("job-%d", round)
		var won, busy atomic.Int32
		start := make(chan struct{})
		var wg sync.WaitGroup
		errs := make(chan error, 32)
		for g := 0; g < 32; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				c := ownConn(t)
				i, _ := NewIdempotency(c, IdempotencyOptions{Prefix: prefix, Lease: time.Minute})
				c.Ping(ctx)
				<-start
				_, err := i.Begin(ctx, key)
				switch {
				case err == nil:
					won.Add(1)
				case errors.Is(err, ErrInProgress):
					busy.Add(1)
				default:
					errs <- err
				}
			}()
		}
		close(start)
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		if won.Load() != 1 || busy.Load() != 31 {
			t.Fatalf("round %d: %d acquired, %d in progress", round, won.Load(), busy.Load())
		}
	}
}

// A finished record disappears after Retention, and the key runs again
// with a larger token.
func TestRetention(t *testing.T) {
	t.Parallel()
	rdb := newClient(t)
	// A running record lives Lease + Retention: a lease of a second keeps
	// it until Complete on a loaded machine.
	i := newIdem(t, rdb, IdempotencyOptions{Lease: time.Second, Retention: 50 * time.Millisecond})
	e, err := i.Begin(ctx, "r")
	must(t, err)
	must(t, e.Complete(ctx))
	_, err = i.Begin(ctx, "r")
	wantErr(t, err, ErrAlreadyDone)
	bucket, _ := i.doneOf("r")
	waitFor(t, 10*time.Second, "the record to expire", func() bool {
		n, _ := rdb.Exists(ctx, i.recordKey("r"), bucket).Result()
		return n == 0
	})
	e2, err := i.Begin(ctx, "r")
	must(t, err)
	if e2.Token <= e.Token {
		t.Fatalf("token %d after %d", e2.Token, e.Token)
	}
}

// Bad input and bad records: clear errors, nothing written.
func TestIdempotencyBadInput(t *testing.T) {
	t.Parallel()
	rdb := newClient(t)
	i := newIdem(t, rdb, IdempotencyOptions{})
	_, err := i.Begin(ctx, "")
	wantErr(t, err, ErrEmptyID)
	_, err = i.Begin(ctx, strings.Repeat("k", MaxIDLen+1))
	wantErr(t, err, ErrIDTooLong)
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	_, err = i.Begin(cctx, "k")
	wantErr(t, err, context.Canceled)
	must(t, rdb.HSet(ctx, i.recordKey("hash"), "s", "run").Err())
	_, err = i.Begin(ctx, "hash")
	var wt *WrongTypeError
	if !errors.As(err, &wt) || wt.Key != i.recordKey("hash") || wt.Want != "string" || wt.Got != "hash" {
		t.Fatalf("%v", err)
	}
	for _, bad := range []string{"x", "zzz 1 1", "run 1", "run 1 1 1", "done 99999999999999999999 1", "run -1 5"} {
		must(t, rdb.Set(ctx, i.recordKey("bad"), bad, 0).Err())
		_, err = i.Begin(ctx, "bad")
		wantErr(t, err, ErrCorrupt)
		if v, _ := rdb.Get(ctx, i.recordKey("bad")).Result(); v != bad {
			t.Fatalf("a corrupt record %q was overwritten", bad)
		}
	}
	// Lua numbers are doubles, which tell integers apart only up to 2^53:
	// a token from 2^53 - 1 up is corrupt, since the runs after it could not
	// be given larger ones.
	for _, bad := range []string{"free 9007199254740991 0", "free 9007199254740992 0", "run 9007199254740993 1"} {
		must(t, rdb.Set(ctx, i.recordKey("big"), bad, 0).Err())
		_, err = i.Begin(ctx, "big")
		wantErr(t, err, ErrCorrupt)
	}
	must(t, rdb.Set(ctx, i.recordKey("big"), "free 9007199254740990 0", 0).Err())
	if e, err := i.Begin(ctx, "big"); err != nil || e.Token != 9007199254740991 {
		t.Fatalf("after token 9007199254740990: %+v, %v", e, err)
	}
	// A history of another type: Complete says which key, and changes nothing.
	e, err := i.Begin(ctx, "hk")
	must(t, err)
	bucket, _ := i.doneOf("hk")
	hist := historyOf(bucket, i.Prefix())
	must(t, rdb.Set(ctx, hist, "x", 0).Err())
	if err := e.Complete(ctx); !errors.As(err, &wt) || wt.Key != hist || wt.Want != "hash" || wt.Got != "string" {
		t.Fatalf("Complete with a history of another type: %v", err)
	}
	if n, _ := rdb.Exists(ctx, i.recordKey("hk")).Result(); n != 1 {
		t.Fatal("the failed Complete removed the run record")
	}
	must(t, rdb.Del(ctx, hist).Err())
	must(t, e.Complete(ctx))
	for _, o := range []IdempotencyOptions{{Lease: time.Millisecond}, {Retention: -time.Second}, {Lease: time.Second, Retention: math.MaxInt64},
		{TakeAhead: -1}, {TakeAhead: MaxTakeAhead + 1}} {
		_, err := NewIdempotency(rdb, o)
		wantErr(t, err, ErrInvalidOptions)
	}
}

// 1. One business key enqueued as two asynq tasks: the handler runs once,
// both tasks complete.
func TestMiddlewareSameKeyTwice(t *testing.T) {
	t.Parallel()
	rdb := newClient(t)
	// A lease far longer than the handler: with the harness's 60 ms, a
	// renewal late on a loaded machine loses the lease, and the other
	// task rightly runs the key again (TestMiddlewareStalledWorker).
	i := newIdem(t, rdb, IdempotencyOptions{Key: payloadKey, Lease: time.Second})
	q := testQueue(t)
	var runs atomic.Int32
	h := i.Middleware()(asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
		runs.Add(1)
		time.Sleep(30 * time.Millisecond)
		return nil
	}))
	startAsynq(t, testAddr, q, h, asynq.Config{IsFailure: IsFailure, RetryDelayFunc: fastRetry})
	c := newAsynqClient(t, testAddr)
	for _, id := range []string{"a", "b"} {
		_, err := c.Enqueue(asynq.NewTask("order", []byte("order-731")), asynq.Queue(q), asynq.TaskID(id),
			asynq.Retention(time.Minute), asynq.MaxRetry(5))
		must(t, err)
	}
	in := newInspector(t)
	waitFor(t, 10*time.Second, "both tasks to complete", func() bool {
		for _, id := range []string{"a", "b"} {
			ti, err := in.GetTaskInfo(q, id)
			if err != nil || ti.State != asynq.TaskStateCompleted {
				return false
			}
		}
		return true
	})
	if n := runs.Load(); n != 1 {
		t.Fatalf("handler ran %d times (%+v)", n, i.Stats())
	}
	for _, id := range []string{"a", "b"} {
		ti, _ := in.GetTaskInfo(q, id)
		if ti.Retried != 0 {
			t.Fatalf("task %s counted %d failures for a run in progress", id, ti.Retried)
		}
	}
}

// 2. The stalled worker: the first run stops renewing (its connection to
// Redis hangs) while its handler goes on. The second delivery does not
// start while the first lease is live; the first handler's context is
// cancelled with ErrLeaseLost, and its Complete returns ErrLeaseLost.
func TestMiddlewareStalledWorker(t *testing.T) {
	t.Parallel()
	const lease = 90 * time.Millisecond
	direct := newClient(t)
	prefix := testKey(t) + ":run:"
	px := newProxy(t, testAddr)
	i1 := newIdem(t, clientVia(t, px), IdempotencyOptions{Prefix: prefix, Lease: lease, Key: payloadKey})
	i2 := newIdem(t, direct, IdempotencyOptions{Prefix: prefix, Lease: lease, Key: payloadKey})

	type firstRun struct {
		e         *Execution
		cause     error
		cancelled time.Time // by Redis' clock
		complete  error
	}
	started := make(chan *Execution, 1)
	resumed := make(chan struct{})
	firstDone := make(chan firstRun, 1)
	h1 := i1.Middleware()(asynq.HandlerFunc(func(ctx context.Context, _ *asynq.Task) error {
		e, _ := ExecutionFromContext(ctx)
		started <- e
		<-ctx.Done()
		r := firstRun{e: e, cause: context.Cause(ctx), cancelled: redisNow(t, direct)}
		<-resumed
		r.complete = e.Complete(context.Background())
		firstDone <- r
		return nil
	}))
	type secondRun struct {
		e     *Execution
		start time.Time
	}
	var second atomic.Int32
	secondStarted := make(chan secondRun, 4)
	h2 := i2.Middleware()(asynq.HandlerFunc(func(ctx context.Context, _ *asynq.Task) error {
		second.Add(1)
		e, _ := ExecutionFromContext(ctx)
		secondStarted <- secondRun{e: e, start: redisNow(t, direct)}
		return nil
	}))
	q1, q2 := testQueue(t), testQueue(t)
	cfg := asynq.Config{IsFailure: IsFailure, RetryDelayFunc: fastRetry}
	startAsynq(t, testAddr, q1, h1, cfg)
	startAsynq(t, testAddr, q2, h2, cfg)
	c := newAsynqClient(t, testAddr)

	_, err := c.Enqueue(asynq.NewTask("order", []byte("order-9")), asynq.Queue(q1), asynq.MaxRetry(3))
	must(t, err)
	e1 := wait.Recv(t, started, 30*time.Second, "the first delivery to start")
	px.Pause() // the first worker stalls: its renewals hang
	_, err = c.Enqueue(asynq.NewTask("order", []byte("order-9")), asynq.Queue(q2), asynq.MaxRetry(3))
	must(t, err)

	s2 := wait.Recv(t, secondStarted, 10*time.Second, "the second delivery to start")
	lastLease := e1.LeaseUntil()
	if s2.start.Before(lastLease) {
		t.Fatalf("second run started at %v while the first held its lease until %v", s2.start, lastLease)
	}
	if s2.e.Token <= e1.Token {
		t.Fatalf("second token %d, first %d", s2.e.Token, e1.Token)
	}
	px.Resume()
	close(resumed)
	r := wait.Recv(t, firstDone, 30*time.Second, "the first handler to return")
	if !errors.Is(r.cause, ErrLeaseLost) {
		t.Fatalf("first handler's context cancelled with %v", r.cause)
	}
	// The first handler is told when its lease ends by its own clock, which
	// is no later than the Redis deadline the second run waited for. What
	// is measured here is when the handler saw it (a goroutine wake-up and a
	// TIME round trip later), so a loaded machine gets some slack.
	if r.cancelled.Sub(s2.start) > 250*time.Millisecond {
		t.Fatalf("first handler saw its cancellation at %v, well after the second started at %v", r.cancelled, s2.start)
	}
	wantErr(t, r.complete, ErrLeaseLost)
	time.Sleep(50 * time.Millisecond)
	if n := second.Load(); n != 1 {
		t.Fatalf("second handler ran %d times", n)
	}
}

// 3. A handler error releases the key and the retry runs and completes; a
// panic releases it too, and the panic reaches asynq.
func TestMiddlewareErrorAndPanic(t *testing.T) {
	t.Parallel()
	rdb := newClient(t)
	i := newIdem(t, rdb, IdempotencyOptions{Lease: time.Minute})
	for _, mode := range []string{"error", "panic"} {
		t.Run(mode, func(t *testing.T) {
			q := testQueue(t)
			var runs atomic.Int32
			var tokens sync.Map
			h := i.Middleware()(asynq.HandlerFunc(func(ctx context.Context, task *asynq.Task) error {
				n := runs.Add(1)
				e, _ := ExecutionFromContext(ctx)
				tokens.Store(n, e.Token)
				if n == 1 {
					if mode == "panic" {
						panic("boom")
					}
					return errors.New("transient")
				}
				return nil
			}))
			var seen atomic.Value
			startAsynq(t, testAddr, q, h, asynq.Config{IsFailure: IsFailure, RetryDelayFunc: fastRetry,
				ErrorHandler: asynq.ErrorHandlerFunc(func(_ context.Context, _ *asynq.Task, err error) { seen.Store(err.Error()) })})
			c := newAsynqClient(t, testAddr)
			id := mode + "-task"
			_, err := c.Enqueue(asynq.NewTask("x", nil), asynq.Queue(q), asynq.TaskID(id), asynq.Retention(time.Minute))
			must(t, err)
			in := newInspector(t)
			waitFor(t, 10*time.Second, "the retry to complete", func() bool {
				ti, err := in.GetTaskInfo(q, id)
				return err == nil && ti.State == asynq.TaskStateCompleted
			})
			if runs.Load() != 2 {
				t.Fatalf("handler ran %d times, want 2", runs.Load())
			}
			want := "transient"
			if mode == "panic" {
				want = "boom"
			}
			if msg, _ := seen.Load().(string); !strings.Contains(msg, want) {
				t.Fatalf("asynq saw %q, want the handler's %q", msg, want)
			}
			t1, _ := tokens.Load(int32(1))
			t2, _ := tokens.Load(int32(2))
			if t2.(int64) <= t1.(int64) {
				t.Fatalf("tokens %v then %v", t1, t2)
			}
			_, err = i.Begin(ctx, id)
			wantErr(t, err, ErrAlreadyDone)
		})
	}
}

// 5. Redis unreachable: no handler runs (fail closed); after a restart the
// work proceeds, once.
func TestMiddlewareFailClosed(t *testing.T) {
	t.Parallel()
	own := ownRedis(t)
	orc := redis.NewClient(&redis.Options{Addr: own.Addr, MaxRetries: -1, DialTimeout: 100 * time.Millisecond})
	t.Cleanup(func() { orc.Close() })
	i := newIdem(t, orc, IdempotencyOptions{Lease: time.Minute})
	q := testQueue(t)
	var runs atomic.Int32
	var failures atomic.Int32
	h := i.Middleware()(asynq.HandlerFunc(func(ctx context.Context, _ *asynq.Task) error {
		runs.Add(1)
		return nil
	}))
	startAsynq(t, testAddr, q, h, asynq.Config{IsFailure: IsFailure, RetryDelayFunc: fastRetry,
		ErrorHandler: asynq.ErrorHandlerFunc(func(context.Context, *asynq.Task, error) { failures.Add(1) })})
	own.Kill()
	c := newAsynqClient(t, testAddr)
	_, err := c.Enqueue(asynq.NewTask("x", nil), asynq.Queue(q), asynq.TaskID("fc"), asynq.MaxRetry(1000),
		asynq.Retention(time.Minute))
	must(t, err)
	waitFor(t, 10*time.Second, "a few failed attempts", func() bool { return failures.Load() >= 3 })
	if runs.Load() != 0 {
		t.Fatalf("handler ran %d times without its idempotency store", runs.Load())
	}
	must(t, own.Restart())
	in := newInspector(t)
	waitFor(t, 10*time.Second, "the task to complete", func() bool {
		ti, err := in.GetTaskInfo(q, "fc")
		return err == nil && ti.State == asynq.TaskStateCompleted
	})
	if runs.Load() != 1 {
		t.Fatalf("handler ran %d times after the restart", runs.Load())
	}
}

// The Key function: its error goes back to asynq as is; an empty key is
// an error and the handler does not run.
func TestMiddlewareKeyErrors(t *testing.T) {
	t.Parallel()
	rdb := newClient(t)
	keyErr := errors.New("no order id in payload")
	i := newIdem(t, rdb, IdempotencyOptions{Key: func(_ context.Context, task *asynq.Task) (string, error) {
		if string(task.Payload()) == "bad" {
			return "", keyErr
		}
		return string(task.Payload()), nil
	}})
	ran := false
	h := i.Middleware()(asynq.HandlerFunc(func(context.Context, *asynq.Task) error { ran = true; return nil }))
	if err := h.ProcessTask(ctx, asynq.NewTask("x", []byte("bad"))); err != keyErr {
		t.Fatalf("Key error came back as %v", err)
	}
	// Keys that can never run are not retried.
	err := h.ProcessTask(ctx, asynq.NewTask("x", nil))
	wantErr(t, err, ErrEmptyID)
	wantErr(t, err, asynq.SkipRetry)
	err = h.ProcessTask(ctx, asynq.NewTask("x", []byte(strings.Repeat("k", MaxIDLen+1))))
	wantErr(t, err, ErrIDTooLong)
	wantErr(t, err, asynq.SkipRetry)
	if ran {
		t.Fatal("handler ran without a key")
	}
	// Without asynq's context the default Key function has no task id.
	d := newIdem(t, rdb, IdempotencyOptions{})
	if err := d.Middleware()(h).ProcessTask(ctx, asynq.NewTask("x", nil)); err == nil || ran {
		t.Fatalf("default key without a task id: %v (ran %v)", err, ran)
	}
}

// On its last retry a task that meets a run in progress waits for it
// instead of failing (asynq would archive it).
func TestMiddlewareLastRetryWaits(t *testing.T) {
	t.Parallel()
	rdb := newClient(t)
	// The other run finishes 40 ms in, well inside its lease even on a
	// loaded machine (a lease that ran out first would let the task run).
	i := newIdem(t, rdb, IdempotencyOptions{Lease: 400 * time.Millisecond, Key: payloadKey})
	q := testQueue(t)
	other, err := i.Begin(ctx, "job-1") // a run elsewhere, which then finishes
	must(t, err)
	go func() {
		time.Sleep(40 * time.Millisecond)
		other.Complete(context.Background())
	}()
	var runs atomic.Int32
	h := i.Middleware()(asynq.HandlerFunc(func(context.Context, *asynq.Task) error { runs.Add(1); return nil }))
	startAsynq(t, testAddr, q, h, asynq.Config{IsFailure: IsFailure, RetryDelayFunc: fastRetry})
	c := newAsynqClient(t, testAddr)
	_, err = c.Enqueue(asynq.NewTask("x", []byte("job-1")), asynq.Queue(q), asynq.TaskID("lr"),
		asynq.MaxRetry(0), asynq.Retention(time.Minute))
	must(t, err)
	in := newInspector(t)
	waitFor(t, 10*time.Second, "the task to finish", func() bool {
		ti, err := in.GetTaskInfo(q, "lr")
		return err == nil && (ti.State == asynq.TaskStateCompleted || ti.State == asynq.TaskStateArchived)
	})
	ti, _ := in.GetTaskInfo(q, "lr")
	if ti.State != asynq.TaskStateCompleted || runs.Load() != 0 {
		t.Fatalf("task %v, handler ran %d times", ti.State, runs.Load())
	}
}

// A handler that runs for several leases keeps its key: the middleware
// renews the lease, so another Begin meets ErrInProgress throughout.
func TestMiddlewareRenewsLease(t *testing.T) {
	t.Parallel()
	rdb := newClient(t)
	const lease = time.Second // renewed every 333 ms: room for a loaded machine (300 ms ran out under load)
	i := newIdem(t, rdb, IdempotencyOptions{Lease: lease, Key: payloadKey})
	// A machine that holds a renewal back past the lease (a loaded run)
	// lets the lease lapse, and the middleware rightly cancels the run: an
	// attempt whose lease was renewed before that starts over on a key of
	// its own, up to 3 attempts. A lease never renewed fails at once.
	startOver(t, 3, func(attempt int) (fault, excuse string) {
		key := fmt.Sprintf("long-%d", attempt)
		var probes []error
		var renewed bool
		var cause error
		h := i.Middleware()(asynq.HandlerFunc(func(ctx context.Context, _ *asynq.Task) error {
			e, _ := ExecutionFromContext(ctx)
			first := e.LeaseUntil()
			for k := 0; k < 6 && ctx.Err() == nil; k++ {
				time.Sleep(lease / 2)
				renewed = renewed || e.LeaseUntil().After(first)
				_, err := i.Begin(ctx, key)
				probes = append(probes, err)
			}
			cause = context.Cause(ctx)
			return ctx.Err()
		}))
		err := h.ProcessTask(ctx, asynq.NewTask("x", []byte(key)))
		if err != nil {
			fault = fmt.Sprintf("the run ended with %v (cause %v); its lease renewed: %v", err, cause, renewed)
			if renewed && errors.Is(cause, ErrLeaseLost) {
				return fault, "renewed, then the lease lapsed"
			}
			return fault, ""
		}
		for k, err := range probes {
			if !errors.Is(err, ErrInProgress) {
				t.Fatalf("probe %d after %v: %v", k, time.Duration(k+1)*lease/2, err)
			}
		}
		_, err = i.Begin(ctx, key)
		wantErr(t, err, ErrAlreadyDone)
		return "", ""
	})
}

// The heartbeats of many handlers running at once start from the store's
// one loop, which ends when no handler is left and starts again with the
// next: each run's lease is renewed while its handler runs, and each
// completes.
func TestLeaseGuardsLoop(t *testing.T) {
	t.Parallel()
	i := newIdem(t, newClient(t), IdempotencyOptions{Lease: time.Second, Key: payloadKey})
	running := func() bool {
		i.guards.mu.Lock()
		defer i.guards.mu.Unlock()
		return i.guards.running
	}
	// runs starts n handlers that each wait for release, and returns
	// whether each saw its lease renewed, and its error, once released.
	runs := func(round, n int, release <-chan struct{}) (renewed []atomic.Bool, errs chan error) {
		renewed, errs = make([]atomic.Bool, n), make(chan error, n)
		for k := range n {
			h := i.Middleware()(asynq.HandlerFunc(func(ctx context.Context, _ *asynq.Task) error {
				e, _ := ExecutionFromContext(ctx)
				first := e.LeaseUntil()
				for {
					select {
					case <-release:
						return nil
					case <-ctx.Done():
						return context.Cause(ctx)
					case <-time.After(5 * time.Millisecond):
						if e.LeaseUntil().After(first) {
							renewed[k].Store(true)
						}
					}
				}
			}))
			task := asynq.NewTask("x", []byte(fmt.Sprintf("guarded-%d-%d", round, k)))
			go func() { errs <- h.ProcessTask(ctx, task) }()
		}
		return renewed, errs
	}
	for round := range 2 {
		release := make(chan struct{})
		const n = 16
		renewed, errs := runs(round, n, release)
		waitFor(t, 10*time.Second, fmt.Sprintf("round %d: every run's lease renewed", round), func() bool {
			for k := range renewed {
				if !renewed[k].Load() {
					return false
				}
			}
			return true
		})
		close(release)
		for range n {
			must(t, <-errs)
		}
		// No handler left: the loop ends, and the next round starts it again.
		waitFor(t, 5*time.Second, "the guards' loop to end", func() bool { return !running() })
	}
	if st := i.Stats(); st.Completed != 32 || st.LeaseLost != 0 {
		t.Fatalf("stats %+v, want 32 completed and no lease lost", st)
	}
}

// The fence compares whole tokens: one whose digits begin the current
// token's, or run past them, is not current and changes nothing.
func TestSettleWholeToken(t *testing.T) {
	t.Parallel()
	rdb := newClient(t)
	i := newIdem(t, rdb, IdempotencyOptions{Lease: time.Minute})
	e, err := i.Begin(ctx, "k")
	must(t, err)
	before, err := rdb.Get(ctx, i.recordKey("k")).Result()
	must(t, err)
	for _, tok := range []int64{e.Token / 10, e.Token*10 + 1} {
		other := i.execution(e.Key, tok)
		wantErr(t, other.Extend(ctx), ErrLeaseLost)
		wantErr(t, other.Complete(ctx), ErrLeaseLost)
		wantErr(t, other.Release(ctx), ErrLeaseLost)
	}
	if after, _ := rdb.Get(ctx, i.recordKey("k")).Result(); after != before {
		t.Fatalf("record %q became %q", before, after)
	}
	must(t, e.Complete(ctx))
}

// Extend renews the lease for Lease from now by Redis' clock, and the
// record lives Lease + Retention from then.
func TestExtendRenewsForLease(t *testing.T) {
	t.Parallel()
	rdb := newClient(t)
	lease, retention := 2*time.Second, time.Hour // a lease long enough that the checks below run within it
	i := newIdem(t, rdb, IdempotencyOptions{Lease: lease, Retention: retention})
	e, err := i.Begin(ctx, "k")
	must(t, err)
	t0, err := rdb.Time(ctx).Result()
	must(t, err)
	must(t, e.Extend(ctx))
	t1, err := rdb.Time(ctx).Result()
	must(t, err)
	lo, hi := t0.Truncate(time.Millisecond).Add(lease), t1.Add(lease)
	if got := e.LeaseUntil(); got.Before(lo) || got.After(hi) {
		t.Fatalf("lease until %v, want from %v to %v", got, lo, hi)
	}
	ttl, err := rdb.PTTL(ctx, i.recordKey("k")).Result()
	must(t, err)
	if ttl <= retention || ttl > lease+retention {
		t.Fatalf("record lives %v, want up to %v and more than %v", ttl, lease+retention, retention)
	}
	must(t, e.Release(ctx))
	if ttl, err = rdb.PTTL(ctx, i.recordKey("k")).Result(); err != nil || ttl <= retention || ttl > lease+retention {
		t.Fatalf("released record lives %v (%v), want up to %v and more than %v", ttl, err, lease+retention, retention)
	}
}

// NewIdempotency loads the scripts of a store's runs, so that the calls of
// its first moment find them: none meets NOSCRIPT and is sent again whole,
// a round trip more.
func TestNewIdempotencyLoadsScripts(t *testing.T) {
	t.Parallel()
	rdb := newClient(t)
	// A retention no other store of the server has: scripts of its own.
	i := newIdem(t, rdb, IdempotencyOptions{Retention: time.Hour + time.Duration(rand.Int64N(1<<30))*time.Millisecond})
	in, err := rdb.ScriptExists(ctx, i.begin.Hash(), i.complete.Hash()).Result()
	must(t, err)
	if !in[0] || !in[1] {
		t.Fatalf("Begin's and Complete's scripts on the server before the store's first call: %v, want both", in)
	}
}

// A SCRIPT LOAD that gets no answer (a cluster's node that is down or cut
// off) holds a store's start no longer than loadScriptsFor: the load is
// best effort, and the store works without it.
func TestScriptLoadBounded(t *testing.T) {
	t.Parallel()
	rdb := newClient(t)
	rdb.AddHook(unansweredLoads{})
	start := time.Now()
	i := newIdem(t, rdb, IdempotencyOptions{Retention: time.Hour + time.Duration(rand.Int64N(1<<30))*time.Millisecond})
	// NewIdempotency gives its start 5 s; the load alone takes 500 ms of them.
	if took := time.Since(start); took > 3*time.Second {
		t.Fatalf("NewIdempotency took %v behind a SCRIPT LOAD that gets no answer", took)
	}
	e, err := i.Begin(ctx, "k")
	must(t, err)
	must(t, e.Complete(ctx))
}

// unansweredLoads holds each SCRIPT LOAD until its context ends.
type unansweredLoads struct{}

func (unansweredLoads) DialHook(next redis.DialHook) redis.DialHook { return next }
func (unansweredLoads) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (unansweredLoads) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if a := cmd.Args(); len(a) > 1 && strings.EqualFold(cmd.Name(), "script") && strings.EqualFold(fmt.Sprint(a[1]), "load") {
			<-ctx.Done()
			cmd.SetErr(ctx.Err())
			return ctx.Err()
		}
		return next(ctx, cmd)
	}
}

// Complete's fence is the token, not the whole record the run last saw: a
// run whose record moved on without it (an Extend of its own whose reply
// it never saw) completes, and its finish is the record's deadline.
func TestCompleteAfterUnseenExtend(t *testing.T) {
	t.Parallel()
	rdb := newClient(t)
	i := newIdem(t, rdb, IdempotencyOptions{Lease: time.Minute})
	e, err := i.Begin(ctx, "k")
	must(t, err)
	other := i.execution(e.Key, e.Token)
	time.Sleep(3 * time.Millisecond) // Redis' clock moves on: the Extend's deadline is later
	must(t, other.Extend(ctx))
	if !other.LeaseUntil().After(e.LeaseUntil()) {
		t.Fatalf("Extend gave %v, not later than Begin's %v", other.LeaseUntil(), e.LeaseUntil())
	}
	must(t, e.Complete(ctx))
	bucket, field := i.doneOf("k")
	got, err := rdb.HGet(ctx, bucket, field).Int64()
	must(t, err)
	if want := other.LeaseUntil().UnixMilli(); got != want {
		t.Fatalf("finished at %d, want the extended deadline %d", got, want)
	}
	_, err = i.Begin(ctx, "k")
	wantErr(t, err, ErrAlreadyDone)
}

// Execution.Resumed tells a run whose key had an earlier run that began and
// did not complete: one whose lease ran out, or one released after an
// error; a new key, or one whose record was lost, is not resumed.
func TestBeginResumed(t *testing.T) {
	t.Parallel()
	rdb := newClient(t)
	i := newIdem(t, rdb, IdempotencyOptions{Lease: 20 * time.Millisecond})
	e, err := i.Begin(ctx, "k")
	must(t, err)
	if e.Resumed {
		t.Fatal("first run of a key is Resumed")
	}
	time.Sleep(30 * time.Millisecond) // its worker died: no renewal
	e, err = i.Begin(ctx, "k")
	must(t, err)
	if !e.Resumed {
		t.Fatal("run after an expired lease is not Resumed")
	}
	must(t, e.Release(ctx))
	e, err = i.Begin(ctx, "k")
	must(t, err)
	if !e.Resumed {
		t.Fatal("run after a release is not Resumed")
	}
	must(t, rdb.Del(ctx, i.Prefix()+"k").Err())
	e, err = i.Begin(ctx, "k")
	must(t, err)
	if e.Resumed {
		t.Fatal("run after the record was lost is Resumed")
	}
}

// A handler error matching ErrAlreadyDone (its own database found the work
// done) makes the task succeed as skipped and completes the key.
func TestMiddlewareHandlerAlreadyDone(t *testing.T) {
	t.Parallel()
	rdb := newClient(t)
	i := newIdem(t, rdb, IdempotencyOptions{Key: payloadKey})
	h := i.Middleware()(asynq.HandlerFunc(func(context.Context, *asynq.Task) error {
		return fmt.Errorf("db: %w", ErrAlreadyDone)
	}))
	must(t, h.ProcessTask(ctx, asynq.NewTask("x", []byte("k"))))
	if s := i.Stats(); s.Skipped != 1 || s.Completed != 0 || s.Released != 0 {
		t.Fatalf("stats %+v, want 1 skipped", s)
	}
	_, err := i.Begin(ctx, "k")
	wantErr(t, err, ErrAlreadyDone)
}
