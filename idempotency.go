package zclaim

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
)

// Defaults of an Idempotency store.
const (
	// DefaultIdempotencyPrefix prefixes the run record of each key.
	DefaultIdempotencyPrefix = "zclaim:run:"
	// DefaultRunRetention is how long a finished record is kept when
	// IdempotencyOptions.Retention is zero. It outlasts every window in
	// which a duplicate of one occurrence can arrive: asynq's re-delivery
	// of a task whose worker died or whose ack was lost (its 30s lease,
	// its recoverer's minute, then the retry delay), and the broker's
	// re-dispatch after a dispatcher died (every retry of an occurrence
	// with DefaultBackoff and DefaultMaxAttempts falls within about 13.5h
	// of the first). Records kept = finish rate × Retention.
	DefaultRunRetention = 24 * time.Hour
	// DefaultRunLease is the lease of a run when IdempotencyOptions.Lease is
	// zero. It is renewed every Lease/3 (three renewals may fail before a
	// live run loses it), and a run whose worker died is taken over within
	// about a lease of its last renewal: 5 s keeps that within seconds while
	// a renewal costs each running task one small script every 1.7 s.
	DefaultRunLease = 5 * time.Second
)

var (
	// ErrAlreadyDone is returned by Begin for a key whose work finished
	// (within Retention).
	ErrAlreadyDone = errors.New("zclaim: already done")
	// ErrInProgress is returned by Begin for a key that another run holds
	// with a live lease; a *InProgressError matches it.
	ErrInProgress = errors.New("zclaim: in progress elsewhere")
)

// InProgressError tells that another run holds a key, and for how long its
// lease runs yet by Redis' clock. errors.Is(err, ErrInProgress) holds.
type InProgressError struct {
	Key       string
	LeaseLeft time.Duration
}

func (e *InProgressError) Error() string {
	return fmt.Sprintf("zclaim: key %q in progress elsewhere (lease left %v)", e.Key, e.LeaseLeft)
}

func (e *InProgressError) Is(target error) bool { return target == ErrInProgress }

// IdempotencyOptions configure an Idempotency store. The zero value is
// valid: every field left zero takes the default its comment names.
type IdempotencyOptions struct {
	// Prefix of the store's keys: the record of a running key k is
	// Prefix+k, and the finished records are fields of small hashes named
	// Prefix+"\x00done:"... in the slot of the records they serve, so that
	// every script stays in one slot of Redis Cluster. A prefix with a
	// hash tag puts every key of the store in that tag's slot.
	// Default: DefaultIdempotencyPrefix ("zclaim:run:").
	Prefix string
	// Lease of a running record. The middleware renews it every Lease/3
	// while the handler runs; a run that stops renewing (a stalled or dead
	// worker) loses it after Lease, and another run may start: a live
	// process takes it over (see Middleware). Default: DefaultRunLease (5s).
	Lease time.Duration
	// Retention is how long a finished record is kept: a run of the same
	// key within it is skipped. It counts from the run's lease deadline
	// when it finished (at most Lease after its Complete). Default:
	// DefaultRunRetention (24h).
	Retention time.Duration
	// NoHistory: the store writes no history of its keys' runs (started,
	// failed, lease lost, skipped, taken over, finished; kept for
	// Retention, in the scripts each step runs anyway), which
	// Broker.Jobs, zclaim show and Runs' TakenOver read.
	NoHistory bool
	// DoneBuckets is the number of small hashes that hold the finished
	// records (see DefaultDoneBuckets): they stay compact, about 32 bytes
	// a record, while finish rate × Retention ≤ 128 × DoneBuckets, so set
	// it to about rate × Retention / 100. The number is recorded with the
	// records at the first start and fixed from then on: zero takes the
	// recorded one (DefaultDoneBuckets for a new store), and another is
	// refused with ErrInvalidOptions.
	DoneBuckets int
	// Key names the work of an asynq task. Default: OccurrenceKey, the
	// occurrence of a task a Dispatcher enqueued (see JobInfo), else the
	// asynq task id.
	Key func(ctx context.Context, t *asynq.Task) (string, error)
	// Logger receives the store's and its middleware's logs. Default:
	// none (quiet); pass slog.Default() to see its warnings.
	Logger *slog.Logger
	// AllowEviction lets NewIdempotency accept a server whose
	// maxmemory-policy may evict keys (run records carry TTLs, so the
	// volatile policies evict them too), with a warning instead of
	// ErrEvictionPolicy. Default: false.
	AllowEviction bool
	// WaitReplicas and WaitTimeout make Begin, Extend, Complete and
	// Release wait for replicas, as BrokerOptions' do.
	// Default: 0, no waiting.
	WaitReplicas int
	WaitTimeout  time.Duration
	// DisableTakeover keeps the middleware of this store from taking over
	// the runs of dead workers: they come back only when asynq recovers
	// their tasks (after its 30 s lease and its once-a-minute recoverer).
	// Default: false.
	DisableTakeover bool
	// TakeoverQueues are the asynq queues whose active tasks the takeover
	// loop looks at. Default: every queue asynq knows (Inspector.Queues).
	TakeoverQueues []string
	// AsynqRedis is the Redis of the asynq server whose tasks the
	// middleware handles, where takeovers read active tasks and put a dead
	// worker's back on its queue. Default: the store's own client.
	AsynqRedis redis.UniversalClient
	// TakeAhead is the most tasks one of asynq's dequeues takes on the
	// store's AsynqClient, each marked as held by this process: asynq's next
	// dequeues of the queue get the others with no round trip (see
	// AsynqClient). 1 takes one task a dequeue, as asynq does; at most
	// MaxTakeAhead. Default: DefaultTakeAhead (8).
	TakeAhead int
}

