package zclaim

// Claims: taking due jobs off the schedule (claim.lua), one lease per batch
// (or, in an older version's form, per job), and settling batch leases as
// one (finish.lua; Broker.Claim's job by job: part.lua, broker_lease.go).

import (
	"context"
	"log/slog"
	"strconv"
	"strings"
	"time"
)

// Claim atomically takes up to max jobs that are due by Redis' clock and
// leases them to the caller for BrokerOptions.Lease. Each claim carries a
// fresh fencing token. Nothing due returns an empty slice and no error.
// max must be positive; values above MaxBatchSize are capped.
//
// Finish each claim with Ack, Retry or Kill, and Extend it while working
// past its lease. A claim that is never settled comes back through Recover.
// The claims of one call (from one shard) share one lease, which Extend of
// any of them moves, and are settled each on its own: recovery of their
// expired lease takes back only those not settled.
//
// With Shards, a call takes jobs from one shard after another, starting
// from the shard after the one the last call started from, until it has
// max or has asked every shard once.
func (b *Broker) Claim(ctx context.Context, max int) ([]Claim, error) {
	if len(b.shards) == 1 {
		return b.claimLeased(ctx, b.shards[0], max)
	}
	start := int(b.nextShard.Add(1))
	var out []Claim
	for i := range b.shards {
		cs, err := b.claimLeased(ctx, b.shards[(start+i)%len(b.shards)], max-len(out))
		if err != nil {
			return out, err
		}
		out = append(out, cs...)
		if len(out) >= max {
			break
		}
	}
	return out, nil
}

// claimLeased takes up to max due jobs of shard k under one batch lease,
// which Ack, Extend, Retry and Kill settle job by job (part.lua): a lease
// per job would cost Redis an in-flight member and a run record each.
// A job whose record cannot be decoded goes to the dead set.
func (b *Broker) claimLeased(ctx context.Context, k *keys, max int) ([]Claim, error) {
	r, err := b.claim(ctx, k, max, leaseBatch)
	for i := range r.claims {
		r.claims[i].lease = r.lease
	}
	for _, cc := range r.corrupt {
		cc.c.lease = r.lease
		b.buryCorrupt(ctx, cc.c, cc.err)
	}
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
	until   int64          // the lease's deadline, Unix ms by Redis' clock
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
	// leasePerJob gives each claim its own in-flight entry. Broker.Claim
	// shares a batch lease among its claims instead; entries of this form
	// (an older version's claims) are still settled and recovered.
	leasePerJob claimMode = ""
	// leaseBatch gives the claims one lease, settled with finishBatches
	// (the dispatcher's way: per-job leases cost more than the enqueue
	// they cover).
	leaseBatch claimMode = "batch"
	// leaseBatchIDs is leaseBatch without the jobs' due times: the claims'
	// RunAt is left zero, and Redis need not format a score per job.
	leaseBatchIDs claimMode = "batch-ids"
)

// claim runs claim.lua on shard k in mode.
func (b *Broker) claim(ctx context.Context, k *keys, max int, mode claimMode) (claimResult, error) {
	return b.claimInto(ctx, k, max, mode, nil, b.opts.Lease, false)
}

