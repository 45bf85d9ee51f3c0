package zclaim

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/hibiken/asynq"
)

type executionKey struct{}

// contextWithExecution returns ctx carrying e.
func contextWithExecution(ctx context.Context, e *Execution) context.Context {
	return context.WithValue(ctx, executionKey{}, e)
}

// ExecutionFromContext returns the Execution the middleware started for
// the task being handled: its Key is the idempotency key and its Token the
// fencing token to hand to downstream writes.
func ExecutionFromContext(ctx context.Context) (*Execution, bool) {
	e, ok := ctx.Value(executionKey{}).(*Execution)
	return e, ok
}

// IsFailure is for asynq.Config.IsFailure: a task that met a run in
// progress elsewhere (ErrInProgress) is retried without counting a failure.
func IsFailure(err error) bool { return err != nil && !errors.Is(err, ErrInProgress) }

// RetryDelay is for asynq.Config.RetryDelayFunc: a task that met a run in
// progress elsewhere is retried soon (within its lease, at most a second,
// which asynq rounds to its whole-second retry times), and so is one whose
// worker died (asynq's ErrLeaseExpired: by then its run was most likely
// taken over, and the retry is skipped as done); other errors get
// asynq.DefaultRetryDelayFunc.
func RetryDelay(n int, err error, t *asynq.Task) time.Duration {
	if errors.Is(err, asynq.ErrLeaseExpired) {
		return time.Second/2 + rand.N(time.Second/2+1)
	}
	if errors.Is(err, ErrInProgress) {
		d := time.Second
		var ip *InProgressError
		if errors.As(err, &ip) && ip.LeaseLeft > 0 && ip.LeaseLeft < d {
			d = ip.LeaseLeft
		}
		return d/2 + rand.N(d/2+1)
	}
	return asynq.DefaultRetryDelayFunc(n, err, t)
}

