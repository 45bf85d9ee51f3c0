package zclaim

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
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
	// Default: nil.
	TaskOptions func(Job) []asynq.Option
	// OnDispatch, when set, is called after each claim's enqueue (its
	// batch is settled later): err is nil when the task was enqueued,
	// ErrTaskIDConflict-wrapping when asynq already had it, or the enqueue
	// error. The claim is leased with its batch, not alone: Ack, Extend,
	// Retry and Kill answer ErrLeaseLost for it. lag is the time from the job's
	// due time to the end of its enqueue, reckoned from Redis' clock at
	// the claim. It runs on the enqueueing goroutine: keep it short.
	// Setting it makes claims read the jobs' due times (see TaskOptions).
	// Default: nil.
	OnDispatch func(c Claim, lag time.Duration, err error)
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

// ackLinger is how long the acker gathers finished batches before it
// settles them: one round trip costs Redis more than the batches in it,
// and a lease is long.
const ackLinger = 5 * time.Millisecond

// batchRun follows the jobs of one batch claim through the workers.
type batchRun struct {
	left   atomic.Int64 // jobs not yet dispatched
	noType atomic.Int64 // jobs dead for want of a task type
	mu     sync.Mutex
	end    batchEnd
}

// outcome is how one job's dispatch ended: done (the zero value), back to
// the schedule after retry, or dead with a reason (noType: for want of a
// task type).
type outcome struct {
	retry  time.Duration
	dead   string
	noType bool
}

// settled records the outcome of the job at place index; the last job of
// the batch hands the batch to the acker.
func (r *batchRun) settled(index int, o outcome, acks chan<- *batchRun) {
	if o.noType {
		r.noType.Add(1)
	}
	if o.retry > 0 || o.dead != "" {
		r.mu.Lock()
		if o.dead != "" {
			if r.end.dead == nil {
				r.end.dead = map[int]string{}
			}
			r.end.dead[index] = o.dead
		} else {
			if r.end.retry == nil {
				r.end.retry = map[int]time.Duration{}
			}
			r.end.retry[index] = o.retry
		}
		r.mu.Unlock()
	}
	if r.left.Add(-1) == 0 {
		acks <- r
	}
}

// acker settles finished batches from in, gathered over ackLinger, until
// in is closed.
func (d *Dispatcher) acker(in <-chan *batchRun) {
	batch := make([]batchEnd, 0, MaxBatchSize)
	linger := time.NewTimer(ackLinger)
	defer linger.Stop()
	for r := range in {
		d.logNoType(r)
		batch = append(batch[:0], r.end)
		resetTimer(linger, ackLinger)
	more:
		for len(batch) < MaxBatchSize {
			select {
			case r, ok := <-in:
				if !ok {
					break more
				}
				d.logNoType(r)
				batch = append(batch, r.end)
			case <-linger.C:
				break more
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), d.opts.EnqueueTimeout)
		lost, err := d.b.finishBatches(ctx, batch...)
		cancel()
		switch {
		case err != nil:
			// The batches stay in flight; after their lease, recovery puts
			// them back and the next dispatch of their jobs meets asynq's TaskID.
			d.log.LogAttrs(context.Background(), slog.LevelWarn, "zclaim: settling dispatched batches failed; recovery will settle them",
				slog.Int("batches", len(batch)), slog.String("error", err.Error()))
		case len(lost) > 0:
			// The enqueues outlived the lease and the jobs were recovered;
			// their next dispatch meets asynq's TaskID.
			d.log.LogAttrs(context.Background(), slog.LevelWarn, "zclaim: lease lost before dispatched batches were settled",
				slog.Int("batches", len(lost)), slog.Int("jobs", lost[0].lease.n))
		}
	}
}

// logNoType logs, once for the batch, the jobs of r that went to the dead
// set for want of a task type, with the fix.
func (d *Dispatcher) logNoType(r *batchRun) {
	if n := r.noType.Load(); n > 0 {
		d.log.LogAttrs(context.Background(), slog.LevelError,
			"zclaim: jobs without a task type sent to the dead set; set DispatcherOptions.DefaultType for members added with a plain ZADD, then Broker.Revive them",
			slog.String("key", d.b.keys.schedule), slog.Int64("jobs", n))
	}
}

func resetTimer(t *time.Timer, d time.Duration) {
	t.Stop()
	select {
	case <-t.C:
	default:
	}
	t.Reset(d)
}

// listen forwards schedule notices (an earlier job was scheduled) to wake,
// and each confirmation of the subscription too: go-redis subscribes again
// after a lost connection, and notices sent meanwhile are lost, so the
// schedule must be looked at again. Where the server publishes keyspace
// events for the schedule key, a ZADD by any program wakes it as well, at
// most once per keyspaceQuiet so that a busy producer does not turn every
// ZADD into a claim.
func (d *Dispatcher) listen(ctx context.Context, wake chan<- struct{}) {
	channels := []string{d.b.keys.notice}
	ks, hasKS := keyspaceChannel(d.b.rdb, d.b.keys.schedule)
	if hasKS {
		channels = append(channels, ks)
	}
	poke := func() {
		select {
		case wake <- struct{}{}:
		default:
		}
	}
	quiet := time.NewTimer(0)
	defer quiet.Stop()
	var lastKS time.Time
	held := false // a keyspace wake waits for the quiet period to end
	backoff := 10 * time.Millisecond
	for ctx.Err() == nil {
		ps := d.b.rdb.Subscribe(ctx, channels...)
		ch := ps.ChannelWithSubscriptions()
	recv:
		for {
			select {
			case <-ctx.Done():
				break recv
			case <-quiet.C:
				if held {
					held, lastKS = false, time.Now()
					poke()
				}
			case m, ok := <-ch:
				if !ok {
					break recv
				}
				backoff = 10 * time.Millisecond
				if msg, isMsg := m.(*redis.Message); isMsg && hasKS && msg.Channel == ks {
					if msg.Payload != "zadd" && msg.Payload != "zincr" {
						continue // the claim's own removals, and the like
					}
					if since := time.Since(lastKS); since < keyspaceQuiet {
						if !held {
							held = true
							resetTimer(quiet, keyspaceQuiet-since)
						}
						continue
					}
					lastKS = time.Now()
				}
				poke()
			}
		}
		ps.Close()
		select {
		case <-ctx.Done():
		case <-time.After(backoff):
			backoff = min(2*backoff, d.opts.MaxWait)
		}
	}
}