// DefaultTakeAhead is IdempotencyOptions.TakeAhead's default, and
// MaxTakeAhead its largest value.
const (
	DefaultTakeAhead = 8
	MaxTakeAhead     = 64
)

// Idempotency is a store of run records, one per key: running (with a lease
// and a fencing token) or finished. It keeps one key to at most one live
// run, and a finished key from running again within Retention.
//
// What it cannot do: a worker that dies after its side effect but before
// Complete leaves a running record whose lease expires, and the work runs
// again; so does finished work when Redis loses or rolls back its records.
// Effects in PostgreSQL commit their done mark with the handler's writes
// through the zclaimpg module, so that the database decides. Other effects
// carry Execution.Key as their own idempotency key, and a handler checks
// its store when Execution.Resumed is set.
type Idempotency struct {
	rdb   redis.UniversalClient
	opts  IdempotencyOptions
	log   *slog.Logger
	repl  replication
	grp   group // Begin, Extend, Complete and Release called at the same moment go together
	state *stateMarker

	skipped, inProgress, completed, released, leaseLost, takeovers atomic.Int64

	doneTagged  bool // Prefix has a hash tag: every key of the store is in its slot
	doneMu      sync.Mutex
	doneReady   atomic.Bool // doneBuckets and doneSub are set (readyDone)
	doneBuckets int         // buckets of finished records (setupDone)
	doneSub     int         // of them, in each slot (doneTagged: all)
	doneSHA1    bool        // the store digests keys with SHA-1, not SHA-256 (digest)
	sweepOdds   int         // a Complete sweeps its bucket with odds 1 in this (doneSweepOdds)
	// begin, complete, settle and done are begin.lua, complete.lua,
	// settle.lua and doneScript with the options written in (storeScript).
	begin, complete, settle, done *redis.Script

	// viaDone are the asynq queues (string -> bool) whose dones an asynq
	// server sent through AsynqClient: their Completes wait for asynq's
	// done (completeLater).
	viaDone    sync.Map
	cluster    bool     // rdb is a Redis Cluster's client: a script's keys share a slot
	defaultKey bool     // Key is OccurrenceKey: takeovers tell a task's key from its id
	adapter    adapter  // what the store knows of asynq's insides, and the parts found off
	takeover   takeover // the loop that takes over dead workers' runs
	guards     guards   // the lease guards of running handlers whose heartbeat has not started
	ahead      ahead    // the tasks asynq's dequeues took ahead (middleware_prefetch.go)
	// types are the task types the middleware has handled (string ->
	// bool): true where a takeover can tell their tasks' keys (always, for
	// OccurrenceKey; see learnKey for a Key function of the user's).
	types sync.Map
	held  holder // the tasks its AsynqClient's dequeues hold before their runs begin
}

// IdempotencyStats count what an Idempotency store's middleware did since
// the store was made.
type IdempotencyStats struct {
	Skipped    int64 // tasks whose key had finished: handler skipped, task succeeded
	InProgress int64 // tasks that met a live run elsewhere: handed back to asynq to retry later
	Completed  int64 // handler runs that returned nil and completed their key
	Released   int64 // handler runs that failed or panicked and released their key
	LeaseLost  int64 // runs whose lease was lost: the handler was cancelled, or its Complete was refused
	StateLost  int64 // times the store noticed that the server lost its records
	Takeovers  int64 // abandoned runs (their worker gone) this process took over: their tasks back on their queue
	// AdapterOff counts the parts of the asynq adapter this process found
	// not to apply (an asynq of another release line; a script of asynq's
	// it does not know), each logged at Warn once and shown by
	// Broker.Doctor: 0 while all apply.
	AdapterOff int64
}

