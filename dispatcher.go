package zclaim

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/hibiken/asynq"
)

// NewDispatcher returns a dispatcher of b's jobs into c. It never closes c.
func NewDispatcher(b *Broker, c *asynq.Client, opts DispatcherOptions) (*Dispatcher, error) {
	if b == nil || c == nil {
		return nil, fmt.Errorf("%w: NewDispatcher needs a Broker and an asynq Client", ErrInvalidOptions)
	}
	orDefault(&opts.Concurrency, DefaultConcurrency)
	orDefault(&opts.MaxWait, DefaultMaxWait)
	orDefault(&opts.EnqueueTimeout, DefaultEnqueueTimeout)
	orDefault(&opts.RecoveryInterval, DefaultRecoveryInterval)
	orDefault(&opts.Logger, b.log)
	orDefault(&opts.Lease, min(b.opts.Lease, DefaultDispatchLease))
	orDefault(&opts.TaskRetention, opts.Lease+max(opts.RecoveryInterval, 0)+opts.MaxWait+time.Minute)
	switch {
	case opts.Concurrency < 1:
		return nil, fmt.Errorf("%w: Concurrency must be at least 1, not %d", ErrInvalidOptions, opts.Concurrency)
	case opts.Lease < 30*time.Millisecond:
		return nil, fmt.Errorf("%w: Lease must be at least 30ms, not %v", ErrInvalidOptions, opts.Lease)
	case opts.MaxWait < time.Millisecond:
		return nil, fmt.Errorf("%w: MaxWait must be at least 1ms, not %v", ErrInvalidOptions, opts.MaxWait)
	case opts.EnqueueTimeout < time.Millisecond:
		return nil, fmt.Errorf("%w: EnqueueTimeout must be at least 1ms, not %v",
			ErrInvalidOptions, opts.EnqueueTimeout)
	case opts.TaskRetention > 0 && opts.TaskRetention < minRetention:
		return nil, fmt.Errorf("%w: TaskRetention must be at least %v (asynq keeps whole seconds), or negative for "+
			"none, not %v", ErrInvalidOptions, minRetention, opts.TaskRetention)
	}
	d := &Dispatcher{b: b, c: c, opts: opts, log: opts.Logger}
	if opts.AsynqRedis != nil {
		d.log.LogAttrs(context.Background(), slog.LevelWarn, "zclaim: DispatcherOptions.AsynqRedis is ignored: every "+
			"task goes through the asynq client (make it from an autopipelined go-redis client for throughput)")
	}
	return d, nil
}

// Stats returns the dispatcher's counts.
func (d *Dispatcher) Stats() DispatcherStats {
	return DispatcherStats{Claimed: d.claimed.Load(), Enqueued: d.enqueued.Load(),
		Conflicts: d.conflicts.Load(), Failed: d.failed.Load(), Dead: d.dead.Load(), Lag: d.lag.snapshot()}
}

// Broker returns the Broker whose schedule the dispatcher moves.
func (d *Dispatcher) Broker() *Broker { return d.b }

// Run dispatches until ctx is done, with the broker's recovery loop beside
// it. Then it stops claiming, finishes and acks the enqueues under way, and
// returns nil. Claims it could not settle come back through recovery after
// their lease. Errors from Redis are logged and retried with backoff.
func (d *Dispatcher) Run(ctx context.Context) error {
	bg := d.startBackground(ctx) // the recovery loop, and what wakes the claims
	p := d.newPipeline(bg.wake)
	p.startSettle()
	p.startEnqueue()
	p.claimUntil(ctx) // until ctx is done; then, in this order:
	p.stopEnqueue()   // the workers finish the enqueues queued and under way,
	p.stopSettle()    // their batches are settled,
	bg.stop()         // and recovery and the wake-ups end.
	return nil
}

// background is what runs beside a dispatcher's pipeline: the broker's
// recovery loop and the listener that wakes the claim stage.
type background struct {
	wake chan struct{}
	stop func()
}

