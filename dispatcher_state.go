package zclaim

// What a Dispatcher is made of: its options, its stats, and the state its
// parts share (the pipeline of claims between claim, enqueue and settle).
// The parts (dispatcher_claim.go, dispatcher_enqueue.go,
// dispatcher_settle.go, dispatcher_wake.go) work on it; dispatcher.go
// starts them.

import (
	"context"
	"log/slog"
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
	DefaultDispatchLease  = 5 * time.Second
)

// DispatcherOptions configure a Dispatcher. The zero value is valid: every
// field left zero takes the default its comment names.
type DispatcherOptions struct {
	// Concurrency is how many enqueues run at once. The dispatcher keeps
	// at most max(Concurrency, 2×min(4×Concurrency, BatchSize)) more
	// claims queued for them (128 with the defaults), and fewer when
	// enqueues are slow: no more than they enqueue in a quarter of the
	// Lease at the pace of its recent enqueues, and none until
	// an enqueue has ended. It claims again, up to BatchSize jobs, when
	// half of that is free, so that a slow or unreachable asynq holds few
	// claims waiting while their leases run.
	// On an asynq client made from an autopipelined go-redis client
	// (asynq.NewClientFromRedisClient of (*redis.Client).AutoPipeline, as
	// in the README's quick start), the enqueues under way at one moment
	// share round trips, which leaves Redis more time for asynq's workers
	// (docs/performance.md).
	// Default: DefaultConcurrency (16).
	Concurrency int
	// MaxWait caps the sleep until the earliest due job. Schedule wakes
	// the dispatcher at once when it adds an earlier job, and so does a
	// plain ZADD by another program where the server publishes keyspace
	// events for sorted sets (notify-keyspace-events with K and z, or
	// KEA); elsewhere a plain ZADD is found within MaxWait. Where those
	// events are published, an idle dispatcher sleeps up to a second
	// (or MaxWait, if longer). The dispatcher also looks again whenever its
	// subscription comes back after a lost connection.
	// Default: DefaultMaxWait (50ms).
	MaxWait time.Duration
	// EnqueueTimeout bounds one enqueue (each has between 90% and all of
	// it: a worker's timeout serves the enqueues that start in its first
	// tenth), and one call that settles or renews batches. An autopipelined
	// client does not honour a command's deadline once it queued it: its
	// ReadTimeout and WriteTimeout bound those enqueues instead.
	// Default: DefaultEnqueueTimeout (5s).
	EnqueueTimeout time.Duration
	// Lease is how long the dispatcher's claims are held: it renews them
	// every Lease/3 while their enqueues go on, and recovery puts the jobs
	// of a claim whose lease ran out (its dispatcher died between the
	// claim and settling it) back on the schedule due at once, not after
	// their backoff, where any live dispatcher takes them: back in asynq
	// within Lease + RecoveryInterval of the death. Jobs the dead
	// dispatcher had enqueued meet their TaskID in asynq, or the
	// middleware's records, and do not run again.
	// Default: the Broker's Lease, at most DefaultDispatchLease (5s).
	Lease time.Duration
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
	// negative sets none. The idempotency middleware's finished records
	// cover longer windows: where every handler of these tasks runs under
	// it, they stop a re-dispatched occurrence without asynq's help, and
	// -1 spares asynq keeping the completed tasks: it deletes each task as
	// it finishes instead of writing it back (the README's quick start
	// sets it). Default: the re-dispatch window, Lease +
	// RecoveryInterval + MaxWait, plus one minute.
	TaskRetention time.Duration
	// TaskOptions adds asynq options per job (MaxRetry, Timeout, ...).
	// The dispatcher sets asynq.TaskID to the job's occurrence
	// (OccurrenceID), asynq.Retention to TaskRetention and the job's queue
	// first; options given here come after them and win.
	// With TaskOptions or OnDispatch set, claims read each job's due time
	// (Job.RunAt), which costs a little (docs/performance.md).
	// A panic in it sends the job to the dead set with the panic as its
	// reason (a *PanicError), logged at Error with its stack.
	// Default: nil.
	TaskOptions func(Job) []asynq.Option
	// OnDispatch, when set, is called after each job's enqueue (its batch
	// is settled later) with the job's JobInfo: err is nil when the task
	// was enqueued, ErrTaskIDConflict-wrapping when asynq already had it,
	// ErrLeaseLost-wrapping when the claim's lease ran out before its
	// enqueue (it was not made), or the enqueue error. lag is the time from the job's due time (this
	// claim's, after a retry its backoff's end) to the end of its enqueue,
	// reckoned from Redis' clock at the claim. It runs on the enqueueing goroutine: keep it short. A
	// panic in it is recovered and logged at Error; the dispatch stands.
	// Setting it makes claims read the jobs' due times (see TaskOptions).
	// Default: nil.
	OnDispatch func(job JobInfo, lag time.Duration, err error)
	// Enqueue, when set, is called before each job's enqueue with the job
	// as its task carries it (Queue the task's queue, after TaskOptions;
	// Headers the task's headers, which it may add to or change), and the
	// function it returns, if not nil, after the enqueue with its error
	// (as OnDispatch's). zclaimotel.EnqueueHook fills it with a
	// span in the job's trace. It runs on the enqueueing goroutine. A
	// panic in it is recovered and logged at Error, and the job is
	// enqueued as it was.
	// Default: nil.
	Enqueue func(ctx context.Context, job *Job) (end func(err error))
	// AsynqRedis is ignored, and NewDispatcher says so at Warn: every task
	// goes through the asynq Client. An asynq Client made from an
	// autopipelined go-redis client (asynq.NewClientFromRedisClient of
	// (*redis.Client).AutoPipeline) enqueues as fast as writing tasks in
	// bulk did (docs/performance.md).
	//
	// Deprecated: give NewDispatcher an asynq Client on an autopipelined
	// client instead.
	AsynqRedis redis.UniversalClient
	// Logger receives the dispatcher's logs. Default: the Broker's logger.
	Logger *slog.Logger
}