// Stats returns the middleware's counts.
func (i *Idempotency) Stats() IdempotencyStats {
	return IdempotencyStats{Skipped: i.skipped.Load(), InProgress: i.inProgress.Load(),
		Completed: i.completed.Load(), Released: i.released.Load(), LeaseLost: i.leaseLost.Load(),
		StateLost: i.stateLosses(),
		Takeovers: i.takeovers.Load(), AdapterOff: i.adapter.off.Load()}
}

// Prefix returns the prefix of the store's keys.
func (i *Idempotency) Prefix() string { return i.opts.Prefix }

// NewIdempotency returns a store on rdb, which it never closes. Give it a
// plain go-redis client rather than an autopipelined one (the Dispatcher's
// asynq client in the quick start): the store groups the calls of one
// moment itself, and an autopipelined client holds a call back while its
// earlier batches are on their way, which each run's Begin and Complete
// then wait out.
func NewIdempotency(rdb redis.UniversalClient, opts IdempotencyOptions) (*Idempotency, error) {
	if rdb == nil {
		return nil, fmt.Errorf("%w: nil Redis client", ErrInvalidOptions)
	}
	orDefault(&opts.Prefix, DefaultIdempotencyPrefix)
	orDefault(&opts.Lease, DefaultRunLease)
	orDefault(&opts.Retention, DefaultRunRetention)
	defaultKey := opts.Key == nil
	if defaultKey {
		opts.Key = OccurrenceKey
	}
	orDefault(&opts.Logger, discardLogger)
	orDefault(&opts.TakeAhead, DefaultTakeAhead)
	switch {
	case opts.TakeAhead < 1 || opts.TakeAhead > MaxTakeAhead:
		return nil, fmt.Errorf("%w: TakeAhead must be 1 to %d, not %d", ErrInvalidOptions, MaxTakeAhead, opts.TakeAhead)
	case opts.Lease < 3*time.Millisecond:
		return nil, fmt.Errorf("%w: Lease must be at least 3ms, not %v", ErrInvalidOptions, opts.Lease)
	case opts.Retention < time.Millisecond:
		return nil, fmt.Errorf("%w: Retention must be at least 1ms, not %v", ErrInvalidOptions, opts.Retention)
	case opts.Retention > math.MaxInt64-opts.Lease:
		return nil, fmt.Errorf("%w: Lease + Retention must fit in a time.Duration (about 292 years), not %v + %v",
			ErrInvalidOptions, opts.Lease, opts.Retention)
	}
	if err := validateReplication(opts.WaitReplicas, &opts.WaitTimeout); err != nil {
		return nil, err
	}
	i := &Idempotency{rdb: rdb, opts: opts, log: opts.Logger, defaultKey: defaultKey, sweepOdds: doneSweepOdds,
		adapter: newAdapter(), repl: replication{opts.WaitReplicas, opts.WaitTimeout},
		grp: group{rdb: rdb}, cluster: isCluster(rdb), ahead: ahead{hold: min(takeAheadHold, opts.Lease/4), most: opts.TakeAhead},
		// The bare prefix is the record key of no key (keys are never
		// empty): it holds the store's state marker.
		state: &stateMarker{rdb: rdb, key: opts.Prefix, log: opts.Logger,
			what:  "the idempotency records (" + opts.Prefix + "*)",
			every: stateCheckInterval}}
	lease, ttl, retention := ms(opts.Lease), ms(opts.Lease+opts.Retention), ms(opts.Retention)
	i.begin = storeScript(beginLua, lease, ttl, retention)
	i.complete = storeScript(completeLua, lease, ttl, retention)
	i.settle = storeScript(settleLua, lease, ttl, retention)
	i.done = storeScript(doneScript(), lease, ttl, retention)
	if err := startup(rdb, opts.Prefix, opts.AllowEviction, i.log, i.state); err != nil {
		return nil, err
	}
	if err := i.checkDoneOptions(); err != nil {
		return nil, err
	}
	// A server that cannot be reached now is tried again at the first call.
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	err := i.readyDone(sctx)
	cancel()
	if errors.Is(err, ErrInvalidOptions) || errors.Is(err, ErrCorrupt) {
		return nil, err
	}
	i.state.polled.Store(time.Now().UnixNano())
	i.takeover.i, i.held.i, i.ahead.i = i, i, i
	if !i.adapter.known {
		bg, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		i.adapterOff(bg, "not "+knownAsynq+"x, whose Redis layout zclaim knows: no takeovers (a dead worker's "+
			"task waits for asynq's own recovery, 30 s to 90 s, and spends a retry), no tasks taken ahead, "+
			"no Complete inside asynq's done")
		cancel()
	}
	return i, nil
}

