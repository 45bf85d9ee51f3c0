package zclaim

// The dispatcher's claim stage: when to look at the schedule, how much to
// claim, and what to do when a claim fails.

import (
	"context"
	"log/slog"
	"time"
)

// claimUntil is the claim stage: it sleeps until the earliest due job (or
// a wake-up), waits for room in the queue, claims, and queues the claims,
// until ctx is done. With Shards it keeps each shard's next look (from its
// claim's reply) and claims the shards that are due, one after another; a
// wake-up makes it look at every shard.
func (p *pipeline) claimUntil(ctx context.Context) {
	d := p.d
	shards := d.b.shards
	p.timer = time.NewTimer(0)
	defer p.timer.Stop()
	backoff := time.Duration(0)
	need := 1                              // free queue places to wait for before claiming
	look := make([]time.Time, len(shards)) // when each shard is looked at next; zero: now
	for first := 0; ; first++ {
		select {
		case <-ctx.Done():
			return
		case <-p.timer.C:
		case <-p.wake:
			clear(look)
		}
		for lim := p.limit(); lim-int(p.out.Load()) < min(need, lim); lim = p.limit() {
			select {
			case <-ctx.Done():
				return
			case <-p.freed:
			}
		}
		now := time.Now()
		lim := p.limit()
		next := d.idleWait()
		need = 1
		took := false // a claim of this pass took jobs
		for n := range shards {
			i := (first + n) % len(shards)
			if look[i].After(now) {
				next = min(next, look[i].Sub(now))
				continue
			}
			room := max(0, lim-int(p.out.Load()))
			// Once a claim of this pass took jobs, the next shard waits for
			// room for a batch (half the queue's limit at most): the scraps
			// of room a claim leaves would make many small claims and
			// settles, each costing a script's fixed work. The next pass
			// begins with it.
			if room == 0 || took && room < min(d.b.opts.BatchSize, p.half(lim)) {
				next, need = 0, p.half(lim)
				first = i - 1 + len(shards)
				break
			}
			want := min(room, d.b.opts.BatchSize)
			res, err := d.b.claimInto(ctx, shards[i], want, p.mode, p.claims, d.opts.Lease, true)
			if err != nil {
				if ctx.Err() != nil {
					return
				}
				// A claim that keeps failing (a wrong key type, bad auth, a
				// server away) backs off to seconds, and says so once per
				// cause per claimWarnEvery.
				backoff = min(max(2*backoff, 10*time.Millisecond), claimBackoffMax)
				d.claimWarn.warn(ctx, d.log, err.Error(), "zclaim: dispatcher claim failed; backing off",
					slog.String("key", shards[i].schedule), slog.Duration("backoff", backoff),
					slog.String("error", err.Error()))
				look[i] = now.Add(backoff)
				next = min(next, backoff)
				continue
			}
			backoff = 0
			took = took || len(res.claims) > 0
			p.enqueueClaims(ctx, res)
			if res.claims != nil {
				p.claims = res.claims // enqueueClaims copied them: the next claim reuses the array
			}
			after, needHere := p.nextLook(res, want, lim)
			look[i] = now.Add(after)
			next, need = min(next, after), max(need, needHere)
		}
		resetTimer(p.timer, next)
	}
}

// enqueueClaims hands a claim's jobs to the workers (the queue has room:
// only the claim stage adds to it) and settles its corrupt records as dead.
func (p *pipeline) enqueueClaims(ctx context.Context, res claimResult) {
	d := p.d
	d.claimed.Add(int64(res.lease.n))
	if res.lease.n == 0 {
		return
	}
	claimedAt := time.Now()
	run := &batchRun{end: batchEnd{lease: res.lease}, renewed: claimedAt, mark: p.ended.Load()}
	if d.b.opts.History > 0 {
		run.end.sent = make([]sentJob, res.lease.n)
	}
	run.left.Store(int64(res.lease.n))
	run.until.Store(res.until)
	p.keeping(run)
	for _, bad := range res.corrupt {
		d.dead.Add(1)
		d.log.LogAttrs(ctx, slog.LevelError, "zclaim: job record is corrupt; moved to the dead set",
			slog.String("key", d.b.keys.schedule), slog.String("id", short(bad.c.ID)),
			slog.String("error", bad.err.Error()))
		run.settled(bad.index, outcome{dead: "corrupt record: " + bad.err.Error()}, p.acks)
	}
	p.out.Add(int64(len(res.claims)))
	for k, c := range res.claims {
		p.queue <- queued{c, run, res.index[k], res.now, claimedAt}
	}
}

// nextLook returns when the claim stage looks at a shard again after
// claim res (of want jobs, the queue's limit lim), and how many free
// queue places it waits for first.
func (p *pipeline) nextLook(res claimResult, want, lim int) (after time.Duration, need int) {
	switch {
	case len(res.claims) == want:
		// A full batch: more may be due. Claim again once half the queue
		// is free, so that claims stay batched under load.
		return 0, p.half(lim)
	case !res.next:
		return p.d.idleWait(), 1
	case res.wait == 0 && len(res.claims) == 0:
		// Due by a hair less than the clock's resolution: do not spin.
		return 500 * time.Microsecond, 1
	}
	return min(res.wait, p.d.idleWait()), 1
}

// idleWait is the longest the claim stage sleeps when no job is due
// sooner: MaxWait, or at least a second where the server publishes
// keyspace events for the schedule (a ZADD by any program wakes it then).
func (d *Dispatcher) idleWait() time.Duration {
	if d.keyspace.Load() {
		return max(d.opts.MaxWait, time.Second)
	}
	return d.opts.MaxWait
}

// claimBackoffMax caps the backoff of a claim that keeps failing.
const claimBackoffMax = 5 * time.Second

// limit is how many claims may be out (queued or being enqueued) now: a
// claim per worker, and as many more as the workers enqueue in a quarter
// of the lease at the pace of the recent enqueues (all the queue while
// they are quick), so that a claim waits for a worker a quarter of its
// lease at most and its batch is settled in time. Until an enqueue has
// ended, a claim per worker.
func (p *pipeline) limit() int {
	conc, most := p.d.opts.Concurrency, cap(p.queue)
	took := p.d.enqueueTime.get()
	if took <= 0 {
		return conc
	}
	rounds := p.d.opts.Lease / 4 / took // of Concurrency enqueues, in a quarter of the lease
	if rounds >= time.Duration(most) {
		return most
	}
	return min(most, conc*(1+int(rounds)))
}

// half is half the queue a limit of lim leaves beside a claim per worker
// (one at least): the room the claim stage waits for after a full batch.
func (p *pipeline) half(lim int) int { return max(1, (lim-p.d.opts.Concurrency)/2) }
