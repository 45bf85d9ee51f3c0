package zclaim

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
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

// Stats returns the middleware's counts.
func (i *Idempotency) Stats() IdempotencyStats {
	return IdempotencyStats{Skipped: i.skipped.Load(), InProgress: i.inProgress.Load(),
		Completed: i.completed.Load(), Released: i.released.Load(), LeaseLost: i.leaseLost.Load(),
		StateLost: i.stateLosses(),
		Takeovers: i.takeovers.Load(), AdapterOff: i.adapter.off.Load()}
}

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
	i.guards.sendLate = i.completeNow
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

func (i *Idempotency) stateLosses() int64 {
	_, n := i.state.lost()
	return n
}

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