// keyspaceQuiet is the least time between two wakes by keyspace events.
const keyspaceQuiet = time.Millisecond

// keyspaceChannel names the keyspace-event channel of key on rdb's server,
// for a client of one server (a cluster publishes keyspace events on the
// node that holds the key, which a cluster client does not subscribe to).
func keyspaceChannel(rdb redis.UniversalClient, key string) (string, bool) {
	c, ok := rdb.(*redis.Client)
	if !ok {
		return "", false
	}
	return "__keyspace@" + strconv.Itoa(c.Options().DB) + "__:" + key, true
}

// dispatch enqueues one claim and returns how it ended (a failed enqueue
// goes back after its backoff; one without a task type goes to the dead
// set), on a context of its own so that a shutdown lets it finish.
func (d *Dispatcher) dispatch(c Claim, redisNow, claimedAt time.Time) outcome {
	ctx, cancel := context.WithTimeout(context.Background(), d.opts.EnqueueTimeout)
	defer cancel()
	typ := c.Type
	if typ == "" {
		typ = d.opts.DefaultType
	}
	// What asynq refuses before it writes anything can never become a
	// task: dead at once, not retried until its attempts run out.
	var unfit string
	switch {
	case typ == "":
		unfit = "no task type (set DispatcherOptions.DefaultType)"
	case blank(typ):
		unfit = "asynq refuses a task type of white space"
	case blank(c.ID):
		unfit = "asynq refuses a task id of white space"
	case c.Queue != "" && blank(c.Queue):
		unfit = "asynq refuses a queue name of white space"
	}
	if unfit != "" {
		d.dead.Add(1)
		if typ != "" { // a missing type is logged once per batch, with its fix
			d.log.LogAttrs(ctx, slog.LevelError, "zclaim: job that cannot become an asynq task sent to the dead set",
				slog.String("id", c.ID), slog.String("reason", unfit))
		}
		d.report(c, redisNow, claimedAt, errors.New("zclaim: "+unfit))
		return outcome{dead: unfit, noType: typ == ""}
	}
	info := c.info()
	opts := make([]asynq.Option, 0, 3)
	opts = append(opts, asynq.TaskID(info.Occurrence()))
	if d.opts.TaskRetention > 0 {
		opts = append(opts, asynq.Retention(d.opts.TaskRetention))
	}
	if c.Queue != "" {
		opts = append(opts, asynq.Queue(c.Queue))
	}
	if d.opts.TaskOptions != nil {
		opts = append(opts, d.opts.TaskOptions(c.Job)...)
	}
	_, err := d.c.EnqueueContext(ctx, asynq.NewTaskWithHeaders(typ, c.Payload, info.headers()), opts...)
	switch {
	case err == nil:
		d.enqueued.Add(1)
	case errors.Is(err, asynq.ErrTaskIDConflict):
		// asynq holds a task of this occurrence: pending, active,
		// retrying, archived, or completed and retained. It is this
		// occurrence's run already (a re-dispatch after a dispatcher died,
		// or the same ZADD repeated), so it is not enqueued again.
		d.conflicts.Add(1)
		d.log.LogAttrs(ctx, slog.LevelInfo, "zclaim: asynq already has a task of this occurrence; not enqueued again",
			slog.String("task_id", info.Occurrence()), slog.String("queue", c.Queue))
		err = fmt.Errorf("zclaim: dispatch %q: %w", info.Occurrence(), err)
	default:
		d.failed.Add(1)
		d.log.LogAttrs(ctx, slog.LevelWarn, "zclaim: enqueue failed; the job goes back with backoff",
			slog.String("id", c.ID), slog.Int("attempt", c.Attempt), slog.String("error", err.Error()))
		d.report(c, redisNow, claimedAt, err)
		return outcome{retry: max(time.Millisecond, d.b.opts.Backoff(c.Attempt))}
	}
	d.report(c, redisNow, claimedAt, err)
	return outcome{}
}

// blank is asynq's test of a task type, task id or queue name it refuses.
func blank(s string) bool { return strings.TrimSpace(s) == "" }

func (d *Dispatcher) report(c Claim, redisNow, claimedAt time.Time, err error) {
	if d.opts.OnDispatch != nil {
		// Sub saturates for a due time ~292 years back; so must the sum.
		lag, since := redisNow.Sub(c.RunAt), time.Since(claimedAt)
		if lag <= math.MaxInt64-since {
			lag += since
		} else {
			lag = math.MaxInt64
		}
		d.opts.OnDispatch(c, lag, err)
	}
}
