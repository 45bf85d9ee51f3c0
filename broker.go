package zclaim

import (
	"context"
	_ "embed"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Limits and defaults of a Broker.
const (
	// DefaultKey is the schedule key when BrokerOptions.Key is empty.
	DefaultKey = "zclaim:{default}"
	// DefaultLease is the lease of a claim when BrokerOptions.Lease is zero.
	DefaultLease = 30 * time.Second
	// DefaultMaxAttempts is used when BrokerOptions.MaxAttempts is zero.
	DefaultMaxAttempts = 25
	// DefaultBatchSize is used when BrokerOptions.BatchSize is zero.
	DefaultBatchSize = 100
	// MaxBatchSize bounds one claim or recovery script.
	MaxBatchSize = 1000
	// MaxIDLen is the longest job id, in bytes.
	MaxIDLen = 512
	// MaxPayloadLen bounds a job's Type, Queue and Payload together, in bytes.
	MaxPayloadLen = 1 << 20
	// DefaultDeadMax is used when BrokerOptions.DeadMax is zero: asynq's
	// own bound on its archive.
	DefaultDeadMax = 10000
	// DefaultDeadRetention is used when BrokerOptions.DeadRetention is
	// zero: how long asynq keeps an archived task.
	DefaultDeadRetention = 90 * 24 * time.Hour
)

// BrokerOptions configure a Broker. The zero value is valid: every field
// left zero takes the default its comment names.
type BrokerOptions struct {
	// Key is the schedule ZSet (member = job id, score = due time). Every
	// other key of the schedule is derived from it and shares its Redis
	// Cluster slot. An existing set written by other programs can be
	// adopted by naming it. Default: DefaultKey ("zclaim:{default}").
	Key string
	// ScoreUnit is the unit of the scores: time.Second (Unix seconds,
	// fractions allowed; new jobs get millisecond precision) or
	// time.Millisecond (Unix milliseconds). Default: time.Second.
	ScoreUnit time.Duration
	// Lease is how long a claim is held before recovery may take it back.
	// Default: DefaultLease (30s).
	Lease time.Duration
	// MaxAttempts is how many claims a job gets; a run that fails or whose
	// lease expires on its last attempt goes to the dead set.
	// Default: DefaultMaxAttempts (25).
	MaxAttempts int
	// Backoff is the delay before attempt+1 after attempt failed or expired.
	// Default: DefaultBackoff (exponential from 1s, jittered, capped at 1h).
	Backoff func(attempt int) time.Duration
	// BatchSize is how many jobs one recovery pass (and one dispatcher
	// claim) handles, 1 to MaxBatchSize. Default: DefaultBatchSize (100).
	BatchSize int
	// DeadMax is how many jobs the dead set keeps: each recovery pass
	// removes the oldest deaths beyond it, as asynq bounds its archive.
	// Negative keeps every one. Default: DefaultDeadMax (10,000).
	DeadMax int
	// DeadRetention is how long a job stays in the dead set after it died:
	// each recovery pass removes older ones. Negative keeps them until
	// DeleteDead (or DeadMax). Default: DefaultDeadRetention (90 days).
	DeadRetention time.Duration
	// Logger receives the broker's logs (and its Dispatchers', unless
	// they have their own). Default: none (quiet); pass slog.Default() to
	// see its warnings.
	Logger *slog.Logger
	// AllowEviction lets NewBroker accept a server whose maxmemory-policy
	// may evict keys, which loses jobs in silence; it logs a warning
	// instead of failing with ErrEvictionPolicy. Default: false.
	AllowEviction bool
	// Runs is the idempotency store whose runs Job, Jobs and Stats also
	// report: the runs of asynq tasks that are active now, running or
	// abandoned by a dead worker (see Idempotency.Runs). Default: none.
	Runs *Idempotency
	// WaitReplicas makes every write wait (WAIT) until this many replicas
	// have it, and fail with ErrNotReplicated when they do not within
	// WaitTimeout: a job whose Schedule returned nil then survives a
	// failover to one of them, and fencing tokens never go backwards.
	// Default: 0, no waiting (a failover can lose the writes of the last
	// moments before it).
	WaitReplicas int
	// WaitTimeout bounds the wait for WaitReplicas.
	// Default: DefaultWaitTimeout (1s) when WaitReplicas is set.
	WaitTimeout time.Duration
	// Shards spreads the schedule over this many sets of keys, each with
	// a hash tag of its own derived from Key, so that Redis Cluster puts
	// them on different masters: memory and claim work divide among them.
	// A job's shard follows from its id (FNV-1a of the id, modulo Shards),
	// so one job's calls touch one shard. The count is recorded with the
	// schedule, and a Broker with another count is refused (ErrShards).
	// Only 1 adopts an existing set as it is; with more, producers must
	// use Schedule. 1 to MaxShards. Default: the count recorded with the
	// schedule, else 1 (so tools such as the zclaim command open a sharded
	// schedule without being told its count).
	Shards int
	// History is how long the schedule remembers, for Job and Jobs, the
	// asynq task each dispatched job became (its queue and task id,
	// written by the Dispatcher in the call that settles its claim, no
	// round trip of its own), so that a lookup finds the job in asynq
	// after it left the schedule. Negative: not kept.
	// Default: DefaultRunRetention (24h).
	History time.Duration
}

// DefaultBackoff waits 1s after the first attempt and doubles with each
// attempt up to 1h, picking uniformly from the upper half of that delay.
func DefaultBackoff(attempt int) time.Duration {
	if attempt < 1 {
		attempt = 1
	}
	d := time.Hour
	if attempt <= 12 {
		d = min(time.Second<<(attempt-1), time.Hour)
	}
	return d/2 + rand.N(d/2+1)
}

// discardLogger is the logger of options that name none.
var discardLogger = slog.New(slog.DiscardHandler)

// orDefault sets an option left at its zero value to its default d.
func orDefault[T comparable](v *T, d T) {
	var zero T
	if *v == zero {
		*v = d
	}
}

func (o *BrokerOptions) setDefaults() {
	orDefault(&o.Key, DefaultKey)
	orDefault(&o.ScoreUnit, time.Second)
	orDefault(&o.Lease, DefaultLease)
	orDefault(&o.MaxAttempts, DefaultMaxAttempts)
	if o.Backoff == nil {
		o.Backoff = DefaultBackoff
	}
	orDefault(&o.BatchSize, DefaultBatchSize)
	orDefault(&o.DeadMax, DefaultDeadMax)
	orDefault(&o.DeadRetention, DefaultDeadRetention)
	orDefault(&o.Logger, discardLogger)
	orDefault(&o.History, DefaultRunRetention)
}

func (o *BrokerOptions) validate() error {
	switch {
	case o.ScoreUnit != time.Second && o.ScoreUnit != time.Millisecond:
		return fmt.Errorf("%w: ScoreUnit must be time.Second or time.Millisecond, not %v",
			ErrInvalidOptions, o.ScoreUnit)
	case o.Lease < time.Millisecond:
		return fmt.Errorf("%w: Lease must be at least 1ms, not %v", ErrInvalidOptions, o.Lease)
	case o.MaxAttempts < 1:
		return fmt.Errorf("%w: MaxAttempts must be at least 1, not %d", ErrInvalidOptions, o.MaxAttempts)
	case o.BatchSize < 1 || o.BatchSize > MaxBatchSize:
		return fmt.Errorf("%w: BatchSize must be between 1 and %d, not %d", ErrInvalidOptions,
			MaxBatchSize, o.BatchSize)
	case o.Shards < 0 || o.Shards > MaxShards:
		return fmt.Errorf("%w: Shards must be between 1 and %d, not %d", ErrInvalidOptions, MaxShards, o.Shards)
	case o.History > 0 && o.History < time.Minute:
		return fmt.Errorf("%w: History must be at least 1m (or negative: none), not %v", ErrInvalidOptions, o.History)
	case o.DeadRetention > 0 && o.DeadRetention < time.Millisecond:
		return fmt.Errorf("%w: DeadRetention must be at least 1ms (or negative: no limit), not %v",
			ErrInvalidOptions, o.DeadRetention)
	}
	return validateReplication(o.WaitReplicas, &o.WaitTimeout)
}

// Broker keeps a schedule of delayed jobs in a Redis sorted set and hands
// due jobs to exactly one claimer each. It is safe for concurrent use, and
// any number of Brokers (in any number of processes) may share a schedule.
type Broker struct {
	shardSet // the client, and the schedule's shards as its scripts reach them
	opts     BrokerOptions
	units         // of the scores: ups, 1 or 1000
	keys     keys // shard 0's: the schedule's own when unsharded
	log      *slog.Logger
	state    *stateMarker

	noticeDenied sync.Once // a refused notice is logged once
	recovered    struct{ requeued, dead, trimmed atomic.Int64 }
	nextShard    atomic.Int64 // where Claim starts, with Shards
	quietShards  quietShards  // by shard: its last claim found nothing due and nothing in flight
	history      jobHistory   // the tasks jobs became, for Jobs
}

// Job is one piece of work on the schedule. Its ID is the member of the
// schedule set; together with the due time it is first scheduled for, it
// names an occurrence (see JobInfo), the unit that runs once: the asynq
// TaskID when dispatched and the middleware's default key.
type Job struct {
	ID      string
	RunAt   time.Time
	Type    string // asynq task type, used when dispatched
	Payload []byte
	Queue   string // asynq queue; "" means "default"
	// Headers travel with the job: kept in its record and copied into
	// the asynq task's headers when dispatched (a trace's context, as
	// zclaimotel.Inject writes it). Names beginning with "zclaim-" are
	// the dispatcher's. They count toward MaxPayloadLen.
	Headers map[string]string
}

// Claim is a job taken off the schedule by one claimer, with a lease.
type Claim struct {
	Job
	// Token is the fencing token of this claim: strictly increasing per
	// schedule and never reused. Ack, Extend, Retry and Kill succeed only
	// while it is current.
	Token int64
	// Attempt is 1 on the first claim of a job, 2 on the claim after one
	// retry or one expired lease, and so on.
	Attempt int
	// Due is the due time of the claim's occurrence (see JobInfo), to the
	// millisecond: the time the job was first scheduled for, which a
	// retry's backoff does not move. RunAt is this claim's own due time:
	// its score in the schedule, except on a first attempt of a job written
	// by Schedule, which reads it from the job's record (what Schedule
	// wrote: the same time, unless another program has since moved the
	// member with a ZADD of its own).
	Due time.Time
	// LeaseUntil is the lease deadline by Redis' clock. After it, recovery
	// may take the job back and void Token. The claims of one
	// Broker.Claim call (from one shard) share one lease: Extend of any of
	// them moves the deadline of those not settled yet.
	LeaseUntil time.Time

	state string     // the schedule's state marker when claimed
	mdue  string     // the occurrence's due score when it rides in the in-flight member
	shard int        // the shard it was claimed from
	lease batchLease // the lease it shares with the claims of its call; n = 0: its own in-flight member
	place int        // its place in the lease, from 1
	at    int        // where its entry starts in the lease's jobs (see prelude.lua), from 1
}

// member is the claim's entry in the in-flight set (see claim.lua).
func (c Claim) member() string {
	m := c.ID + "|" + strconv.FormatInt(c.Token, 10)
	if c.mdue != "" {
		m += "@" + c.mdue
	}
	return m
}

// NewBroker returns a Broker on rdb, which it never closes. It fails when
// an option is out of range, when rdb is a cluster client and the keys
// derived from opts.Key cannot share its hash slot, and with
// ErrEvictionPolicy when the server may evict keys (unless AllowEviction).
// It asks the server (INFO) for its eviction policy, warns when the server
// persists nothing, and marks the schedule's state so that a server that
// loses it later is noticed (ErrStateLost); a server it cannot reach now
// is checked again by the recovery loop.
func NewBroker(rdb redis.UniversalClient, opts BrokerOptions) (*Broker, error) {
	if rdb == nil {
		return nil, fmt.Errorf("%w: nil Redis client", ErrInvalidOptions)
	}
	opts.setDefaults()
	if err := opts.validate(); err != nil {
		return nil, err
	}
	if opts.Shards == 0 { // asks the server: only when not given
		opts.Shards = recordedShards(rdb, opts.Key)
	}
	shards, err := shardKeys(opts.Key, opts.Shards, isCluster(rdb))
	if err != nil {
		return nil, err
	}
	k := *shards[0]
	ups := 1
	if opts.ScoreUnit == time.Millisecond {
		ups = 1000
	}
	b := &Broker{shardSet: shardSet{rdb: rdb, shards: shards, repl: replication{opts.WaitReplicas, opts.WaitTimeout}},
		opts: opts, keys: k, units: units{ups}, log: opts.Logger,
		quietShards: make(quietShards, len(shards)), history: jobHistory{keep: opts.History},
		state: &stateMarker{rdb: rdb, key: k.marker, log: opts.Logger, what: "the schedule's keys (" + k.schedule + ")",
			every: stateCheckInterval}}
	if err := startup(rdb, k.schedule, opts.AllowEviction, b.log, b.state); err != nil {
		return nil, err
	}
	if err := b.recordShards(); err != nil {
		return nil, err
	}
	return b, nil
}

// Key returns the schedule key (BrokerOptions.Key).
func (b *Broker) Key() string { return b.opts.Key }

// Runs returns the idempotency store whose runs Job, Jobs and Stats report
// (BrokerOptions.Runs), nil if none.
func (b *Broker) Runs() *Idempotency { return b.opts.Runs }

// validateJob checks one job against the documented limits.
func checkID(ctx context.Context, op, id string) error {
	if err := ctx.Err(); err != nil {
		return wrap(ctx, op, err, nil)
	}
	if id == "" {
		return zerr("zclaim: %s: %w", op, ErrEmptyID)
	}
	if len(id) > MaxIDLen {
		return zerr("zclaim: %s: %w", op, ErrIDTooLong)
	}
	return nil
}
