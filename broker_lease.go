package zclaim

// Settling a claim by its fencing token: Ack, Extend, Retry, Kill.

import (
	"context"
	"log/slog"
	"slices"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

func checkClaim(ctx context.Context, op string, c Claim) error {
	if err := checkID(ctx, op, c.ID); err != nil {
		return err
	}
	if c.Token <= 0 {
		return zerr("zclaim: %s: %w: claim without a token", op, ErrInvalidArgument)
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
// others are acked. A claim given twice is acked once, and both copies
// are returned when it was lost. An error means none was acked (with Shards, or claims
// of several Claim calls: none of the shard or the call whose script
// failed; the others' may have been).
func (b *Broker) AckMany(ctx context.Context, cs ...Claim) (lost []Claim, err error) {
	if len(cs) == 0 {
		return nil, nil
	}
	for _, c := range cs {
		if err := checkClaim(ctx, "ack", c); err != nil {
			return nil, err
		}
	}
	var shards []*keys
	byShard := map[int][]Claim{}
	var leases []batchLease
	byLease := map[batchLease][]Claim{}
	// A claim of a shared lease given twice is acked once; its copies
	// share its outcome.
	type spot struct {
		lease batchLease
		place int
	}
	seen := map[spot]bool{}
	var copies []Claim
	for _, c := range cs {
		if c.lease.n > 0 {
			if seen[spot{c.lease, c.place}] {
				copies = append(copies, c)
				continue
			}
			seen[spot{c.lease, c.place}] = true
			if byLease[c.lease] == nil {
				leases = append(leases, c.lease)
			}
			byLease[c.lease] = append(byLease[c.lease], c)
			continue
		}
		k := b.claimKeys(c)
		if byShard[k.shard] == nil {
			shards = append(shards, k)
		}
		byShard[k.shard] = append(byShard[k.shard], c)
	}
	// One call a lease; several leases in one pipeline where writes wait
	// for no replica (as extendBatches).
	call := func(i int) (*redis.Script, []string, []any) { return b.partCall("ack", byLease[leases[i]]) }
	var cmds []*redis.Cmd
	if len(leases) > 1 && b.repl.n == 0 {
		cmds = pipelinedScripts(ctx, b.rdb, len(leases), call)
	} else {
		for i := range leases {
			s, keys, a := call(i)
			cmds = append(cmds, b.repl.run(ctx, b.rdb, s, keys, a...))
		}
	}
	for i, cmd := range cmds {
		res, err := b.partResult(ctx, "ack", cmd, byLease[leases[i]])
		if err != nil {
			return lost, err
		}
		lost = append(lost, notHeld(res, byLease[leases[i]])...)
	}
	for _, c := range copies {
		if slices.ContainsFunc(lost, func(l Claim) bool { return l.lease == c.lease && l.place == c.place }) {
			lost = append(lost, c)
		}
	}
	if len(shards) == 0 {
		return lost, nil
	}
	cmds = b.writeShards(ctx, ackScript, shards, func(k *keys) ([]string, []any) {
		cs := byShard[k.shard]
		args := make([]any, 2*len(cs))
		for i, c := range cs {
			args[i], args[len(cs)+i] = c.member(), c.Token
		}
		return []string{k.inflight, k.runs}, args
	})
	for i, cmd := range cmds {
		res, err := cmd.Int64Slice()
		if err != nil {
			return lost, wrap(ctx, "ack", err, shards[i].types)
		}
		lost = append(lost, notHeld(res, byShard[shards[i].shard])...)
	}
	return lost, nil
}

// Extend moves c's lease deadline to d from now (by Redis' clock) and
// returns the claim with its new LeaseUntil. The lease of a claim of
// Claim is the one its call's claims share: those not settled yet move
// with it. It returns ErrLeaseLost when
// c's token is no longer current. A lease that has passed but has not been
// recovered yet can still be extended: the token is what counts.
func (b *Broker) Extend(ctx context.Context, c Claim, d time.Duration) (Claim, error) {
	if err := checkClaim(ctx, "extend", c); err != nil {
		return c, err
	}
	if d <= 0 {
		return c, zerr("zclaim: extend: %w: duration must be positive, not %v", ErrInvalidArgument, d)
	}
	var deadline int64
	if c.lease.n > 0 {
		res, err := b.part(ctx, "extend", []Claim{c}, ms(d))
		if err != nil {
			return c, err
		}
		deadline = res[0]
	} else {
		k := b.claimKeys(c)
		var err error
		deadline, err = b.repl.run(ctx, b.rdb, extendScript, []string{k.inflight}, c.member(), ms(d)).Int64()
		if err != nil {
			return c, wrap(ctx, "extend", err, k.types)
		}
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
		return zerr("zclaim: retry %s: %w: %w", c.ID, ErrInvalidArgument, ErrRunAtRange)
	}
	mode, when := "at", ""
	if at.IsZero() {
		mode, when = "in", strconv.FormatInt(b.opts.Backoff(c.Attempt).Milliseconds(), 10)
	} else {
		when = b.score(at)
	}
	k := b.claimKeys(c)
	var n int64
	if c.lease.n > 0 {
		res, err := b.part(ctx, "retry", []Claim{c}, mode, when, b.opts.MaxAttempts)
		if err != nil {
			return err
		}
		n = res[0]
	} else {
		var err error
		n, err = b.repl.run(ctx, b.rdb, retryScript, k.settleKeys(), c.member(),
			mode, when, b.opts.MaxAttempts, b.ups, b.notice(k)).Int64()
		if err != nil {
			return wrap(ctx, "retry", err, k.types)
		}
	}
	switch n {
	case 0:
		return b.leaseLost(ctx, "retry", c)
	case 2:
		b.log.LogAttrs(ctx, slog.LevelWarn, "zclaim: job attempts exhausted; moved to the dead set",
			slog.String("key", k.schedule), slog.String("id", short(c.ID)), slog.Int("attempt", c.Attempt))
	}
	return nil
}

// part settles claims cs, all of one batch lease, one by one (part.lua):
// op with its arguments (up to three: part.lua's ARGV[3..5]). It returns
// part.lua's value for each claim, 0 for one not held.
func (b *Broker) part(ctx context.Context, op string, cs []Claim, opArgs ...any) ([]int64, error) {
	s, keys, args := b.partCall(op, cs, opArgs...)
	return b.partResult(ctx, op, b.repl.run(ctx, b.rdb, s, keys, args...), cs)
}

// partCall is part's script call.
func (b *Broker) partCall(op string, cs []Claim, opArgs ...any) (*redis.Script, []string, []any) {
	k := b.claimKeys(Claim{shard: cs[0].lease.shard})
	args := make([]any, 0, 7+3*len(cs))
	args = append(args, op, cs[0].lease.member())
	args = append(args, opArgs...)
	for len(args) < 5 {
		args = append(args, "")
	}
	args = append(args, b.ups, b.notice(k))
	for _, c := range cs {
		args = append(args, c.place, c.at, c.ID)
	}
	return partScript, []string{k.schedule, k.pending, k.runs, k.dead, k.deadInfo, k.batches}, args
}

// partResult reads part.lua's reply for claims cs.
func (b *shardSet) partResult(ctx context.Context, op string, cmd *redis.Cmd, cs []Claim) ([]int64, error) {
	res, err := cmd.Int64Slice()
	if err != nil {
		return nil, wrap(ctx, op, err, b.claimKeys(Claim{shard: cs[0].lease.shard}).types)
	}
	if len(res) != len(cs) {
		return nil, zerr("zclaim: %s: %w: %d values for %d claims", op, ErrCorrupt, len(res), len(cs))
	}
	return res, nil
}

func (k *keys) settleKeys() []string {
	return []string{k.schedule, k.inflight, k.pending, k.runs, k.dead, k.deadInfo}
}

// claimKeys returns the keys of c's shard (shard 0 for a claim out of range:
// its token is then simply not held).
func (b *shardSet) claimKeys(c Claim) *keys {
	if c.shard < 0 || c.shard >= len(b.shards) {
		return b.shards[0]
	}
	return b.shards[c.shard]
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
	var n int64
	if c.lease.n > 0 {
		res, err := b.part(ctx, "kill", []Claim{c}, reason)
		if err != nil {
			return err
		}
		n = res[0]
	} else {
		k := b.claimKeys(c)
		var err error
		n, err = b.repl.run(ctx, b.rdb, killScript, []string{k.inflight, k.runs, k.dead, k.deadInfo},
			c.member(), reason).Int64()
		if err != nil {
			return wrap(ctx, "kill", err, k.types)
		}
	}
	if n == 0 {
		return b.leaseLost(ctx, "kill", c)
	}
	return nil
}

// extendBatches moves the deadlines of batch leases (a dispatcher's
// claims) to lease from now, by Redis' clock, in one round
// trip (one per lease where writes wait for replicas). It returns each
// lease's new deadline in Unix ms, or 0 for a lease no longer held
// (recovery took it back; nothing changed for it). After an error (and
// no deadlines) some leases may have been extended and others not:
// extending them all again is harmless.
func (b *shardSet) extendBatches(ctx context.Context, leases []batchLease, lease time.Duration) ([]int64, error) {
	call := func(i int) (*redis.Script, []string, []any) {
		l := leases[i]
		return extendScript, []string{b.shards[l.shard].batches}, []any{l.member(), lease.Milliseconds()}
	}
	cmds := make([]*redis.Cmd, len(leases))
	if len(leases) > 1 && b.repl.n == 0 {
		cmds = pipelinedScripts(ctx, b.rdb, len(leases), call)
	} else {
		for i := range leases {
			s, keys, a := call(i)
			cmds[i] = b.repl.run(ctx, b.rdb, s, keys, a...)
		}
	}
	deadlines := make([]int64, len(leases))
	for i, cmd := range cmds {
		d, err := cmd.Int64()
		if err != nil {
			return nil, wrap(ctx, "extend", err, b.shards[leases[i].shard].types)
		}
		deadlines[i] = d
	}
	return deadlines, nil
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
