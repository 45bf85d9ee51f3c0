package zclaim

// One claimed job enqueued into asynq as a task of its occurrence.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"runtime/debug"
	"strings"
	"time"

	"github.com/hibiken/asynq"
)

// dispatch enqueues one claim and returns how it ended (a failed enqueue
// goes back after its backoff; one that can never become a task goes to
// the dead set). ctx is the worker's (enqueueContext), not Run's: a
// shutdown lets the enqueue finish.
func (d *Dispatcher) dispatch(ctx context.Context, c Claim, redisNow, claimedAt time.Time) outcome {
	now := redisNow.Add(time.Since(claimedAt)) // by Redis' clock
	if !now.Before(c.LeaseUntil) {
		// The lease ran out while the claim waited for a worker (asynq is
		// slow): recovery gives the job back, or has, and an enqueue now
		// would race the next claim of it. Given back here too, in case
		// the batch is settled before recovery looks.
		d.failed.Add(1)
		d.log.LogAttrs(ctx, slog.LevelWarn, "zclaim: lease ran out before the enqueue; not enqueued, the job goes back",
			slog.String("id", short(c.ID)), slog.Int("attempt", c.Attempt))
		d.report(c, redisNow, claimedAt, fmt.Errorf("%w: the lease ran out before the enqueue", ErrLeaseLost))
		return d.later(c)
	}
	// A tick always has a type (SetPeriodic writes it); a member of the
	// reserved prefix without one is another producer's job, dispatched
	// as any other.
	if strings.HasPrefix(c.ID, PeriodicPrefix) && c.Type != "" {
		return d.dispatchTick(ctx, c, redisNow, claimedAt, now)
	}
	return d.enqueue(ctx, c, redisNow, claimedAt, nil)
}

// later is the outcome of a claim that goes back after its backoff.
func (d *Dispatcher) later(c Claim) outcome {
	return outcome{retry: max(time.Millisecond, d.b.opts.Backoff(c.Attempt))}
}

// dispatchTick dispatches a tick of a periodic definition: enqueued if it
// is still due, with the definition's next tick written after.
func (d *Dispatcher) dispatchTick(ctx context.Context, c Claim, redisNow, claimedAt, now time.Time) outcome {
	run, advance, err := d.tick(ctx, &c, now)
	if err != nil {
		d.failed.Add(1)
		d.report(c, redisNow, claimedAt, err)
		return d.later(c)
	}
	if !run {
		if advance() != nil {
			return d.later(c)
		}
		return outcome{}
	}
	return d.enqueue(ctx, c, redisNow, claimedAt, advance)
}

// enqueue makes claim c an asynq task of its occurrence. advance, for a
// periodic tick, writes the definition's next tick.
func (d *Dispatcher) enqueue(ctx context.Context, c Claim, redisNow, claimedAt time.Time,
	advance func() error) outcome {
	typ := c.Type
	if typ == "" {
		typ = d.opts.DefaultType
	}
	// What asynq refuses before it writes anything can never become a
	// task: dead at once, not retried until its attempts run out.
	unfit := unfitForAsynq(c.ID, typ, c.Queue)
	if unfit == "" && typ == "" {
		unfit = "no task type (set DispatcherOptions.DefaultType)"
	}
	if unfit != "" {
		d.dead.Add(1)
		if typ != "" { // a missing type is logged once per batch, with its fix
			d.log.LogAttrs(ctx, slog.LevelError, "zclaim: job that cannot become an asynq task sent to the dead set",
				slog.String("id", short(c.ID)), slog.String("reason", unfit))
		}
		d.report(c, redisNow, claimedAt, errors.New("zclaim: "+unfit))
		return outcome{dead: unfit, noType: typ == ""}
	}
	task, opts, perr := d.task(c, typ)
	if perr != nil {
		d.dead.Add(1)
		d.log.LogAttrs(ctx, slog.LevelError, "zclaim: TaskOptions panicked; the job goes to the dead set",
			slog.String("id", short(c.ID)), slog.String("panic", fmt.Sprint(perr.Value)),
			slog.String("stack", string(perr.Stack)))
		d.report(c, redisNow, claimedAt, perr)
		return outcome{dead: perr.Error()}
	}
	end := d.enqueueHook(ctx, c, task, opts)
	start := time.Now()
	info, err := d.c.EnqueueContext(ctx, task, opts...)
	d.enqueueTime.observe(time.Since(start))
	if end != nil {
		if perr := callback("Enqueue", func() { end(err) }); perr != nil {
			d.log.LogAttrs(ctx, slog.LevelError, "zclaim: the function the Enqueue hook returned panicked",
				slog.String("id", short(c.ID)), slog.String("panic", fmt.Sprint(perr.Value)))
		}
	}
	o := d.afterEnqueue(ctx, c, redisNow, claimedAt, err, advance)
	if o.retry == 0 && o.dead == "" && d.b.opts.History > 0 {
		// A TaskID conflict: the occurrence's task, in the queue it was sent to.
		queue, task := queueOf(opts, c.Queue), c.info().Occurrence()
		if info != nil {
			queue, task = info.Queue, info.ID
		}
		// By Redis' clock: the claim's, and the enqueue's end from it.
		o.sent = sentJob{c.ID, enqueuedEvent(c.Due, redisNow, redisNow.Add(time.Since(claimedAt)), queue, task)}
	}
	return o
}

