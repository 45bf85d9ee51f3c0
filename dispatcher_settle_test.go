package zclaim

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/zclaim/zclaim/internal/logbuf"
)

// A dispatcher keeps the lease of a batch whose enqueue outlasts it while
// its other enqueues go on: one job's enqueue takes two leases, jobs due
// one after another keep the other workers enqueueing, and nothing goes
// back. Without renewals, recovery would give the slow job back after its
// first lease, and its next dispatch would be held again and come back
// again. A renewal needs an enqueue to end within each third of a lease:
// an attempt whose other enqueues took longer, or whose process paused a
// quarter of a lease (a loaded machine), starts over on a rig of its own,
// up to 3 attempts.
func TestDispatcherKeepsLeasesWhileEnqueuesGoOn(t *testing.T) {
	t.Parallel()
	const lease = time.Second
	startOver(t, 3, func(int) (fault, excuse string) {
		longest := pauses()
		st, requeued, slow := keptWhileEnqueuesGoOn(t, lease)
		paused := longest()
		if st.Conflicts == 0 && st.Failed == 0 && requeued == 0 {
			t.Logf("dispatcher: %+v", st)
			return "", ""
		}
		fault = fmt.Sprintf("stats %+v, %d jobs recovered: want no job back, none enqueued twice", st, requeued)
		switch {
		case slow > 0:
			return fault, fmt.Sprintf("%d enqueues slower than %v", slow, lease/3)
		case paused >= lease/4:
			return fault, fmt.Sprintf("the test process paused %v", paused)
		}
		return fault, ""
	})
}

// keptWhileEnqueuesGoOn runs one attempt of
// TestDispatcherKeepsLeasesWhileEnqueuesGoOn: the dispatcher's stats once
// every job ran (or one came back), how many jobs recovery gave back, and
// how many commands of the asynq client took longer than a third of the
// lease, but for the one held on purpose.
func keptWhileEnqueuesGoOn(t *testing.T, lease time.Duration) (DispatcherStats, int, int64) {
	r := newLeaseRig(t, lease)
	r.warm(t, 4)
	r.via.AddHook(holdTask{mark: "slow-", d: 2 * lease})
	slow := &slowCalls{d: lease / 3} // inside holdTask: it times what follows the hold
	r.via.AddHook(slow)
	d := r.dispatcher(t, 4)
	now := redisNow(t, r.b.rdb)
	jobs := r.jobs(1, "slow-")
	for i, j := range r.jobs(20, "steady-") { // one due every eighth of a lease, over 2.5 leases
		j.RunAt = now.Add(time.Duration(i) * lease / 8)
		jobs = append(jobs, j)
	}
	must(t, r.b.Schedule(ctx, jobs...))
	stop := runDispatcher(t, d)
	defer stop()
	// Until every job ran and the schedule is empty, or a job came back
	// (without renewals, the slow job would come back after every
	// dispatch).
	waitFor(t, 20*time.Second, "every job to run once, or one to come back", func() bool {
		st, err := r.b.Stats(ctx)
		return r.b.RecoveryStats().Requeued > 0 ||
			err == nil && st.Scheduled == 0 && st.Inflight == 0 && r.log.total() == len(jobs)
	})
	if requeued := r.b.RecoveryStats().Requeued; requeued > 0 {
		return d.Stats(), requeued, slow.n.Load()
	}
	waitEachRanOnce(t, r.log, r.b, jobs, 20*time.Second)
	return d.Stats(), 0, slow.n.Load()
}

// holdTask holds a client's commands that name a task whose id holds mark
// for d before sending them: an enqueue into asynq that takes d.
type holdTask struct {
	mark string
	d    time.Duration
}

func (h holdTask) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h holdTask) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		for _, a := range cmd.Args() {
			if s, ok := a.(string); ok && strings.Contains(s, h.mark) {
				time.Sleep(h.d)
				break
			}
		}
		return next(ctx, cmd)
	}
}