// Middleware returns asynq middleware that runs each task's handler at
// most once at a time per key, and not again once it finished:
//
//   - finished (within Retention): the handler is skipped and the task
//     succeeds;
//   - running elsewhere with a live lease: the task fails with an error
//     matching ErrInProgress, so asynq tries it again later (use IsFailure
//     and RetryDelay in asynq.Config so this is not counted as a failure
//     and comes back soon). On its last retry the middleware waits for the
//     other run instead, since asynq would archive the task;
//   - otherwise the handler runs with the Execution (ExecutionFromContext)
//     and the task's JobInfo (JobFromContext) in its context, its lease
//     renewed every Lease/3. If a renewal
//     finds the lease lost, or cannot reach Redis before the lease ends,
//     the handler's context is cancelled with cause ErrLeaseLost.
//
// Takeover: a run whose worker died stops renewing its lease. Every
// process that made a Middleware looks, every Lease/4 (from 100ms to 1s),
// at the active asynq tasks of every queue (or of
// IdempotencyOptions.TakeoverQueues); processes of one shape (one store
// prefix, the same TakeoverQueues, the same task types handled) take
// turns, about one pass an interval between them. A task whose run
// record's lease ran out is taken over by exactly one process (fenced by
// the record's token), which puts the task itself back at the front of
// its queue, as asynq's recoverer would move it but at once and with no
// retry spent (asynq v0.26, whose keys the store knows; under another
// asynq there is no takeover, and NewIdempotency says so at Warn). The
// next server to take it runs it: one with the middleware as a resumed
// run (Execution.Resumed), one without it as asynq would, so a rolling
// deploy runs no task more often than asynq alone. A task taken over and
// taken again by a worker that never began it (a server without the
// middleware) is not taken over again while that worker's server renews
// asynq's lease of it. An active task of a type this middleware handles
// that has no run record is taken over too once asynq's server stopped
// renewing its own lease of it (its worker died before Begin: asynq's
// server renews the lease of every task it holds every 5 s, so a live
// worker without this middleware or still in an outer one is not taken
// for dead; one whose server missed two renewals, about 12 s, and no
// longer lists it among its workers' is), and so is one whose run failed
// and was released while asynq still holds the task (its worker died
// before asynq recorded the failure, or asynq's write failed); a failure
// that ends its task (SkipRetry, RevokeTask, its last attempt) is left to
// asynq. A run that is slow but renewing is never taken over. Each
// takeover is logged at Warn and counted in Stats().Takeovers. Tasks keyed
// by a custom Key function take part when that function tells the key
// from the task alone, not from its context: the middleware asks it again
// without the handler's context at each task, and a type for which the two
// keys ever differ is never taken over by this store, nor is one its
// middleware has not handled yet. Close stops the loop.
//
// A handler that returns nil completes the key, and so does one that
// returns an error matching ErrAlreadyDone (its own database found the
// work done, as zclaimpg.Complete does): that task succeeds as skipped.
// The Complete goes before the middleware returns, or, for a server on
// the store's AsynqClient, in one round trip with asynq's done of the
// task, ahead of it (see AsynqClient).
// One that returns another error or panics releases the key, so a retry
// can run; the error or panic goes on to asynq unchanged. If Redis cannot be reached the handler does not run and
// the error goes back to asynq (fail closed). A key that can never run
// (empty, or longer than MaxIDLen) fails the task with asynq.SkipRetry, so
// that asynq archives it at once instead of retrying it; an error of the
// Key function goes back to asynq as it is.
func (i *Idempotency) Middleware() asynq.MiddlewareFunc {
	i.takeover.startTakeover()
	return func(next asynq.Handler) asynq.Handler {
		return asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
			ctx = withJob(ctx, t)
			if i.defaultKey {
				i.handled(t.Type())
			}
			key, err := i.keyOf(ctx, t)
			if err != nil {
				return err
			}
			if key == "" {
				return zerr("zclaim: middleware: %w: the Key function returned an empty key for a task of type %q (%w)",
					ErrEmptyID, t.Type(), asynq.SkipRetry)
			}
			if !i.defaultKey && t.Headers()[headerTakeover] == "" {
				i.learnKey(ctx, t, key)
			}
			e, err := i.beginOrWait(ctx, key)
			if q, ok := asynq.GetQueueName(ctx); ok {
				id, _ := asynq.GetTaskID(ctx)
				i.held.begun(q, id)
			}
			switch {
			case errors.Is(err, ErrAlreadyDone):
				i.skipped.Add(1)
				i.log.LogAttrs(ctx, slog.LevelInfo, "zclaim: skipped a task whose work already finished",
					slog.String("key", short(key)), slog.String("type", t.Type()))
				return nil
			case errors.Is(err, ErrInProgress):
				i.inProgress.Add(1)
				i.log.LogAttrs(ctx, slog.LevelInfo, "zclaim: task's work is running elsewhere; asynq will try it again",
					slog.String("key", short(key)), slog.String("type", t.Type()))
				return err
			case errors.Is(err, ErrIDTooLong), errors.Is(err, ErrReservedKey):
				return fmt.Errorf("%w (%w)", err, asynq.SkipRetry)
			case err != nil:
				return err
			}
			return i.run(ctx, e, next, t)
		})
	}
}

// keyOf is the key of task t: the one a copy of an earlier version's
// takeover names, else what
// the Key function says.
func (i *Idempotency) keyOf(ctx context.Context, t *asynq.Task) (string, error) {
	if k, ok := t.Headers()[headerTakeover]; ok && k != "" {
		return k, nil
	}
	return i.opts.Key(ctx, t)
}

// learnKey notes whether the Key function tells the key of a task of t's
// type from the task alone, as a takeover pass must (it has asynq's
// TaskInfo, not the handler's context): key is what the function told with
// the handler's context. A type for which it once told another key, or
// failed, is never taken over by this store.
func (i *Idempotency) learnKey(ctx context.Context, t *asynq.Task, key string) {
	if v, ok := i.types.Load(t.Type()); ok && !v.(bool) {
		return
	}
	job, has := JobFromContext(ctx) // the middleware put it there
	if k, err := i.keyFromTask(t, job, has); err != nil || k != key {
		i.types.Store(t.Type(), false)
		return
	}
	i.types.LoadOrStore(t.Type(), true)
}