func (d *Dispatcher) startBackground(ctx context.Context) background {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	bg := background{wake: make(chan struct{}, 1), stop: func() { cancel(); wg.Wait() }}
	if d.opts.RecoveryInterval > 0 {
		wg.Add(1)
		go func() { defer wg.Done(); d.b.RunRecovery(ctx, d.opts.RecoveryInterval) }()
	}
	wg.Add(1)
	go func() { defer wg.Done(); d.listen(ctx, bg.wake) }()
	wg.Add(1)
	go func() { defer wg.Done(); d.checkPeriodic(ctx) }()
	return bg
}

// checkPeriodic logs at Error, once at the start of Run, each periodic
// definition this process cannot read (a time zone that does not load
// here: an image without the system's tzdata), rather than at its first
// tick: such a tick goes back with its backoff each time this dispatcher
// claims it (tick).
func (d *Dispatcher) checkPeriodic(ctx context.Context) {
	defs, err := d.b.ListPeriodic(ctx)
	if err != nil {
		return // the claims meet the same Redis, and say so
	}
	for _, p := range defs {
		if p.Err != nil {
			d.log.LogAttrs(ctx, slog.LevelError,
				"zclaim: this dispatcher cannot read a periodic definition; its ticks go back with backoff when it claims them",
				slog.String("name", p.Name), slog.String("error", p.Err.Error()))
		}
	}
}

func (d *Dispatcher) newPipeline(wake <-chan struct{}) *pipeline {
	// Besides a claim per worker, a queue of two claims of
	// min(4×Concurrency, BatchSize) jobs, claimed again when half of it is
	// free: the workers seldom wait for a claim round trip, a claim's cost
	// is shared by many jobs (a round trip costs more than the jobs in
	// it), and a slow asynq holds few claims waiting (limit; one whose
	// lease runs out meanwhile is not enqueued: see dispatch).
	conc := d.opts.Concurrency
	most := conc + max(conc, 2*min(4*conc, d.b.opts.BatchSize))
	p := &pipeline{d: d, wake: wake,
		queue:   make(chan queued, most), // a send never waits: at most limit() claims are out
		freed:   make(chan struct{}, 1),
		acks:    make(chan *batchRun, MaxBatchSize),
		settled: make(chan struct{}),
		mode:    leaseBatchIDs,
	}
	// Due times cost Redis a formatted number per job: read them only for
	// a hook that can see them.
	if d.opts.OnDispatch != nil || d.opts.TaskOptions != nil {
		p.mode = leaseBatch
	}
	return p
}

// startSettle starts the settle stage: one goroutine, so that the batches
// that finish while one settle call is under way go in the next.
// Beside it, the keeper renews the leases of the batches in hand.
func (p *pipeline) startSettle() {
	go func() { defer close(p.settled); p.d.acker(p.acks) }()
	p.kept.stop, p.kept.done = make(chan struct{}), make(chan struct{})
	go func() { defer close(p.kept.done); p.keep() }()
}

func (p *pipeline) stopSettle() {
	close(p.acks)
	<-p.settled
	close(p.kept.stop)
	<-p.kept.done
}

// startEnqueue starts the enqueue stage: Concurrency workers.
func (p *pipeline) startEnqueue() {
	for range p.d.opts.Concurrency {
		p.workers.Add(1)
		go func() {
			defer p.workers.Done()
			ec := enqueueContext{timeout: p.d.opts.EnqueueTimeout}
			defer ec.stop()
			for it := range p.queue {
				p.dispatch(ec.get(), it)
				// The claim stage waits for half the room free at most:
				// wake it only then, not for every job done.
				if out, lim := int(p.out.Add(-1)), p.limit(); lim-out >= p.half(lim) {
					select {
					case p.freed <- struct{}{}:
					default:
					}
				}
			}
		}()
	}
}

// dispatch dispatches queued claim it, by its batch's lease as the keeper
// last renewed it, and counts its outcome into the batch.
func (p *pipeline) dispatch(ctx context.Context, it queued) {
	it.c.LeaseUntil = time.UnixMilli(it.run.until.Load())
	o := p.d.dispatch(ctx, it.c, it.redisNow, it.claimedAt)
	p.ended.Add(1)
	it.run.settled(it.index, o, p.acks)
}

func (p *pipeline) stopEnqueue() {
	close(p.queue)
	p.workers.Wait()
}