// task builds claim c's asynq task of type typ and its options: the
// occurrence as TaskID, TaskRetention, the queue, then TaskOptions'.
func (d *Dispatcher) task(c Claim, typ string) (*asynq.Task, []asynq.Option, *PanicError) {
	info := c.info()
	opts := make([]asynq.Option, 0, 3)
	opts = append(opts, asynq.TaskID(info.Occurrence()))
	if d.opts.TaskRetention > 0 {
		opts = append(opts, asynq.Retention(d.opts.TaskRetention))
	}
	if c.Queue != "" {
		opts = append(opts, asynq.Queue(c.Queue))
	}
	// The TaskID names the occurrence: a first attempt needs no header
	// (headerJob) unless TaskOptions replaces its TaskID.
	header := c.Attempt != 1 || !readable(c.Due)
	if d.opts.TaskOptions != nil {
		var more []asynq.Option
		if perr := callback("TaskOptions", func() { more = d.opts.TaskOptions(c.Job) }); perr != nil {
			return nil, nil, perr
		}
		for _, o := range more {
			header = header || o != nil && o.Type() == asynq.TaskIDOpt
		}
		opts = append(opts, more...)
	}
	if header || len(c.Headers) > 0 || d.opts.Enqueue != nil { // the hook writes into the task's headers
		h := make(map[string]string, len(c.Headers)+1)
		maps.Copy(h, c.Headers)
		if header {
			h[headerJob] = info.header()
		}
		return asynq.NewTaskWithHeaders(typ, c.Payload, h), opts, nil
	}
	return asynq.NewTask(typ, c.Payload), opts, nil
}

// enqueueHook calls DispatcherOptions.Enqueue, if set, with claim c's job
// as its task carries it: the task's queue (after TaskOptions) and the
// task's own headers, which the hook may add to or change. It returns the
// function to call after the enqueue, or nil.
func (d *Dispatcher) enqueueHook(ctx context.Context, c Claim, task *asynq.Task, opts []asynq.Option) func(error) {
	if d.opts.Enqueue == nil {
		return nil
	}
	j := c.Job
	j.Headers = task.Headers()
	j.Queue = queueOf(opts, j.Queue)
	var end func(error)
	if perr := callback("Enqueue", func() { end = d.opts.Enqueue(ctx, &j) }); perr != nil {
		d.log.LogAttrs(ctx, slog.LevelError, "zclaim: the Enqueue hook panicked; the job is enqueued without it",
			slog.String("id", short(c.ID)), slog.String("panic", fmt.Sprint(perr.Value)),
			slog.String("stack", string(perr.Stack)))
		return nil
	}
	maps.Copy(task.Headers(), j.Headers) // a hook that made a map of its own
	return end
}

// queueOf returns the queue that options opts send a task to (the last
// asynq.Queue among them), or def when none names one.
func queueOf(opts []asynq.Option, def string) string {
	for _, o := range opts {
		if o != nil && o.Type() == asynq.QueueOpt {
			def, _ = o.Value().(string)
		}
	}
	return def
}