// minRetention is the smallest non-zero Retention asynq keeps: it stores
// whole seconds.
const minRetention = time.Second

// DispatcherStats count what a Dispatcher did since it was made.
type DispatcherStats struct {
	Claimed  int64 // claims taken off the schedule
	Enqueued int64 // tasks enqueued into asynq
	// InBulk is 0: every task goes through the asynq Client.
	//
	// Deprecated: see DispatcherOptions.AsynqRedis.
	InBulk    int64
	Conflicts int64 // claims whose task id asynq already had (settled, not enqueued)
	// Failed counts enqueues that failed, or were not made because the
	// claim's lease ran out while it waited; their claims went back with
	// backoff.
	Failed int64
	// Dead counts claims that could not become tasks (no type, one asynq
	// refuses, or a corrupt record), sent to the dead set.
	Dead int64
	// Lag is the distribution of the time from a job's due time to the end
	// of its enqueue, reckoned from Redis' clock at the claim, over the
	// first attempts enqueued (a retry's due time is its backoff's end,
	// which claims do not read).
	Lag LagHistogram
}

// Dispatcher moves due jobs from a Broker's schedule into asynq the moment
// they are due: it sleeps until the earliest due time (read from Redis),
// wakes early when an earlier job is scheduled, claims due jobs in
// batches, enqueues each as an asynq task whose TaskID names the job's
// occurrence (OccurrenceID) and whose headers carry its JobInfo, and
// settles the batch. Any number of dispatchers may share a schedule.
//
// A dispatcher's batch is one lease, not one per job, settled as one once
// every job in it is enqueued (or given back, or dead). A batch still in
// the dispatcher's hands a third of a lease after its claim has its lease
// renewed, while the dispatcher's enqueues go on (an asynq that hangs
// lets it run out). If the dispatcher dies first, recovery puts the whole
// batch back after the lease, and the jobs already enqueued meet asynq's
// TaskID on their next dispatch: asynq keeps their tasks, completed ones
// too, for TaskRetention. Stats count the jobs of a batch lease one by one.
type Dispatcher struct {
	b    *Broker
	c    *asynq.Client
	opts DispatcherOptions
	log  *slog.Logger

	claimed, enqueued, conflicts, failed, dead atomic.Int64
	lag                                        lagHistogram
	enqueueTime                                average // of an enqueue, lately: paces the claims (pipeline.limit)

	keyspace  atomic.Bool // the server publishes keyspace events for the schedule, and they are subscribed
	claimWarn rateLog
	keepWarn  rateLog // of the leases the keeper renews
}

// pipeline is one Run of a dispatcher: three stages joined by channels.
//
//	claim ──queue──▶ enqueue (Concurrency workers) ──acks──▶ settle
//
// The claim stage takes due jobs a batch at a time, as many as the queue
// has room for; each worker enqueues one job at a time into asynq; the
// settle stage settles every batch whose jobs are all enqueued (or given
// back, or dead), gathering those that finish together into one round
// trip. Beside them, the keeper renews the leases of the batches in hand
// (keep).
type pipeline struct {
	d       *Dispatcher
	wake    <-chan struct{}
	queue   chan queued    // claimed jobs waiting for a worker
	out     atomic.Int64   // claims queued or being enqueued
	freed   chan struct{}  // a worker made room for claims
	acks    chan *batchRun // batches whose every job is dispatched
	workers sync.WaitGroup // the enqueue stage
	settled chan struct{}  // closed when the settle stage has ended
	ended   atomic.Int64   // dispatches ended: the progress that keeps leases (keep)
	kept    keptBatches    // the batches in hand, for the keeper
	mode    claimMode      // whether claims read due times
	claims  []Claim        // the array of the last claim's claims, for the next
	timer   *time.Timer    // the claim stage's next look at the schedule
}

// queued is one claimed job on its way to a worker.
type queued struct {
	c                   Claim
	run                 *batchRun
	index               int
	redisNow, claimedAt time.Time
}

// average is a moving average of durations, safe for concurrent use: each
// observation weighs an eighth.
type average struct{ ns atomic.Int64 }

func (a *average) get() time.Duration { return time.Duration(a.ns.Load()) }

func (a *average) observe(d time.Duration) {
	for {
		old := a.ns.Load()
		v := int64(d)
		if old != 0 {
			v = old + (v-old)/8
		}
		if a.ns.CompareAndSwap(old, max(v, 1)) {
			return
		}
	}
}

// batchRun follows the jobs of one batch claim through the workers.
type batchRun struct {
	left   atomic.Int64 // jobs not yet dispatched
	noType atomic.Int64 // jobs dead for want of a task type
	until  atomic.Int64 // the lease's deadline, Unix ms by Redis' clock; 0 once it was found lost
	closed atomic.Bool  // the acker is done with it
	mu     sync.Mutex
	end    batchEnd

	// The keeper's alone, once the batch is kept:
	renewed time.Time // when its lease was claimed or last renewed
	mark    int64     // the pipeline's dispatches ended by then
}

// keptBatches are the batches in a pipeline's hands (their jobs being
// enqueued, or waiting for their settle), for the keeper.
type keptBatches struct {
	mu         sync.Mutex
	runs       []*batchRun
	stop, done chan struct{} // the keeper's end
}