func (h holdTask) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// The keeper renews a batch's lease once a third of it has passed, and,
// while its jobs are being enqueued, only if an enqueue ended since its
// claim or its last renewal; when the lease was lost (recovery took the
// batch back), the batch's jobs still waiting are not enqueued; a batch
// whose every job is dispatched is renewed until the acker is done with it.
func TestKeeperRenewsOnProgress(t *testing.T) {
	t.Parallel()
	const lease = time.Minute // no lease runs out but those the test ends
	b := newBroker(t, BrokerOptions{Lease: lease})
	d, err := NewDispatcher(b, newAsynqClient(t, testAddr), DispatcherOptions{Concurrency: 1})
	must(t, err)
	p := d.newPipeline(nil)
	q := testQueue(t)
	jobs := jobsDue(2, "keep-", time.Now().Add(-time.Second))
	for i := range jobs {
		jobs[i].Queue = q
	}
	first := claimQueued(t, p, jobs...)[0]
	run := first.run
	score := func() int64 {
		s, err := b.rdb.ZScore(ctx, b.keys.batches, run.end.lease.member()).Result()
		if err == redis.Nil {
			return 0
		}
		must(t, err)
		return int64(s)
	}
	claimed := run.until.Load()
	if claimed == 0 || score() != claimed {
		t.Fatalf("claimed lease: deadline %d, on Redis %d", claimed, score())
	}

	p.renew(lease) // under a third of the lease since the claim: not due
	run.renewed = run.renewed.Add(-lease / 3)
	p.renew(lease) // due, but no enqueue ended since the claim
	if got := run.until.Load(); got != claimed || score() != claimed {
		t.Fatalf("renewed without progress: deadline %d, on Redis %d, claimed %d", got, score(), claimed)
	}
	time.Sleep(2 * time.Millisecond) // a later deadline, by Redis' millisecond clock
	p.ended.Add(1)
	p.renew(lease)
	renewed := run.until.Load()
	if renewed <= claimed || score() != renewed {
		t.Fatalf("renewed after progress: deadline %d, on Redis %d, claimed %d", renewed, score(), claimed)
	}

	// Recovery takes the batch back (its deadline set in the past, as if
	// the dispatcher had stalled); the next renewal finds it lost, and the
	// job still waiting is not enqueued.
	must(t, b.rdb.ZAdd(ctx, b.keys.batches, redis.Z{Score: 1, Member: run.end.lease.member()}).Err())
	rec, err := b.Recover(ctx)
	must(t, err)
	if rec.Requeued != 2 {
		t.Fatalf("recovered %+v, want the batch's 2 jobs back", rec)
	}
	run.renewed = run.renewed.Add(-lease / 3)
	p.ended.Add(1)
	p.renew(lease)
	if got := run.until.Load(); got != 0 {
		t.Fatalf("after recovery: deadline %d, want 0 (lost)", got)
	}
	p.dispatch(ctx, first)
	if st := d.Stats(); st.Enqueued != 0 || st.Failed != 1 || len(run.end.retry) != 1 {
		t.Fatalf("dispatch of a lost batch's job: stats %+v, retries %v: want it given back, not enqueued",
			st, run.end.retry)
	}

	// A batch whose every job is dispatched waits for the acker's settle:
	// renewed without progress, until the acker is done with it.
	last := claimQueued(t, p, Job{ID: "keep-last", RunAt: time.Now().Add(-time.Second), Type: "t", Queue: q})[0].run
	last.left.Store(0)
	last.renewed = last.renewed.Add(-lease / 3)
	claimed = last.until.Load()
	time.Sleep(2 * time.Millisecond)
	p.renew(lease)
	if got := last.until.Load(); got <= claimed {
		t.Fatalf("a dispatched batch awaiting its settle: deadline %d, claimed %d: want it renewed", got, claimed)
	}
	if n := len(p.kept.runs); n != 1 {
		t.Fatalf("%d batches kept, want 1: the lost batch let go", n)
	}
	last.closed.Store(true)
	p.renew(lease)
	if n := len(p.kept.runs); n != 0 {
		t.Fatalf("%d batches kept after the acker was done with the last", n)
	}
}

// claimQueued schedules jobs (due already) on p's broker, claims them as
// one batch into p's queue as the claim stage does, and takes them off it.
func claimQueued(t *testing.T, p *pipeline, jobs ...Job) []queued {
	t.Helper()
	b := p.d.b
	must(t, b.Schedule(ctx, jobs...))
	res, err := b.claimInto(ctx, b.shards[0], len(jobs), leaseBatchIDs, nil, p.d.opts.Lease, true)
	must(t, err)
	if len(res.claims) != len(jobs) {
		t.Fatalf("claimed %d of %d jobs", len(res.claims), len(jobs))
	}
	p.enqueueClaims(ctx, res)
	qs := make([]queued, len(jobs))
	for i := range qs {
		qs[i] = <-p.queue
	}
	return qs
}

// A renewal that fails (the broker's Redis went away) changes nothing:
// the batch keeps its deadline and is not taken for lost, the failure is
// logged once per cause per 10 s, and the next pass, with Redis back,
// renews it.
func TestKeeperRidesOutARedisAway(t *testing.T) {
	t.Parallel()
	const lease = time.Minute
	px := newProxy(t, testAddr)
	b, err := NewBroker(clientVia(t, px), BrokerOptions{Key: testKey(t), Lease: lease})
	must(t, err)
	var logs logbuf.Buffer
	d, err := NewDispatcher(b, newAsynqClient(t, testAddr), DispatcherOptions{Concurrency: 1,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	must(t, err)
	p := d.newPipeline(nil)
	run := claimQueued(t, p, Job{ID: "away", RunAt: time.Now().Add(-time.Second), Type: "t"})[0].run
	claimed := run.until.Load()
	run.renewed = run.renewed.Add(-lease / 3)
	p.ended.Add(1)

	px.SetDown(true)
	for range 2 {
		p.renew(lease)
	}
	if got := run.until.Load(); got != claimed {
		t.Fatalf("after failed renewals: deadline %d, want %d as claimed", got, claimed)
	}
	if n := strings.Count(logs.String(), "renewing the leases of dispatched batches failed"); n != 1 {
		t.Fatalf("%d warnings for two failed renewals, want 1:\n%s", n, logs.String())
	}

	px.SetDown(false)
	time.Sleep(2 * time.Millisecond) // a later deadline, by Redis' millisecond clock
	p.renew(lease)
	if got := run.until.Load(); got <= claimed {
		t.Fatalf("with Redis back: deadline %d, claimed %d: want it renewed", got, claimed)
	}
}
