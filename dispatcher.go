package zclaim

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hibiken/asynq"
)

// Defaults of a Dispatcher.
const (
	DefaultConcurrency    = 16
	DefaultMaxWait        = 50 * time.Millisecond
	DefaultEnqueueTimeout = 5 * time.Second
)

// DispatcherOptions configure a Dispatcher. The zero value is valid: every
// field left zero takes the default its comment names.
type DispatcherOptions struct {
	// Concurrency is how many enqueues run at once. The dispatcher keeps
	// at most max(Concurrency, min(4×Concurrency, BatchSize)) more claims
	// queued for them (64 with the defaults), so that a slow or unreachable
	// asynq holds few claims waiting while their leases run.
	// Default: DefaultConcurrency (16).
	Concurrency int
	// MaxWait caps the sleep until the earliest due job. Schedule wakes
	// the dispatcher at once when it adds an earlier job, and so does a
	// plain ZADD by another program where the server publishes keyspace
	// events for sorted sets (notify-keyspace-events with K and z, or
	// KEA); elsewhere a plain ZADD is found within MaxWait. The dispatcher
	// also looks again whenever its subscription comes back after a lost
	// connection. Default: DefaultMaxWait (50ms).
	MaxWait time.Duration
	// EnqueueTimeout bounds one enqueue, and one call that settles
	// finished batches.
	// Default: DefaultEnqueueTimeout (5s).
	EnqueueTimeout time.Duration
	// RecoveryInterval is how often Run's recovery loop runs
	// (Broker.RunRecovery); negative turns it off.
	// Default: DefaultRecoveryInterval (1s).
	RecoveryInterval time.Duration
	// DefaultType is the asynq task type of jobs that have none, such as
	// ids written by other programs. A job without a type when this is
	// empty cannot become a task: it goes to the dead set, as does one
	// whose task id, type or queue name asynq refuses (only white space).
	// Default: "".
	DefaultType string
	// TaskRetention is how long asynq keeps a dispatched task once it
	// completed (asynq.Retention). While asynq keeps it, a second enqueue
	// of the same occurrence meets its TaskID and does not run: that is
	// what stops a re-dispatch after a dispatcher died between its
	// enqueues and settling their batch (recovery puts such a batch back
	// after its lease) from running the jobs again. asynq keeps each
	// completed task, its payload included, in Redis meanwhile: about
	// rate × TaskRetention tasks. A Retention in TaskOptions overrides it;
	// negative sets none. The idempotency middleware covers longer
	// windows. Default: the re-dispatch window, the Broker's Lease +
	// RecoveryInterval + MaxWait, plus one minute.
	TaskRetention time.Duration
	// TaskOptions adds asynq options per job (MaxRetry, Timeout, ...).
	// The dispatcher sets asynq.TaskID to the job's occurrence
	// (OccurrenceID), asynq.Retention to TaskRetention and the job's queue
	// first; options given here come after them and win.
	// Setting TaskOptions or OnDispatch, the two places a dispatched job
	// can be seen, makes the dispatcher's claims read each job's due time
	// (Job.RunAt): Redis then formats a number per job, and a claim and
	// its settling cost it about 40% more per job.
	// A panic in it sends the job to the dead set with the panic as its
	// reason (a *PanicError), logged at Error with its stack.
	// Default: nil.
	TaskOptions func(Job) []asynq.Option
	// OnDispatch, when set, is called after each job's enqueue (its batch
	// is settled later) with the job's JobInfo: err is nil when the task
	// was enqueued, ErrTaskIDConflict-wrapping when asynq already had it,
	// or the enqueue error. lag is the time from the job's due time (this
	// claim's, after a retry its backoff's end) to the end of its enqueue,
	// reckoned from Redis' clock at the claim. It runs on the enqueueing goroutine: keep it short. A
	// panic in it is recovered and logged at Error; the dispatch stands.
	// Setting it makes claims read the jobs' due times (see TaskOptions).
	// Default: nil.
	OnDispatch func(job JobInfo, lag time.Duration, err error)
	// Logger receives the dispatcher's logs. Default: the Broker's logger.
	Logger *slog.Logger
}

// minRetention is the smallest non-zero Retention asynq keeps: it stores
// whole seconds.
const minRetention = time.Second