// beginOrWait begins key; on a task's last retry it waits out a run in
// progress elsewhere rather than let asynq archive the task.
func (i *Idempotency) beginOrWait(ctx context.Context, key string) (*Execution, error) {
	for {
		e, err := i.Begin(ctx, key)
		var ip *InProgressError
		if !errors.As(err, &ip) || !lastRetry(ctx) {
			return e, err
		}
		wait := min(max(ip.LeaseLeft, 5*time.Millisecond), i.opts.Lease/3, time.Second)
		select {
		case <-ctx.Done():
			return nil, errors.Join(err, ctx.Err())
		case <-time.After(wait):
		}
	}
}

// lastRetry reports whether asynq would archive this task on another error.
func lastRetry(ctx context.Context) bool {
	n, ok1 := asynq.GetRetryCount(ctx)
	m, ok2 := asynq.GetMaxRetry(ctx)
	return ok1 && ok2 && n >= m
}

// run calls the handler under e's lease and settles e after it.
func (i *Idempotency) run(ctx context.Context, e *Execution, next asynq.Handler, t *asynq.Task) (err error) {
	g := &leaseGuard{i: i, e: e, since: time.Now()}
	g.ctx, g.cancel = context.WithCancelCause(contextWithExecution(ctx, e))
	i.guards.add(g, i.opts.Lease)
	hctx := g.ctx
	settle := func(handlerErr error, panicked bool) error {
		g.end()
		sctx, scancel := context.WithTimeout(context.WithoutCancel(ctx), settleTimeout)
		defer scancel()
		// A handler whose transaction met the occurrence done in its own
		// database (zclaimpg.Complete) rolled back: the work is done, and
		// the record says so from now on.
		skipped := errors.Is(handlerErr, ErrAlreadyDone)
		if skipped {
			i.log.LogAttrs(ctx, slog.LevelInfo,
				"zclaim: skipped a task whose work already finished (its database says so)",
				slog.String("key", short(e.Key)), slog.String("type", t.Type()))
		}
		if errors.Is(handlerErr, ErrMisuse) {
			i.log.LogAttrs(ctx, slog.LevelError, "zclaim: the handler misused the API; its effect may repeat on "+
				"every retry", slog.String("key", short(e.Key)), slog.String("type", t.Type()),
				slog.String("error", handlerErr.Error()))
		}
		if handlerErr == nil && !panicked || skipped {
			if i.completeLater(ctx, e, skipped) {
				return nil
			}
			return i.afterComplete(ctx, e, skipped, e.Complete(sctx))
		}
		why := "panicked"
		if handlerErr != nil {
			why = handlerErr.Error()
		}
		rerr := e.release(sctx, why, endsTask(ctx, handlerErr))
		i.count(rerr, &i.released)
		if rerr != nil {
			i.log.LogAttrs(ctx, slog.LevelWarn, "zclaim: could not release a run",
				slog.String("key", short(e.Key)), slog.Int64("token", e.Token), slog.String("error", rerr.Error()))
		}
		return handlerErr
	}
	defer func() {
		if r := recover(); r != nil {
			settle(nil, true)
			panic(r)
		}
	}()
	herr := next.ProcessTask(hctx, t)
	return settle(herr, false)
}

// endsTask tells whether asynq ends the task after its handler failed
// with err (a panic: nil) rather than retrying it: SkipRetry, RevokeTask,
// or a failure of its last attempt. An error asynq does not count as a
// failure (Config.IsFailure) is retried even then; taking it for the end
// only leaves the task to asynq's own recovery should its worker die.
func endsTask(ctx context.Context, err error) bool {
	return errors.Is(err, asynq.SkipRetry) || errors.Is(err, asynq.RevokeTask) || lastRetry(ctx)
}