// claimInto is claim, with its claims in into's array where they fit (a
// dispatcher's claim stage reuses one array: its claims are copied on),
// under a lease of lease; dispatch marks a batch lease as a dispatcher's,
// whose jobs recovery puts back due at once (claim.lua's ARGV[5]).
func (b *Broker) claimInto(ctx context.Context, k *keys, max int, mode claimMode, into []Claim,
	lease time.Duration, dispatch bool) (claimResult, error) {
	batch := mode != leasePerJob
	if err := ctx.Err(); err != nil {
		return claimResult{}, wrap(ctx, "claim", err, nil)
	}
	if max <= 0 {
		return claimResult{}, zerr("zclaim: claim: %w: max must be positive, not %d", ErrInvalidArgument, max)
	}
	max = min(max, MaxBatchSize)
	raw, err := b.repl.run(ctx, b.rdb, claimScript,
		[]string{k.schedule, k.inflight, k.tokens, k.pending, k.runs, k.batches},
		max, lease.Milliseconds(), b.ups, string(mode), dispatchArg(dispatch)).Slice()
	if err != nil {
		return claimResult{}, wrap(ctx, "claim", err, k.types)
	}
	jobs, err := claimedJobs(raw, batch, max)
	if err != nil {
		return claimResult{}, err
	}
	// Whether this shard has nothing in flight: an idle claim says so; a
	// claim that took jobs has put some there.
	quiet := len(raw) == 5 && raw[4] == int64(0)
	b.quietShards[k.shard].Store(quiet)
	if len(jobs) > 0 {
		b.state.poll() // working: the state is checked at most once per interval
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
	if res.claims = into[:0]; cap(into) < n {
		res.claims = make([]Claim, 0, n)
	}
	state := b.state.current()
	if batch {
		res.lease, res.until = batchLease{first: first, n: n, shard: k.shard}, deadline
		res.index = make([]int, 0, n)
	}
	for i, j := range jobs {
		c := Claim{
			Job:        Job{ID: j.id},
			Token:      first + int64(i),
			Attempt:    1,
			LeaseUntil: time.UnixMilli(deadline),
			state:      state,
			shard:      k.shard,
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
			c.place, c.at = i+1, j.at
			res.corrupt = append(res.corrupt, corruptClaim{c, i + 1, err})
			continue
		case err != nil:
			b.buryCorrupt(ctx, c, err)
			continue
		}
		c.Attempt = a + 1
		c.Due = b.dueTime(due)
		if j.recScore {
			c.RunAt = b.scoreTime(due)
		}
		if batch {
			c.place, c.at = i+1, j.at
			res.index = append(res.index, i+1)
		}
		res.claims = append(res.claims, c)
	}
	return res, nil
}

// dispatchArg is claim.lua's ARGV[5]: "dispatch" for a dispatcher's claim.
func dispatchArg(dispatch bool) string {
	if dispatch {
		return "dispatch"
	}
	return ""
}

// batchEnd is how a batch claim ended: every job is done but those in
// retry (back to the schedule after a delay) and dead (with a reason),
// keyed by their place in the batch (from 1).
type batchEnd struct {
	lease batchLease
	retry map[int]time.Duration
	dead  map[int]string
	sent  []sentJob // by index in the batch: the asynq task each job became (BrokerOptions.History)
}

// finishBatches settles batch claims, each as one, in one round trip. It
// returns those whose lease was no longer held (recovery took them; nothing
// changed for those).
func (b *Broker) finishBatches(ctx context.Context, ends ...batchEnd) ([]batchEnd, error) {
	if len(ends) == 0 {
		return nil, nil
	}
	// The ends of each shard, settled in one call per shard, the shards
	// in one pipeline.
	var shards []*keys
	byShard := map[int][]batchEnd{}
	for _, e := range ends {
		if byShard[e.lease.shard] == nil {
			shards = append(shards, b.shards[e.lease.shard])
		}
		byShard[e.lease.shard] = append(byShard[e.lease.shard], e)
	}
	bucket, expire := b.history.bucket(time.Now())
	cmds := b.writeShards(ctx, finishScript, shards, func(k *keys) ([]string, []any) {
		args := []any{b.ups, b.opts.MaxAttempts, b.notice(k), 0, expire}
		for _, e := range byShard[k.shard] {
			for _, s := range e.sent {
				if s.id != "" {
					args = append(args, s.id, s.event)
				}
			}
		}
		args[3] = (len(args) - 5) / 2
		for _, e := range byShard[k.shard] {
			args = append(args, e.lease.member(), len(e.retry)+len(e.dead))
			for x, d := range e.retry {
				args = append(args, x, "r", strconv.FormatInt(d.Milliseconds(), 10))
			}
			for x, why := range e.dead {
				args = append(args, x, "d", why)
			}
		}
		keys := []string{k.schedule, k.batches, k.pending, k.runs, k.dead, k.deadInfo}
		if b.history.keep > 0 {
			keys = append(keys, k.sent+bucket)
		}
		return keys, args
	})
	var lost []batchEnd
	for i, cmd := range cmds {
		res, err := cmd.Int64Slice()
		if err != nil {
			return lost, wrap(ctx, "finish", err, shards[i].types)
		}
		lost = append(lost, notHeld(res, byShard[shards[i].shard])...)
	}
	return lost, nil
}

// buryCorrupt sends a claim whose record cannot be decoded to the dead set,
// where it can be inspected; it is not handed out.
func (b *Broker) buryCorrupt(ctx context.Context, c Claim, cause error) {
	b.log.LogAttrs(ctx, slog.LevelError, "zclaim: job record is corrupt; moved to the dead set",
		slog.String("key", b.shards[c.shard].schedule), slog.String("id", short(c.ID)),
		slog.String("error", cause.Error()))
	if err := b.Kill(context.WithoutCancel(ctx), c, "corrupt record: "+cause.Error()); err != nil {
		b.log.LogAttrs(ctx, slog.LevelError, "zclaim: could not move a corrupt job to the dead set",
			slog.String("id", short(c.ID)), slog.String("error", err.Error()))
	}
}

// claimed is one job of a claim script's reply. recScore: its score is
// its record's due (a first attempt in a lazy claim, see claim.lua).
type claimed struct {
	id, score, rec string
	recScore       bool
	at             int // a batch claim's: where its entry starts in the jobs, from 1
}

// claimedJobs reads the jobs of a claim script's reply, in either form.
func claimedJobs(raw []any, batch bool, max int) (jobs []claimed, err error) {
	switch {
	case len(raw) == 4 || len(raw) == 5:
	case len(raw) == 6 && batch:
		blob, _ := raw[4].(string)
		scores, scored := raw[5].(string) // false (nil) for leaseBatchIDs
		jobs = make([]claimed, 0, max)
		size := len(blob)
		for blob != "" {
			j := claimed{at: size - len(blob) + 1}
			if j.id, blob, err = lenPrefixed(blob); err == nil {
				j.rec, blob, err = lenPrefixed(blob)
			}
			if err != nil {
				return nil, zerr("zclaim: claim: %w: batch reply: %v", ErrCorrupt, err)
			}
			j.score, scores, _ = strings.Cut(scores, " ")
			j.recScore = scored && j.score == "" // a lazy claim's: the record gives it
			jobs = append(jobs, j)
		}
	case len(raw) == 7 && !batch:
		ids, _ := raw[4].([]any)
		recs, _ := raw[5].([]any)
		asked, _ := raw[6].([]any)
		if len(ids) != len(recs) || len(asked)%2 != 0 {
			return nil, zerr("zclaim: claim: %w: %d ids, %d records, %d asked", ErrCorrupt, len(ids), len(recs), len(asked))
		}
		jobs = make([]claimed, len(recs))
		for i := range jobs {
			jobs[i].id, _ = ids[i].(string)
			jobs[i].rec, _ = recs[i].(string)
			jobs[i].recScore = true
		}
		for k := 0; k < len(asked); k += 2 {
			at, _ := asked[k].(int64)
			if at < 1 || int(at) > len(jobs) {
				return nil, zerr("zclaim: claim: %w: asked score of job %d of %d", ErrCorrupt, at, len(jobs))
			}
			j := &jobs[at-1]
			j.score, _ = asked[k+1].(string)
			j.recScore = false
		}
	case len(raw) == 6:
		due, _ := raw[4].([]any)
		recs, _ := raw[5].([]any) // empty when no job has a record
		if len(due)%2 != 0 || len(recs) != 0 && len(due) != 2*len(recs) {
			return nil, zerr("zclaim: claim: %w: %d ids and scores for %d records", ErrCorrupt, len(due), len(recs))
		}
		jobs = make([]claimed, len(due)/2)
		for i := range jobs {
			jobs[i].id, _ = due[2*i].(string)
			jobs[i].score, _ = due[2*i+1].(string)
			if len(recs) > 0 {
				jobs[i].rec, _ = recs[i].(string) // "" for none: a record is never empty
			}
		}
	default:
		return nil, zerr("zclaim: claim: %w: reply of %d values", ErrCorrupt, len(raw))
	}
	return jobs, nil
}
