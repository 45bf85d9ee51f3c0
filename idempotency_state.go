package zclaim

// What an Idempotency store is made of: its options, and the state its
// parts share (the run records, the lease guards, the tasks taken ahead,
// the takeover pass, the asynq adapter), with the calls every part makes.
// The parts (execution.go, idempotency_*.go, middleware_*.go,
// asynq_adapter.go) work on it; idempotency.go makes a store and begins
// runs, middleware.go wraps handlers.

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"strconv"
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

// Prefix returns the prefix of the store's keys.
func (i *Idempotency) Prefix() string { return i.opts.Prefix }

// stateCheckInterval is how often a store or a Broker has its state
// marker checked, in the background (a variable for the tests).
var stateCheckInterval = time.Second

func (i *Idempotency) recordKey(key string) string { return i.opts.Prefix + key }

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

// Execution is one run of a key, holding its lease.
type Execution struct {
	Key   string // the idempotency key
	Token int64  // fencing token: larger than every earlier run's of Key
	// Resumed tells that an earlier run of Key began and did not complete:
	// its worker died or stalled past its lease, or it failed and was
	// released. Its effect may have happened. A handler whose effect lives
	// outside the database of zclaimpg checks its own store for Key first.
	// It is false for a key whose earlier record expired or was lost.
	Resumed bool

	i          *Idempotency
	keys       []string  // the run record's key, the bucket of finished records that holds Key's, and its history's
	field      any       // Key's field in that bucket (a string)
	sent       time.Time // local time just before Begin was sent: no later than Redis' start of the lease
	replied    time.Time // local time Begin's reply arrived: no earlier than Redis' Token
	state      string    // the store's state marker at Begin
	mu         sync.Mutex
	leaseUntil time.Time
}

// adapter is a store's view of the asynq adapter: the asynq it was built
// with, the scripts it knows, and the parts found not to apply.
type adapter struct {
	version string // asynq's, as the build says ("" where it does not)
	known   bool   // version is of knownAsynq's line
	dequeue string // the SHA1 of asynq's dequeue script that dequeue.lua stands for (asynqDequeue)
	seen    sync.Map
	off     atomic.Int64
}

// leaseGuard renews a run's lease while its handler runs: its heartbeat
// starts only if the handler outlives Lease/4 (most do not, and make no
// goroutine, channel or timer for it: the store's guards start it).
type leaseGuard struct {
	i      *Idempotency
	e      *Execution
	ctx    context.Context // the handler's
	cancel context.CancelCauseFunc
	since  time.Time // when the handler was called

	mu      sync.Mutex
	stopped bool
	stop    chan struct{} // closed to end the heartbeat
	hbDone  chan struct{} // closed when it has ended
}

// guards are the lease guards of a store's handlers whose heartbeat has not
// started. One loop, running while there are any, starts the heartbeat of
// each whose handler has run Lease/4, within Lease/12 of that, so that its
// first renewal comes by Lease/3. A timer per run would cost each task
// the wake-up of an idle thread, which Go's runtime makes when a timer is
// added ahead of the others.
// The same loop sends the Completes that wait for asynq's done of their
// task (late) but have waited Lease/4 (see completeLater).
type guards struct {
	mu      sync.Mutex
	set     map[*leaseGuard]struct{}
	late    map[string]*lateComplete // by asynq's key of the task
	running bool                     // the loop runs
	// sendLate sends a late Complete: the store's completeNow
	// (NewIdempotency).
	sendLate func(*lateComplete)
}

// lateComplete is the Complete of a run whose handler returned, waiting
// for asynq's done of its task.
type lateComplete struct {
	e       *Execution
	skipped bool   // the handler found the work done (ErrAlreadyDone)
	task    string // asynq's key of the task
	since   time.Time
}

// holder is the process's part as a holder of tasks: its id, the beat
// loop (from the first dequeue that marks a task until Close), and the
// marks of tasks whose runs began, taken out at the next beat.
type holder struct {
	i     *Idempotency
	once  sync.Once
	id    string
	stop  chan struct{}
	done  chan struct{}
	mu    sync.Mutex
	began map[string][]string // queue -> task ids
	on    atomic.Bool         // the loop runs (set and cleared under mu)
}

// takenTask is a task dequeue.lua took ahead: its message and id.
type takenTask struct{ msg, id string }

// aheadQueue is what a store took ahead of one asynq queue.
type aheadQueue struct {
	// k is how many tasks the next dequeue takes: it doubles (up to
	// ahead.most) when asynq asked for all that a dequeue took, and
	// halves when some went back unasked.
	k      int
	batch  int // how many the dequeue that filled tasks took
	tasks  []takenTask
	gen    uint64 // counts the dequeues that filled tasks
	keys   []string
	prefix string // asynq's prefix of the queue's task keys
}

// ahead holds a store's tasks taken ahead, by asynq queue.
type ahead struct {
	i    *Idempotency
	hold time.Duration // how long a task waits for asynq's dequeue: takeAheadHold, at most Lease/4
	most int           // the most tasks a dequeue takes (IdempotencyOptions.TakeAhead)
	mu   sync.Mutex
	qs   map[string]*aheadQueue
}

// takeover is an Idempotency store's takeover loop: it starts with the
// store's first Middleware and stops with Close.
type takeover struct {
	i       *Idempotency
	passes  atomic.Int64 // passes made (passTurn)
	once    sync.Once
	stop    chan struct{}
	done    chan struct{}
	mu      sync.Mutex
	in      *asynq.Inspector
	stopped bool
	warn    rateLog // of the passes that failed
}

// activeRun is an asynq task that is active now, with the key the
// middleware gives it.
type activeRun struct {
	task *asynq.TaskInfo
	key  string
	job  JobInfo // for a task that carries one
	has  bool
	// unsure: key is what a Key function of the user's tells of the task,
	// for a type the middleware has not handled (not taken over).
	unsure bool
	// gone: the task's worker is gone, as asynq's lease of it tells (set by
	// records: see workersGone); held: as the mark of the process that
	// held it tells (heldGone), which dequeued it on a store's AsynqClient.
	gone, held bool
}

// heldTask names a task that a live asynq worker holds: its queue (""
// where its worker's record does not tell) and its id.
type heldTask struct{ queue, id string }

// settleTimeout bounds Complete and Release after the handler returned;
// they run on a context that outlives the handler's cancellation.
const settleTimeout = 5 * time.Second

// doneInfix follows the store's prefix in the names of its own keys: the
// buckets of finished records, and the key that records their number. A
// run key of that form would be one of them, so Begin refuses such keys.
const doneInfix = "\x00done"

// thisProcess names this process for a Takeover: "host:pid".
var thisProcess = sync.OnceValue(func() string {
	host, _ := os.Hostname()
	return host + ":" + strconv.Itoa(os.Getpid())
})