// DispatcherStats count what a Dispatcher did since it was made.
type DispatcherStats struct {
	Claimed   int64 // claims taken off the schedule
	Enqueued  int64 // tasks enqueued into asynq
	Conflicts int64 // claims whose task id asynq already had (settled, not enqueued)
	Failed    int64 // enqueues that failed; their claims went back with backoff
	Dead      int64 // claims that could not become tasks (no type, one asynq refuses, or a corrupt record), sent to the dead set
}

// Dispatcher moves due jobs from a Broker's schedule into asynq the moment
// they are due: it sleeps until the earliest due time (read from Redis),
// wakes early when an earlier job is scheduled, claims due jobs in
// batches, enqueues each as an asynq task whose TaskID names the job's
// occurrence (OccurrenceID) and whose headers carry its JobInfo, and
// settles the batch. Any number of dispatchers may share a schedule.
//
// A dispatcher's batch is one lease, not one per job: its jobs become
// tasks within moments and none is extended, so the batch is settled as
// one once every job in it is enqueued (or given back, or dead). If the
// dispatcher dies first, recovery puts the whole batch back after the
// lease, and the jobs already enqueued meet asynq's TaskID on their next
// dispatch: asynq keeps their tasks, completed ones too, for
// TaskRetention. Stats count the jobs of a batch lease one by one.
type Dispatcher struct {
	b    *Broker
	c    *asynq.Client
	opts DispatcherOptions
	log  *slog.Logger

	claimed, enqueued, conflicts, failed, dead atomic.Int64
}

// NewDispatcher returns a dispatcher of b's jobs into c. It never closes c.
func NewDispatcher(b *Broker, c *asynq.Client, opts DispatcherOptions) (*Dispatcher, error) {
	if b == nil || c == nil {
		return nil, fmt.Errorf("%w: NewDispatcher needs a Broker and an asynq Client", ErrInvalidOptions)
	}
	if opts.Concurrency == 0 {
		opts.Concurrency = DefaultConcurrency
	}
	if opts.MaxWait == 0 {
		opts.MaxWait = DefaultMaxWait
	}
	if opts.EnqueueTimeout == 0 {
		opts.EnqueueTimeout = DefaultEnqueueTimeout
	}
	if opts.RecoveryInterval == 0 {
		opts.RecoveryInterval = DefaultRecoveryInterval
	}
	if opts.Logger == nil {
		opts.Logger = b.log
	}
	if opts.TaskRetention == 0 {
		opts.TaskRetention = b.opts.Lease + max(opts.RecoveryInterval, 0) + opts.MaxWait + time.Minute
	}
	switch {
	case opts.Concurrency < 1:
		return nil, fmt.Errorf("%w: Concurrency must be at least 1, not %d", ErrInvalidOptions, opts.Concurrency)
	case opts.MaxWait < time.Millisecond:
		return nil, fmt.Errorf("%w: MaxWait must be at least 1ms, not %v", ErrInvalidOptions, opts.MaxWait)
	case opts.EnqueueTimeout < time.Millisecond:
		return nil, fmt.Errorf("%w: EnqueueTimeout must be at least 1ms, not %v", ErrInvalidOptions, opts.EnqueueTimeout)
	case opts.TaskRetention > 0 && opts.TaskRetention < minRetention:
		return nil, fmt.Errorf("%w: TaskRetention must be at least %v (asynq keeps whole seconds), or negative for none, not %v", ErrInvalidOptions, minRetention, opts.TaskRetention)
	}
	return &Dispatcher{b: b, c: c, opts: opts, log: opts.Logger}, nil
}

// Stats returns the dispatcher's counts.
func (d *Dispatcher) Stats() DispatcherStats {
	return DispatcherStats{Claimed: d.claimed.Load(), Enqueued: d.enqueued.Load(),
		Conflicts: d.conflicts.Load(), Failed: d.failed.Load(), Dead: d.dead.Load()}
}

