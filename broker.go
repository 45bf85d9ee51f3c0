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

	"github.com/hibiken/asynq"
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

// ShardKey returns the schedule key of the shard that holds job id: the
// key itself with one shard; with Shards, that of id's shard, whose hash
// slot says which Redis Cluster master holds the job.
func (b *Broker) ShardKey(id string) string { return b.shardOf(id).schedule }

// recordShards records the shard count with the schedule, or checks it
// against the one recorded: in a string beside the unsharded schedule's
// keys ("{delay:jobs}:shards"), written only for more than one shard. A
// count that differs is refused; so is a sharded schedule on a key that
// holds a set already (producers writing it would never be read).
func (b *Broker) recordShards() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	rec := shardRecord(b.opts.Key)
	n := strconv.Itoa(len(b.shards))
	if len(b.shards) > 1 {
		if exists, err := b.rdb.Exists(ctx, b.opts.Key).Result(); err == nil && exists == 1 {
			return zerr("zclaim: %w: key %q holds a set already; only Shards 1 adopts an existing set "+
				"(docs/broker.md, Redis Cluster)", ErrShards, b.opts.Key)
		}
		b.rdb.SetNX(ctx, rec, n, 0)
	}
	got, err := b.rdb.Get(ctx, rec).Result()
	switch {
	case err == redis.Nil:
		got = "1"
	case err != nil:
		b.log.LogAttrs(ctx, slog.LevelWarn, "zclaim: could not read the schedule's shard count",
			slog.String("key", rec), slog.String("error", err.Error()))
		return nil
	}
	if got != n {
		return zerr("zclaim: %w: the schedule %q has %s shards, not %s; open it with Shards %s (docs/operations.md "+
			"says how to change the count)",
			ErrShards, b.opts.Key, got, n, got)
	}
	return nil
}

// quietShards tell, by shard, whether a Broker's last claim of the shard
// found nothing due and nothing in flight.
type quietShards []atomic.Bool

// all reports whether every shard is quiet.
func (q quietShards) all() bool {
	for i := range q {
		if !q[i].Load() {
			return false
		}
	}
	return true
}

// jobHistory is what a Broker keeps of the tasks its jobs became: how long
// (BrokerOptions.History; negative: nothing), and asynq's Inspector, made
// on first use, to read the tasks back.
type jobHistory struct {
	keep time.Duration
	once sync.Once
	insp *asynq.Inspector
}