// afterEnqueue tells how claim c's enqueue ended (err) and counts it.
func (d *Dispatcher) afterEnqueue(ctx context.Context, c Claim, redisNow, claimedAt time.Time, err error,
	advance func() error) outcome {
	switch {
	case err == nil:
		d.enqueued.Add(1)
		if c.Attempt == 1 { // a retry's due time is its backoff's end, which claims do not read
			d.lag.observe(redisNow.Sub(c.Due) + time.Since(claimedAt))
		}
	case errors.Is(err, asynq.ErrTaskIDConflict):
		// asynq holds a task of this occurrence: pending, active,
		// retrying, archived, or completed and retained. It is this
		// occurrence's run already (a re-dispatch after a dispatcher died,
		// or the same ZADD repeated), so it is not enqueued again.
		occ := c.info().Occurrence()
		d.conflicts.Add(1)
		d.log.LogAttrs(ctx, slog.LevelInfo, "zclaim: asynq already has a task of this occurrence; not enqueued again",
			slog.String("task_id", short(occ)), slog.String("queue", c.Queue))
		err = zerr("zclaim: dispatch %q: %w", occ, err)
	default:
		if advance != nil && c.Attempt >= d.b.opts.MaxAttempts {
			advance() // the tick dies; the definition goes on
		}
		d.failed.Add(1)
		d.log.LogAttrs(ctx, slog.LevelWarn, "zclaim: enqueue failed; the job goes back with backoff",
			slog.String("id", short(c.ID)), slog.Int("attempt", c.Attempt), slog.String("error", err.Error()))
		d.report(c, redisNow, claimedAt, err)
		return d.later(c)
	}
	d.report(c, redisNow, claimedAt, err)
	if advance != nil && advance() != nil {
		// Enqueued, but no next tick: the tick goes back, meets its
		// TaskID (or the middleware) and writes the next tick then.
		return d.later(c)
	}
	return outcome{}
}

// enqueueContext is an enqueue worker's context: one with a timeout of
// EnqueueTimeout serves the enqueues that start in the first tenth of it,
// so that a worker does not make and stop a timer per job. Each enqueue
// has between 90% and all of EnqueueTimeout.
type enqueueContext struct {
	timeout time.Duration
	ctx     context.Context
	cancel  context.CancelFunc
	renew   time.Time // when the next enqueue gets a new context
}

func (e *enqueueContext) get() context.Context {
	if now := time.Now(); e.ctx == nil || now.After(e.renew) {
		e.stop()
		e.ctx, e.cancel = context.WithTimeout(context.Background(), e.timeout)
		e.renew = now.Add(e.timeout / 10)
	}
	return e.ctx
}

func (e *enqueueContext) stop() {
	if e.cancel != nil {
		e.cancel()
	}
}

func (d *Dispatcher) report(c Claim, redisNow, claimedAt time.Time, err error) {
	if d.opts.OnDispatch != nil {
		// Sub saturates for a due time ~292 years back; so must the sum.
		lag, since := redisNow.Sub(c.RunAt), time.Since(claimedAt)
		if lag <= math.MaxInt64-since {
			lag += since
		} else {
			lag = math.MaxInt64
		}
		if perr := callback("OnDispatch", func() { d.opts.OnDispatch(c.info(), lag, err) }); perr != nil {
			d.log.LogAttrs(context.Background(), slog.LevelError, "zclaim: OnDispatch panicked; the dispatch stands",
				slog.String("id", short(c.ID)), slog.String("panic", fmt.Sprint(perr.Value)),
				slog.String("stack", string(perr.Stack)))
		}
	}
}

// PanicError is a panic in a user callback (DispatcherOptions.TaskOptions
// or OnDispatch), with its value and the stack where it happened. It
// unwraps to the value when that is an error.
type PanicError struct {
	Callback string // "TaskOptions" or "OnDispatch"
	Value    any
	Stack    []byte
}

func (e *PanicError) Error() string {
	return fmt.Sprintf("zclaim: %s panicked: %v", e.Callback, e.Value)
}

func (e *PanicError) Unwrap() error {
	err, _ := e.Value.(error)
	return err
}

// callback runs f, a user's callback, and turns a panic into a *PanicError.
func callback(name string, f func()) (perr *PanicError) {
	defer func() {
		if r := recover(); r != nil {
			perr = &PanicError{Callback: name, Value: r, Stack: debug.Stack()}
		}
	}()
	f()
	return nil
}