// stateCheckInterval is how often a store or a Broker has its state
// marker checked, in the background (a variable for the tests).
var stateCheckInterval = time.Second

func (i *Idempotency) stateLosses() int64 {
	_, n := i.state.lost()
	return n
}

func (i *Idempotency) recordKey(key string) string { return i.opts.Prefix + key }

// Begin starts a run of key. It returns ErrAlreadyDone when key finished
// within Retention, a *InProgressError (matching ErrInProgress) when
// another run holds a live lease, and otherwise an Execution with a fresh
// lease and a token larger than any earlier run's of key.
func (i *Idempotency) Begin(ctx context.Context, key string) (*Execution, error) {
	if err := checkID(ctx, "begin", key); err != nil {
		return nil, err
	}
	if strings.HasPrefix(key, doneInfix) {
		return nil, zerr("zclaim: begin: %w: key %q", ErrReservedKey, key)
	}
	if err := i.readyDone(ctx); err != nil {
		return nil, err
	}
	i.state.poll()
	e := i.execution(key, 0)
	e.sent = time.Now()
	reply, err := i.script(ctx, i.begin, e.keys, e.field, thisProcess()).Result()
	if err != nil {
		return nil, i.wrap(ctx, "begin", e.keys, err)
	}
	e.replied = time.Now()
	if tok, ok := reply.(int64); ok { // a key with no record
		e.Token, e.leaseUntil, e.state = tok, time.UnixMilli(tok/1000+ms(i.opts.Lease)), i.state.current()
		return e, nil
	}
	raw, ok := int64s(reply)
	if !ok || len(raw) < 3 || raw[0] == 0 && len(raw) != 4 {
		return nil, zerr("zclaim: begin: %w: reply %v", ErrCorrupt, reply)
	}
	switch raw[0] {
	case 1:
		return nil, fmt.Errorf("%w: key %q", ErrAlreadyDone, key)
	case 2:
		return nil, &InProgressError{Key: key, LeaseLeft: time.Duration(raw[2]) * time.Millisecond}
	}
	e.Token, e.Resumed, e.leaseUntil, e.state = raw[1], raw[3] != 0, time.UnixMilli(raw[2]), i.state.current()
	return e, nil
}

// script runs one of the run record's scripts: grouped with the store's
// other calls of the moment (group), or alone, followed by WAIT, where
// writes wait for replicas (WAIT counts the writes of its own connection).
func (i *Idempotency) script(ctx context.Context, s *redis.Script, keys []string, args ...any) *redis.Cmd {
	if i.repl.n > 0 {
		return i.repl.run(ctx, i.rdb, s, keys, args...)
	}
	return i.grp.run(ctx, s, keys, args...)
}

// int64s reads a script's array of integers.
func int64s(v any) ([]int64, bool) {
	a, ok := v.([]any)
	if !ok {
		return nil, false
	}
	out := make([]int64, len(a))
	for i, x := range a {
		if out[i], ok = x.(int64); !ok {
			return nil, false
		}
	}
	return out, true
}

// wrap names the key in the errors a run record's scripts raise:
// ZCLAIM_CORRUPT, and Redis' own WRONGTYPE (which names no key: it is
// keys[0], the run record, or keys[1:], its bucket of finished records and
// its history, hashes).
func (i *Idempotency) wrap(ctx context.Context, op string, keys []string, err error) error {
	var rerr redis.Error
	if errors.As(err, &rerr) {
		msg := rerr.Error()
		switch {
		case msg == "ZCLAIM_CORRUPT "+keys[0]:
			return zerr("zclaim: %s: %w: run record %q", op, ErrCorrupt, keys[0])
		case strings.HasPrefix(msg, "WRONGTYPE"):
			ctx := context.WithoutCancel(ctx)
			for n, k := range keys {
				want := map[bool]string{true: "string", false: "hash"}[n == 0]
				if typ, _ := i.rdb.Type(ctx, k).Result(); typ != want && typ != "none" {
					return &WrongTypeError{Key: k, Want: want, Got: typ}
				}
			}
		}
	}
	return wrap(ctx, op, err, nil)
}