// Run dispatches until ctx is done, with the broker's recovery loop beside
// it. Then it stops claiming, finishes and acks the enqueues under way, and
// returns nil. Claims it could not settle come back through recovery after
// their lease. Errors from Redis are logged and retried with backoff.
func (d *Dispatcher) Run(ctx context.Context) error {
	var bg sync.WaitGroup
	defer bg.Wait()
	rctx, stopBg := context.WithCancel(ctx)
	defer stopBg()
	if d.opts.RecoveryInterval > 0 {
		bg.Add(1)
		go func() { defer bg.Done(); d.b.RunRecovery(rctx, d.opts.RecoveryInterval) }()
	}
	wake := make(chan struct{}, 1)
	bg.Add(1)
	go func() { defer bg.Done(); d.listen(rctx, wake) }()

	// Batches whose every job has been dispatched are settled by one
	// goroutine: whatever has queued up while the previous call ran goes
	// in the next.
	acks := make(chan *batchRun, MaxBatchSize)
	ackDone := make(chan struct{})
	go func() { defer close(ackDone); d.acker(acks) }()
	defer func() { <-ackDone }()
	defer close(acks)

	// Concurrency workers enqueue claims from a queue of up to
	// 4×Concurrency more (at most BatchSize): the workers seldom wait for a
	// claim round trip, and a slow asynq holds few claims waiting (one
	// enqueue under way and four queued per worker, of EnqueueTimeout
	// each, fit in the default lease).
	type item struct {
		c                   Claim
		run                 *batchRun
		index               int
		redisNow, claimedAt time.Time
	}
	queue := make(chan item, max(d.opts.Concurrency, min(4*d.opts.Concurrency, d.b.opts.BatchSize)))
	freed := make(chan struct{}, 1)
	var workers sync.WaitGroup
	for range d.opts.Concurrency {
		workers.Add(1)
		go func() {
			defer workers.Done()
			for it := range queue {
				// The claim loop waits for half the queue free at most:
				// wake it only then, not for every claim taken.
				if len(queue) <= cap(queue)/2 {
					select {
					case freed <- struct{}{}:
					default:
					}
				}
				it.run.settled(it.index, d.dispatch(it.c, it.redisNow, it.claimedAt), acks)
			}
		}()
	}
	// On return: stop claiming, let the workers finish what is queued.
	defer workers.Wait()
	defer close(queue)

	// Due times cost Redis a formatted number per job: read them only for
	// a hook that can see them.
	mode := leaseBatchIDs
	if d.opts.OnDispatch != nil || d.opts.TaskOptions != nil {
		mode = leaseBatch
	}
	timer := time.NewTimer(0)
	defer timer.Stop()
	backoff := time.Duration(0)
	need := 1 // free queue places to wait for before claiming
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-timer.C:
		case <-wake:
		}
		for cap(queue)-len(queue) < need {
			select {
			case <-ctx.Done():
				return nil
			case <-freed:
			}
		}
		want := min(cap(queue)-len(queue), d.b.opts.BatchSize)
		res, err := d.b.claim(ctx, want, mode)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			backoff = min(max(2*backoff, 10*time.Millisecond), d.opts.MaxWait)
			d.log.LogAttrs(ctx, slog.LevelWarn, "zclaim: dispatcher claim failed; backing off",
				slog.String("key", d.b.keys.schedule), slog.Duration("backoff", backoff), slog.String("error", err.Error()))
			resetTimer(timer, backoff)
			continue
		}
		backoff = 0
		claimedAt := time.Now()
		d.claimed.Add(int64(res.lease.n))
		if res.lease.n > 0 {
			run := &batchRun{end: batchEnd{lease: res.lease}}
			run.left.Store(int64(res.lease.n))
			for _, bad := range res.corrupt {
				d.dead.Add(1)
				d.log.LogAttrs(ctx, slog.LevelError, "zclaim: job record is corrupt; moved to the dead set",
					slog.String("key", d.b.keys.schedule), slog.String("id", bad.c.ID), slog.String("error", bad.err.Error()))
				run.settled(bad.index, outcome{dead: "corrupt record: " + bad.err.Error()}, acks)
			}
			for k, c := range res.claims {
				queue <- item{c, run, res.index[k], res.now, claimedAt} // fits: only this loop adds
			}
		}
		need = 1
		switch {
		case len(res.claims) == want:
			// A full batch: more may be due. Claim again once half the
			// queue is free, so that claims stay batched under load.
			need = max(1, cap(queue)/2)
			resetTimer(timer, 0)
		case !res.next:
			resetTimer(timer, d.opts.MaxWait)
		case res.wait == 0 && len(res.claims) == 0:
			// Due by a hair less than the clock's resolution: do not spin.
			resetTimer(timer, 500*time.Microsecond)
		default:
			resetTimer(timer, min(res.wait, d.opts.MaxWait))
		}
	}
}
