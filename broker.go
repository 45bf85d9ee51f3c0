package zclaim

import (
	"context"
	_ "embed"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
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

var (
	//go:embed prelude.lua
	preludeLua string
	//go:embed claim.lua
	claimLua string
	//go:embed schedule.lua
	scheduleLua string
	//go:embed ack.lua
	ackLua string
	//go:embed extend.lua
	extendLua string
	//go:embed retry.lua
	retryLua string
	//go:embed kill.lua
	killLua string
	//go:embed recover.lua
	recoverLua string
	//go:embed finish.lua
	finishLua string
	//go:embed stats.lua
	statsLua string
	//go:embed cancel.lua
	cancelLua string
	//go:embed dead.lua
	deadLua string

	claimScript    = newScript(claimLua)
	scheduleScript = newScript(scheduleLua)
	ackScript      = newScript(ackLua)
	extendScript   = newScript(extendLua)
	retryScript    = newScript(retryLua)
	killScript     = newScript(killLua)
	recoverScript  = newScript(recoverLua)
	finishScript   = newScript(finishLua)
	statsScript    = newScript(statsLua)
	cancelScript   = newScript(cancelLua)
	deadScript     = newScript(deadLua)
)

// newScript prepends the shared helpers (prelude.lua) to a script's body.
func newScript(body string) *redis.Script { return redis.NewScript(preludeLua + "\n" + body) }

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
	// Logger receives the broker's logs. Default: slog.Default(); a
	// logger with slog.DiscardHandler silences it.
	Logger *slog.Logger
	// AllowEviction lets NewBroker accept a server whose maxmemory-policy
	// may evict keys, which loses jobs in silence; it logs a warning
	// instead of failing with ErrEvictionPolicy. Default: false.
	AllowEviction bool
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
	if o.Key == "" {
		o.Key = DefaultKey
	}
	if o.ScoreUnit == 0 {
		o.ScoreUnit = time.Second
	}
	if o.Lease == 0 {
		o.Lease = DefaultLease
	}
	if o.MaxAttempts == 0 {
		o.MaxAttempts = DefaultMaxAttempts
	}
	if o.Backoff == nil {
		o.Backoff = DefaultBackoff
	}
	if o.BatchSize == 0 {
		o.BatchSize = DefaultBatchSize
	}
	if o.DeadMax == 0 {
		o.DeadMax = DefaultDeadMax
	}
	if o.DeadRetention == 0 {
		o.DeadRetention = DefaultDeadRetention
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
}

func (o *BrokerOptions) validate() error {
	switch {
	case o.ScoreUnit != time.Second && o.ScoreUnit != time.Millisecond:
		return fmt.Errorf("%w: ScoreUnit must be time.Second or time.Millisecond, not %v", ErrInvalidOptions, o.ScoreUnit)
	case o.Lease < time.Millisecond:
		return fmt.Errorf("%w: Lease must be at least 1ms, not %v", ErrInvalidOptions, o.Lease)
	case o.MaxAttempts < 1:
		return fmt.Errorf("%w: MaxAttempts must be at least 1, not %d", ErrInvalidOptions, o.MaxAttempts)
	case o.BatchSize < 1 || o.BatchSize > MaxBatchSize:
		return fmt.Errorf("%w: BatchSize must be between 1 and %d, not %d", ErrInvalidOptions, MaxBatchSize, o.BatchSize)
	case o.DeadRetention > 0 && o.DeadRetention < time.Millisecond:
		return fmt.Errorf("%w: DeadRetention must be at least 1ms (or negative: no limit), not %v", ErrInvalidOptions, o.DeadRetention)
	}
	return validateReplication(o.WaitReplicas, &o.WaitTimeout)
}

// Broker keeps a schedule of delayed jobs in a Redis sorted set and hands
// due jobs to exactly one claimer each. It is safe for concurrent use, and
// any number of Brokers (in any number of processes) may share a schedule.
type Broker struct {
	rdb   redis.UniversalClient
	opts  BrokerOptions
	keys  keys
	ups   int // score units per second: 1 or 1000
	log   *slog.Logger
	repl  replication
	state *stateMarker

	noticeDenied sync.Once // a refused notice is logged once
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
	// retry's backoff does not move. RunAt is this claim's own due time.
	Due time.Time
	// LeaseUntil is the lease deadline by Redis' clock. After it, recovery
	// may take the job back and void Token.
	LeaseUntil time.Time

	state string // the schedule's state marker when claimed
	mdue  string // the occurrence's due score when it rides in the in-flight member
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
	k, err := deriveKeys(opts.Key, isCluster(rdb))
	if err != nil {
		return nil, err
	}
	ups := 1
	if opts.ScoreUnit == time.Millisecond {
		ups = 1000
	}
	b := &Broker{rdb: rdb, opts: opts, keys: k, ups: ups, log: opts.Logger,
		repl:  replication{opts.WaitReplicas, opts.WaitTimeout},
		state: &stateMarker{rdb: rdb, key: k.marker, log: opts.Logger, what: "the schedule's keys (" + k.schedule + ")"}}
	ctx := context.Background()
	if err := checkServer(ctx, rdb, k.schedule, opts.AllowEviction, true, b.log); err != nil {
		return nil, err
	}
	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	b.state.check(sctx)
	return b, nil
}

// Key returns the schedule key.
func (b *Broker) Key() string { return b.keys.schedule }

// Lease returns the lease a claim gets.
func (b *Broker) Lease() time.Duration { return b.opts.Lease }

// score encodes t as a score, rounded up to the millisecond so that a job
// never comes due before t. (Not from UnixNano, which wraps after 2262: a
// year-9999 "never" would come due at once.)
func (b *Broker) score(t time.Time) string {
	ms := t.UnixMilli() // rounded down, before 1970 too
	if t.Nanosecond()%1e6 > 0 {
		ms++
	}
	if b.ups == 1000 {
		return strconv.FormatInt(ms, 10)
	}
	return strconv.FormatFloat(float64(ms)/1000, 'f', -1, 64)
}

// scoreTime decodes a score (as Redis formats it) to a time. A score
// further out than a time.Time of Unix µs holds (±292,000 years; +inf,
// -inf) saturates to the furthest one.
func (b *Broker) scoreTime(s string) time.Time {
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || math.IsNaN(f) {
		return time.Time{}
	}
	us := f * float64(1e6/b.ups)
	switch {
	case us >= math.MaxInt64: // 2^63 as a float64
		return time.UnixMicro(math.MaxInt64)
	case us <= math.MinInt64:
		return time.UnixMicro(math.MinInt64)
	}
	return time.UnixMicro(int64(math.Round(us)))
}

// maxScoreMs bounds the times a score holds to the millisecond: 100,000
// years either side of 1970. A score in seconds with a fraction is a
// double, whose spacing passes half a millisecond at 2^42 s (139,000 years).
const maxScoreMs = 100_000 * 36525 * 24 * 3600 * 1000 / 100

// inScoreRange reports whether t is within maxScoreMs of 1970 (checked in
// seconds first: UnixMilli wraps for times beyond ±292 million years).
func inScoreRange(t time.Time) bool {
	s := t.Unix()
	return s > -maxScoreMs/1000 && s < maxScoreMs/1000
}

// seconds converts a span in seconds to a Duration, saturating instead of
// wrapping beyond ±292 years.
func seconds(s float64) time.Duration {
	d := s * float64(time.Second)
	switch {
	case d >= math.MaxInt64:
		return math.MaxInt64
	case d <= math.MinInt64:
		return math.MinInt64
	}
	return time.Duration(d)
}

// dueTime decodes an occurrence's due score to the nearest millisecond,
// saturating as scoreTime does.
func (b *Broker) dueTime(s string) time.Time {
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || math.IsNaN(f) {
		return time.Time{}
	}
	ms := math.Round(f * float64(1000/b.ups))
	switch {
	case ms >= math.MaxInt64/1000:
		return time.UnixMicro(math.MaxInt64)
	case ms <= math.MinInt64/1000:
		return time.UnixMicro(math.MinInt64)
	}
	return time.UnixMilli(int64(ms))
}

// validateJob checks one job against the documented limits.
func validateJob(j *Job) error {
	switch {
	case j.ID == "":
		return ErrEmptyID
	case len(j.ID) > MaxIDLen:
		return ErrIDTooLong
	case j.RunAt.IsZero():
		return ErrNoRunAt
	case !inScoreRange(j.RunAt):
		return ErrRunAtRange
	case len(j.Type)+len(j.Queue)+len(j.Payload) > MaxPayloadLen:
		return ErrPayloadTooLarge
	}
	return nil
}

// Schedule adds jobs to the schedule, each due at its RunAt (a time in the
// past is due at once). A job whose id is already scheduled is replaced:
// its due time and payload become the new ones. A job whose id is in flight
// gets a new run beside the one in flight, which it does not disturb.
//
// The whole call is validated before anything is written: one bad job
// (a *JobError: an empty or long id, a zero RunAt or one further from 1970
// than a score holds, a large payload) and nothing is scheduled. Jobs are
// written in chunks of MaxBatchSize, in order, each atomically; a call that
// fails while writing (out of memory, a lost connection) returns a
// *ScheduleError that tells how many of the jobs were written.
func (b *Broker) Schedule(ctx context.Context, jobs ...Job) error {
	if err := ctx.Err(); err != nil {
		return wrap(ctx, "schedule", err, nil)
	}
	last := make(map[string]int, len(jobs))
	for i := range jobs {
		if err := validateJob(&jobs[i]); err != nil {
			return &JobError{Index: i, ID: jobs[i].ID, Err: err}
		}
		last[jobs[i].ID] = i
	}
	args := make([]any, 0, 1+3*min(len(jobs), MaxBatchSize))
	written := 0 // jobs[:written] are on the schedule
	// flush writes the chunk in args, which ends with jobs[upTo-1].
	flush := func(upTo int) error {
		if len(args) > 1 {
			res, err := b.repl.run(ctx, b.rdb, scheduleScript, []string{b.keys.schedule, b.keys.pending}, args...).Int64Slice()
			args = args[:1]
			if err != nil {
				return &ScheduleError{Written: written, Total: len(jobs), Err: wrap(ctx, "schedule", err, b.keys.types)}
			}
			if len(res) == 2 && res[1] == 1 {
				b.noticeDenied.Do(func() {
					b.log.LogAttrs(ctx, slog.LevelWarn, "zclaim: the server refused to publish the schedule's notice (an ACL without the channel); dispatchers find new jobs within their MaxWait instead",
						slog.String("key", b.keys.schedule), slog.String("channel", b.keys.notice))
				})
			}
		}
		written = upTo
		return nil
	}
	args = append(args, b.keys.notice)
	for i, j := range jobs {
		if last[j.ID] != i {
			continue // a later job in this call replaces it
		}
		score := b.score(j.RunAt)
		args = append(args, j.ID, score, newRecord(score, &j))
		if len(args) > 3*MaxBatchSize {
			if err := flush(i + 1); err != nil {
				return err
			}
		}
	}
	return flush(len(jobs))
}

// Cancel removes a scheduled job. It reports whether the id was scheduled.
// A run of the id that is already in flight is not affected.
func (b *Broker) Cancel(ctx context.Context, id string) (bool, error) {
	if err := checkID(ctx, "cancel", id); err != nil {
		return false, err
	}
	n, err := b.repl.run(ctx, b.rdb, cancelScript, []string{b.keys.schedule, b.keys.pending}, id).Int()
	if err != nil {
		return false, wrap(ctx, "cancel", err, b.keys.types)
	}
	return n == 1, nil
}

func checkID(ctx context.Context, op, id string) error {
	if err := ctx.Err(); err != nil {
		return wrap(ctx, op, err, nil)
	}
	if id == "" {
		return fmt.Errorf("zclaim: %s: %w", op, ErrEmptyID)
	}
	if len(id) > MaxIDLen {
		return fmt.Errorf("zclaim: %s: %w", op, ErrIDTooLong)
	}
	return nil
}

// Claim atomically takes up to max jobs that are due by Redis' clock and
// leases them to the caller for BrokerOptions.Lease. Each claim carries a
// fresh fencing token. Nothing due returns an empty slice and no error.
// max must be positive; values above MaxBatchSize are capped.
//
// Finish each claim with Ack, Retry or Kill, and Extend it while working
// past its lease. A claim that is never settled comes back through Recover.
func (b *Broker) Claim(ctx context.Context, max int) ([]Claim, error) {
	r, err := b.claim(ctx, max, leasePerJob)
	return r.claims, err
}

// claimResult is one claim script's answer.
type claimResult struct {
	claims []Claim
	now    time.Time     // Redis TIME when the script ran
	wait   time.Duration // until the earliest remaining job is due (by Redis' clock)
	next   bool          // whether any job remains scheduled

	// Of a batch claim only:
	lease   batchLease
	index   []int          // each claim's place in the batch, from 1
	corrupt []corruptClaim // the caller settles these as dead
}

// corruptClaim is a job of a batch claim whose record could not be decoded.
type corruptClaim struct {
	c     Claim
	index int // place in the batch, from 1
	err   error
}

// claimMode is how a claim leases what it takes (claim.lua's ARGV[4]).
type claimMode string

const (
	// leasePerJob gives each claim its own in-flight entry (Broker.Claim).
	leasePerJob claimMode = ""
	// leaseBatch gives the claims one lease, settled with finishBatches
	// (the dispatcher's way: per-job leases cost more than the enqueue
	// they cover).
	leaseBatch claimMode = "batch"
	// leaseBatchIDs is leaseBatch without the jobs' due times: the claims'
	// RunAt is left zero, and Redis need not format a score per job.
	leaseBatchIDs claimMode = "batch-ids"
)

// claim runs claim.lua in mode.
func (b *Broker) claim(ctx context.Context, max int, mode claimMode) (claimResult, error) {
	batch := mode != leasePerJob
	if err := ctx.Err(); err != nil {
		return claimResult{}, wrap(ctx, "claim", err, nil)
	}
	if max <= 0 {
		return claimResult{}, fmt.Errorf("zclaim: claim: %w: max must be positive, not %d", ErrInvalidArgument, max)
	}
	max = min(max, MaxBatchSize)
	raw, err := b.repl.run(ctx, b.rdb, claimScript,
		[]string{b.keys.schedule, b.keys.inflight, b.keys.tokens, b.keys.pending, b.keys.runs, b.keys.batches},
		max, b.opts.Lease.Milliseconds(), b.ups, string(mode)).Slice()
	if err != nil {
		return claimResult{}, wrap(ctx, "claim", err, b.keys.types)
	}
	// The claimed jobs, from either form of reply.
	type claimed struct{ id, score, rec string }
	var jobs []claimed
	switch {
	case len(raw) == 4:
	case len(raw) == 6 && batch:
		blob, _ := raw[4].(string)
		scores, _ := raw[5].(string) // false (nil) for leaseBatchIDs
		jobs = make([]claimed, 0, max)
		for blob != "" {
			var j claimed
			var err error
			if j.id, blob, err = lenPrefixed(blob); err == nil {
				j.rec, blob, err = lenPrefixed(blob)
			}
			if err != nil {
				return claimResult{}, fmt.Errorf("zclaim: claim: %w: batch reply: %v", ErrCorrupt, err)
			}
			j.score, scores, _ = strings.Cut(scores, " ")
			jobs = append(jobs, j)
		}
	case len(raw) == 6:
		due, _ := raw[4].([]any)
		recs, _ := raw[5].([]any)
		if len(due) != 2*len(recs) {
			return claimResult{}, fmt.Errorf("zclaim: claim: %w: %d ids and scores for %d records", ErrCorrupt, len(due), len(recs))
		}
		jobs = make([]claimed, len(recs))
		for i := range jobs {
			jobs[i].id, _ = due[2*i].(string)
			jobs[i].score, _ = due[2*i+1].(string)
			jobs[i].rec, _ = recs[i].(string) // "" for none: a record is never empty
		}
	default:
		return claimResult{}, fmt.Errorf("zclaim: claim: %w: reply of %d values", ErrCorrupt, len(raw))
	}
	deadline, _ := raw[0].(int64)
	first, _ := raw[1].(int64)
	var res claimResult
	nowStr, _ := raw[2].(string)
	res.now = b.scoreTime(nowStr)
	if next, ok := raw[3].(string); ok {
		now, _ := strconv.ParseFloat(nowStr, 64)
		nf, _ := strconv.ParseFloat(next, 64)
		res.next = true
		res.wait = max0(seconds((nf - now) / float64(b.ups)))
	}
	n := len(jobs)
	if n == 0 {
		return res, nil
	}
	res.claims = make([]Claim, 0, n)
	state := b.state.current()
	if batch {
		res.lease = batchLease{first: first, n: n}
		res.index = make([]int, 0, n)
	}
	for i, j := range jobs {
		c := Claim{
			Job:        Job{ID: j.id},
			Token:      first + int64(i),
			Attempt:    1,
			LeaseUntil: time.UnixMilli(deadline),
			state:      state,
		}
		if j.score != "" {
			c.RunAt = b.scoreTime(j.score)
		}
		var a int
		var due string
		var err error
		if j.rec == "" && !batch { // no record: the due rides in the member
			due, c.mdue = j.score, j.score
		} else {
			a, due, err = decodeRecord(j.rec, &c.Job)
		}
		switch {
		case err != nil && batch:
			res.corrupt = append(res.corrupt, corruptClaim{c, i + 1, err})
			continue
		case err != nil:
			b.buryCorrupt(ctx, c, err)
			continue
		}
		c.Attempt = a + 1
		c.Due = b.dueTime(due)
		res.claims = append(res.claims, c)
		if batch {
			res.index = append(res.index, i+1)
		}
	}
	return res, nil
}

// batchLease names the lease of a batch claim: the token of its first job
// and the number of jobs.
type batchLease struct {
	first int64
	n     int
}

func (l batchLease) member() string { return strconv.FormatInt(l.first, 10) + ":" + strconv.Itoa(l.n) }

// batchEnd is how a batch claim ended: every job is done but those in
// retry (back to the schedule after a delay) and dead (with a reason),
// keyed by their place in the batch (from 1).
type batchEnd struct {
	lease batchLease
	retry map[int]time.Duration
	dead  map[int]string
}

// finishBatches settles batch claims, each as one, in one round trip. It
// returns those whose lease was no longer held (recovery took them; nothing
// changed for those).
func (b *Broker) finishBatches(ctx context.Context, ends ...batchEnd) ([]batchEnd, error) {
	if len(ends) == 0 {
		return nil, nil
	}
	args := []any{b.ups, b.opts.MaxAttempts, b.keys.notice}
	for _, e := range ends {
		args = append(args, e.lease.member(), len(e.retry)+len(e.dead))
		for x, d := range e.retry {
			args = append(args, x, "r", strconv.FormatInt(d.Milliseconds(), 10))
		}
		for x, why := range e.dead {
			args = append(args, x, "d", why)
		}
	}
	res, err := b.repl.run(ctx, b.rdb, finishScript,
		[]string{b.keys.schedule, b.keys.batches, b.keys.pending, b.keys.runs, b.keys.dead, b.keys.deadInfo}, args...).Int64Slice()
	if err != nil {
		return nil, wrap(ctx, "finish", err, b.keys.types)
	}
	return notHeld(res, ends), nil
}

// notHeld returns the xs whose script result is 0: their lease or token was
// no longer held.
func notHeld[T any](res []int64, xs []T) (lost []T) {
	for i, n := range res {
		if n == 0 && i < len(xs) {
			lost = append(lost, xs[i])
		}
	}
	return lost
}

// buryCorrupt sends a claim whose record cannot be decoded to the dead set,
// where it can be inspected; it is not handed out.
func (b *Broker) buryCorrupt(ctx context.Context, c Claim, cause error) {
	b.log.LogAttrs(ctx, slog.LevelError, "zclaim: job record is corrupt; moved to the dead set",
		slog.String("key", b.keys.schedule), slog.String("id", c.ID), slog.String("error", cause.Error()))
	if err := b.Kill(context.WithoutCancel(ctx), c, "corrupt record: "+cause.Error()); err != nil {
		b.log.LogAttrs(ctx, slog.LevelError, "zclaim: could not move a corrupt job to the dead set",
			slog.String("id", c.ID), slog.String("error", err.Error()))
	}
}

// ms rounds d up to whole milliseconds, at least 1; unlike adding 999µs
// first, it does not wrap around near the largest Duration.
func ms(d time.Duration) int64 {
	m := d.Milliseconds()
	if d%time.Millisecond > 0 {
		m++
	}
	return max(1, m)
}

func max0(d time.Duration) time.Duration {
	if d < 0 {
		return 0
	}
	return d
}

func checkClaim(ctx context.Context, op string, c Claim) error {
	if err := checkID(ctx, op, c.ID); err != nil {
		return err
	}
	if c.Token <= 0 {
		return fmt.Errorf("zclaim: %s: %w: claim without a token", op, ErrInvalidArgument)
	}
	return nil
}

// Ack finishes a claim: the job leaves the broker. It returns ErrLeaseLost,
// and changes nothing, when c's token is no longer current.
func (b *Broker) Ack(ctx context.Context, c Claim) error {
	lost, err := b.AckMany(ctx, c)
	if err != nil {
		return err
	}
	if len(lost) > 0 {
		return b.leaseLost(ctx, "ack", c)
	}
	return nil
}

// leaseLost is the error of an operation on claim c whose token was not
// current: ErrLeaseLost, and ErrStateLost too when the schedule's state
// was lost since c was claimed (nobody else holds c: the server forgot it).
func (b *Broker) leaseLost(ctx context.Context, op string, c Claim) error {
	b.state.check(context.WithoutCancel(ctx))
	lost := c.state != "" && b.state.current() != c.state
	return &LeaseLostError{Op: op, ID: c.ID, StateLost: lost}
}

// AckMany acks several claims in one round trip. It returns the claims
// whose tokens were no longer current (nothing changed for those); the
// others are acked. An error means none was acked.
func (b *Broker) AckMany(ctx context.Context, cs ...Claim) (lost []Claim, err error) {
	if len(cs) == 0 {
		return nil, nil
	}
	args := make([]any, len(cs))
	for i, c := range cs {
		if err := checkClaim(ctx, "ack", c); err != nil {
			return nil, err
		}
		args[i] = c.member()
	}
	res, err := b.repl.run(ctx, b.rdb, ackScript, []string{b.keys.inflight, b.keys.runs}, args...).Int64Slice()
	if err != nil {
		return nil, wrap(ctx, "ack", err, b.keys.types)
	}
	return notHeld(res, cs), nil
}

// Extend moves c's lease deadline to d from now (by Redis' clock) and
// returns the claim with its new LeaseUntil. It returns ErrLeaseLost when
// c's token is no longer current. A lease that has passed but has not been
// recovered yet can still be extended: the token is what counts.
func (b *Broker) Extend(ctx context.Context, c Claim, d time.Duration) (Claim, error) {
	if err := checkClaim(ctx, "extend", c); err != nil {
		return c, err
	}
	if d <= 0 {
		return c, fmt.Errorf("zclaim: extend: %w: duration must be positive, not %v", ErrInvalidArgument, d)
	}
	deadline, err := b.repl.run(ctx, b.rdb, extendScript, []string{b.keys.inflight}, c.member(), ms(d)).Int64()
	if err != nil {
		return c, wrap(ctx, "extend", err, b.keys.types)
	}
	if deadline == 0 {
		return c, b.leaseLost(ctx, "extend", c)
	}
	c.LeaseUntil = time.UnixMilli(deadline)
	return c, nil
}

// Retry ends c's run and puts the job back on the schedule at at (or, for
// a zero at, after BrokerOptions.Backoff(c.Attempt) by Redis' clock). If c
// was the job's last attempt (MaxAttempts), the job goes to the dead set
// with the reason "attempts exhausted" instead. If the same id was
// scheduled again meanwhile, that newer entry stands for the work and is
// left as it is. It returns ErrLeaseLost when c's token is no longer current.
func (b *Broker) Retry(ctx context.Context, c Claim, at time.Time) error {
	if err := checkClaim(ctx, "retry", c); err != nil {
		return err
	}
	if !at.IsZero() && !inScoreRange(at) {
		return fmt.Errorf("zclaim: retry %s: %w: %w", c.ID, ErrInvalidArgument, ErrRunAtRange)
	}
	mode, when := "at", ""
	if at.IsZero() {
		mode, when = "in", strconv.FormatInt(b.opts.Backoff(c.Attempt).Milliseconds(), 10)
	} else {
		when = b.score(at)
	}
	n, err := b.repl.run(ctx, b.rdb, retryScript, b.settleKeys(), c.member(),
		mode, when, b.opts.MaxAttempts, b.ups, b.keys.notice).Int()
	if err != nil {
		return wrap(ctx, "retry", err, b.keys.types)
	}
	switch n {
	case 0:
		return b.leaseLost(ctx, "retry", c)
	case 2:
		b.log.LogAttrs(ctx, slog.LevelWarn, "zclaim: job attempts exhausted; moved to the dead set",
			slog.String("key", b.keys.schedule), slog.String("id", c.ID), slog.Int("attempt", c.Attempt))
	}
	return nil
}

func (b *Broker) settleKeys() []string {
	return []string{b.keys.schedule, b.keys.inflight, b.keys.pending, b.keys.runs, b.keys.dead, b.keys.deadInfo}
}

// Kill ends c's run and puts the job into the dead set with reason. It
// returns ErrLeaseLost when c's token is no longer current.
func (b *Broker) Kill(ctx context.Context, c Claim, reason string) error {
	if err := checkClaim(ctx, "kill", c); err != nil {
		return err
	}
	if reason == "" {
		reason = "killed"
	}
	n, err := b.repl.run(ctx, b.rdb, killScript, []string{b.keys.inflight, b.keys.runs, b.keys.dead, b.keys.deadInfo},
		c.member(), reason).Int()
	if err != nil {
		return wrap(ctx, "kill", err, b.keys.types)
	}
	if n == 0 {
		return b.leaseLost(ctx, "kill", c)
	}
	return nil
}

// Stats are counts of one schedule at one instant of Redis time.
type Stats struct {
	Scheduled int64     // jobs on the schedule
	Due       int64     // of those, due now
	Inflight  int64     // jobs claimed and not yet settled (those of a dispatcher's batch claims included)
	Expired   int64     // of those, past their lease and waiting for recovery
	Dead      int64     // jobs in the dead set
	Next      time.Time // due time of the earliest scheduled job; zero if none
	// StateLost is when this Broker last noticed that the server lost the
	// schedule's keys (restarted without persistence, flushed, failed over
	// to a replica that lacked them); zero if never. Counts read after a
	// loss describe what is left.
	StateLost time.Time
}

// Stats returns the schedule's counts.
func (b *Broker) Stats(ctx context.Context) (Stats, error) {
	if err := ctx.Err(); err != nil {
		return Stats{}, wrap(ctx, "stats", err, nil)
	}
	raw, err := statsScript.Run(ctx, b.rdb, []string{b.keys.schedule, b.keys.inflight, b.keys.dead, b.keys.batches, b.keys.runs}, b.ups).Slice()
	if err != nil {
		return Stats{}, wrap(ctx, "stats", err, b.keys.types)
	}
	if len(raw) != 7 {
		return Stats{}, fmt.Errorf("zclaim: stats: %w: reply of %d values", ErrCorrupt, len(raw))
	}
	if _, err := b.state.check(ctx); err != nil {
		return Stats{}, wrap(ctx, "stats", err, nil)
	}
	st := Stats{}
	st.StateLost, _ = b.state.lost()
	for i, p := range []*int64{&st.Scheduled, &st.Due, &st.Inflight, &st.Expired, &st.Dead} {
		*p, _ = raw[i].(int64)
	}
	if next, ok := raw[5].(string); ok {
		st.Next = b.scoreTime(next)
	}
	return st, nil
}

// DeadJob is an entry of the dead set.
type DeadJob struct {
	Job
	Due      time.Time // the due time of its occurrence (see JobInfo)
	Attempts int       // claims the job had
	Reason   string    // why it died: "lease expired", "attempts exhausted", or Kill's reason
	DiedAt   time.Time // by Redis' clock
	Err      error     // set when the stored record could not be decoded
}

// Dead lists up to max jobs of the dead set, oldest death first.
func (b *Broker) Dead(ctx context.Context, max int) ([]DeadJob, error) {
	if err := ctx.Err(); err != nil {
		return nil, wrap(ctx, "dead", err, nil)
	}
	if max <= 0 {
		return nil, fmt.Errorf("zclaim: dead: %w: max must be positive, not %d", ErrInvalidArgument, max)
	}
	raw, err := deadScript.Run(ctx, b.rdb, []string{b.keys.schedule, b.keys.pending, b.keys.dead, b.keys.deadInfo},
		"list", b.ups, b.keys.notice, max).Slice()
	if err != nil {
		return nil, wrap(ctx, "dead", err, b.keys.types)
	}
	out := make([]DeadJob, 0, len(raw)/3)
	for i := 0; i+2 < len(raw); i += 3 {
		id, _ := raw[i].(string)
		at, _ := raw[i+1].(string)
		ms, _ := strconv.ParseFloat(at, 64)
		d := DeadJob{Job: Job{ID: id}, DiedAt: time.UnixMilli(int64(ms))}
		if info, ok := raw[i+2].(string); ok {
			var due string
			d.Reason, d.Attempts, due, d.Err = decodeDeadInfo(info, &d.Job)
			d.Due = b.dueTime(due)
		}
		out = append(out, d)
	}
	return out, nil
}

// Revive puts dead jobs back on the schedule, due at once by Redis' clock,
// with the type, queue and payload they died with and a fresh count of
// attempts. An id that was scheduled again meanwhile keeps that entry (the
// newer work) and only leaves the dead set; ids that are not dead are
// passed over. It returns how many of ids were dead. The call is atomic.
func (b *Broker) Revive(ctx context.Context, ids ...string) (int, error) {
	return b.takeDead(ctx, "revive", ids)
}

// DeleteDead removes jobs from the dead set for good. It returns how many
// of ids were dead. The call is atomic.
func (b *Broker) DeleteDead(ctx context.Context, ids ...string) (int, error) {
	return b.takeDead(ctx, "delete", ids)
}

func (b *Broker) takeDead(ctx context.Context, op string, ids []string) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, wrap(ctx, op, err, nil)
	}
	args := make([]any, 0, 3+len(ids))
	args = append(args, op, b.ups, b.keys.notice)
	for _, id := range ids {
		if err := checkID(ctx, op, id); err != nil {
			return 0, err
		}
		args = append(args, id)
	}
	if len(ids) == 0 {
		return 0, nil
	}
	n, err := b.repl.run(ctx, b.rdb, deadScript, []string{b.keys.schedule, b.keys.pending, b.keys.dead, b.keys.deadInfo}, args...).Int()
	if err != nil {
		return 0, wrap(ctx, op, err, b.keys.types)
	}
	return n, nil
}
