package zclaim

// Looking up a job, listing the schedule page by page, and moving
// scheduled jobs: run now, reschedule, cancel.

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// MaxListLimit bounds one page of Broker.List.
const MaxListLimit = MaxBatchSize

// ListOptions select one page of Broker.List.
type ListOptions struct {
	// After is the cursor a previous page returned in JobList.Next; ""
	// starts from the beginning.
	After string
	// Limit is the most jobs on the page, 1 to MaxListLimit. Default: 100.
	Limit int
}

// JobList is one page of a listing.
type JobList struct {
	Jobs []JobInfo
	// Next is the cursor of the page after this one, for ListOptions.After;
	// "" when this page is the last.
	Next string
}

// Job looks up a job by id. It returns an error matching ErrNotFound when
// the id is not scheduled, in flight or dead. An id can be in several
// places at once (a run in flight and a newer one scheduled, say): Job
// returns the run in flight first, then the scheduled one, then the dead
// entry; Jobs returns them all. Looking up scheduled and dead jobs costs
// O(log n); in-flight runs are found by a scan of the claims held at that
// instant. With BrokerOptions.Runs, a job found is returned whatever asynq
// queue could not be read (its entries on the schedule come first); a job
// not found while one could not be gets Runs' error rather than
// ErrNotFound: its run may be in that queue.
func (b *Broker) Job(ctx context.Context, id string) (JobInfo, error) {
	all, err := b.Jobs(ctx, id)
	var queueErr *QueueError
	if err != nil && (!errors.As(err, &queueErr) || len(all) == 0) {
		return JobInfo{}, err
	}
	if len(all) == 0 {
		return JobInfo{}, zerr("zclaim: job %q: %w", id, ErrNotFound)
	}
	return all[0], nil
}

// Jobs returns every entry of id, read at one instant: its runs in
// flight (lease deadline order), its scheduled run, its dead entry; then,
// with BrokerOptions.Runs, the runs of its asynq tasks that are active now
// (running, or abandoned by a dead worker). None is not an error. An asynq
// queue whose active tasks cannot be listed is passed over, as Runs
// passes over it: Jobs returns the entries it found with Runs' error
// (errors.As finds its *QueueError).
func (b *Broker) Jobs(ctx context.Context, id string) ([]JobInfo, error) {
	if err := checkID(ctx, "job", id); err != nil {
		return nil, err
	}
	k := b.shardOf(id)
	raw, err := replication{}.run(ctx, b.rdb, inspectScript, k.inspectKeys(), "job", id).Slice()
	if err != nil {
		return nil, wrap(ctx, "job", err, k.types)
	}
	jobs, _, err := b.decodeEntries(raw, false)
	if err != nil {
		return nil, err
	}
	out := make([]JobInfo, 0, len(jobs))
	for _, st := range []JobState{StateInFlight, StateScheduled, StateDead} {
		for _, j := range jobs {
			if j.State == st {
				out = append(out, j)
			}
		}
	}
	events, err := b.history.read(ctx, b.rdb, k, id)
	if err != nil {
		return out, err
	}
	for n := range out {
		out[n].History = scheduleStory(events, out[n].Due)
	}
	for _, j := range enqueued(id, events) {
		if err := b.history.taskState(ctx, b.rdb, b.opts.Runs, &j, events); err != nil {
			return out, err
		}
		out = append(out, j)
	}
	if b.opts.Runs == nil {
		return out, nil
	}
	runs, _, err := b.opts.Runs.Runs(ctx, "", 0)
	var queueErr *QueueError
	if err != nil && !errors.As(err, &queueErr) {
		return out, err
	}
	for _, r := range runs {
		if r.OfJob(id) {
			if j, ok := r.jobInfo(id); ok {
				var herr error
				if j.History, _, herr = runEvents(ctx, b.opts.Runs, r.Key); herr != nil {
					return out, herr
				}
				out = append(out, j)
			}
		}
	}
	return out, err // a queue passed over: the others' runs are here
}

// OfJob reports whether the run is one of job id's: a run of a task a
// Dispatcher sent for the job, or a run keyed by id itself that names no
// job (a task enqueued with id as its task id, say).
func (r RunInfo) OfJob(id string) bool {
	return r.Job.ID == id || r.Job.ID == "" && r.Key == id
}

// jobInfo describes a run of an active asynq task as an entry of job id:
// running or abandoned (taken over counts as abandoned until its task
// begins again). A finished run, or one not begun, is no entry.
func (r RunInfo) jobInfo(id string) (JobInfo, bool) {
	j := JobInfo{ID: id, Due: r.Job.Due, Attempt: r.Job.Attempt, Type: r.Type, Queue: r.Queue,
		LeaseUntil: r.LeaseUntil, Token: r.Token, TaskID: r.TaskID, Started: r.Started, TakenOver: r.TakenOver}
	switch r.State {
	case RunLive:
		j.State = StateRunning
	case RunAbandoned, RunTakenOver:
		j.State = StateAbandoned
	default:
		return JobInfo{}, false
	}
	return j, true
}

// List returns one page of the jobs in state: scheduled jobs by due time,
// in-flight runs by lease deadline (per-job claims, then the jobs of
// dispatchers' batch leases), dead jobs by time of death. Each page costs
// O(log n + page) at one instant; pages read at different instants may
// miss or repeat a job that moved between them.
func (b *Broker) List(ctx context.Context, state JobState, opts ListOptions) (JobList, error) {
	if err := ctx.Err(); err != nil {
		return JobList{}, wrap(ctx, "list", err, nil)
	}
	if opts.Limit == 0 {
		opts.Limit = 100
	}
	if opts.Limit < 1 || opts.Limit > MaxListLimit {
		return JobList{}, zerr("zclaim: list: %w: Limit must be between 1 and %d, not %d",
			ErrInvalidArgument, MaxListLimit, opts.Limit)
	}
	what := map[JobState]string{StateScheduled: "scheduled", StateInFlight: "inflight", StateDead: "dead"}[state]
	if what == "" {
		return JobList{}, zerr("zclaim: list: %w: no listing of state %v", ErrInvalidArgument, state)
	}
	c, err := parseCursor(opts.After, what)
	if err != nil {
		return JobList{}, err
	}
	// With Shards, shard after shard: the cursor names its shard.
	var out JobList
	for limit := opts.Limit; c.shard < len(b.shards); {
		k := b.shards[c.shard]
		raw, err := replication{}.run(ctx, b.rdb, inspectScript, k.inspectKeys(), what, c.score, c.member, limit,
			c.phase, c.listed).Slice()
		if err != nil {
			return JobList{}, wrap(ctx, "list", err, k.types)
		}
		jobs, next, err := b.decodeEntries(raw, true)
		if err != nil {
			return JobList{}, err
		}
		out.Jobs = append(out.Jobs, jobs...)
		limit -= len(jobs)
		if next.score != "" || next.phase == "b" {
			next.shard = c.shard
			out.Next = next.String(what)
			return out, nil
		}
		c = cursor{phase: "i", listed: "0", shard: c.shard + 1}
		if limit == 0 {
			if c.shard < len(b.shards) {
				out.Next = c.String(what)
			}
			return out, nil
		}
	}
	return out, nil
}

func (k *keys) inspectKeys() []string {
	return []string{k.schedule, k.pending, k.inflight, k.runs, k.batches, k.dead, k.deadInfo}
}

// decodeEntries turns inspect.lua's entries into JobInfos; a listing's
// reply ends with the next cursor.
func (b units) decodeEntries(raw []any, listing bool) ([]JobInfo, cursor, error) {
	next := cursor{}
	if listing {
		if len(raw) == 0 {
			return nil, next, zerr("zclaim: list: %w: empty reply", ErrCorrupt)
		}
		if c, ok := raw[len(raw)-1].([]any); ok && len(c) == 4 {
			for i, p := range []*string{&next.score, &next.member, &next.phase, &next.listed} {
				*p, _ = c[i].(string)
			}
		}
		raw = raw[:len(raw)-1]
	}
	if len(raw)%5 != 0 {
		return nil, next, zerr("zclaim: inspect: %w: reply of %d values", ErrCorrupt, len(raw))
	}
	jobs := make([]JobInfo, 0, len(raw)/5)
	for i := 0; i < len(raw); i += 5 {
		kind, _ := raw[i].(string)
		id, _ := raw[i+1].(string)
		score, _ := raw[i+2].(string)
		data, hasData := raw[i+3].(string)
		ref, _ := raw[i+4].(string)
		j := JobInfo{ID: id}
		var job Job
		var due string
		var err error
		switch kind {
		case "s":
			j.State, j.RunAt = StateScheduled, b.scoreTime(score)
			a := 0
			if hasData && data != "" {
				a, due, err = decodeRecord(data, &job)
			}
			j.Attempt = a + 1 // the attempt its next claim makes
			if due == "" {
				due = score
			}
		case "i", "b":
			j.State, j.LeaseUntil = StateInFlight, msTime(score)
			tok, mdue := ref, ""
			if kind == "b" {
				// "<first>:<n>#<index>": tokens run first, first+1, ...
				lease, idx, _ := strings.Cut(ref, "#")
				first, _, _ := strings.Cut(lease, ":")
				f, _ := strconv.ParseInt(first, 10, 64)
				k, _ := strconv.ParseInt(idx, 10, 64)
				j.Token = f + k - 1
			} else {
				_, tok, _ = strings.Cut(ref[len(id):], "|")
				tok, mdue, _ = strings.Cut(tok, "@")
				j.Token, _ = strconv.ParseInt(tok, 10, 64)
			}
			a := 0
			if hasData && data != "" {
				a, due, err = decodeRecord(data, &job)
			}
			j.Attempt = a + 1
			if due == "" {
				due = mdue
			}
		case "d":
			j.State, j.DiedAt = StateDead, msTime(score)
			if hasData {
				j.Reason, j.Attempt, due, err = decodeDeadInfo(data, &job)
			}
		default:
			return nil, next, zerr("zclaim: inspect: %w: entry kind %q", ErrCorrupt, kind)
		}
		if err != nil {
			j.Err = fmt.Errorf("zclaim: job %q: %w", id, err)
		}
		if due != "" {
			j.Due = b.dueTime(due)
		}
		j.Type, j.Queue, j.PayloadSize = job.Type, job.Queue, len(job.Payload)
		jobs = append(jobs, j)
	}
	return jobs, next, nil
}

// msTime reads a score in Unix ms.
func msTime(s string) time.Time {
	f, _ := strconv.ParseFloat(s, 64)
	return time.UnixMilli(int64(f))
}

// cursor is a position in a listing: the last job listed, by its score
// and member, and for in-flight runs the phase ("i" per-job claims, "b"
// batch leases) and how many jobs of the cursor's lease were listed; with
// Shards, in which shard. As text:
// "<what>:<phase>:<listed>:<score>:<member>", and "<what>@<shard>:..."
// past shard 0.
type cursor struct {
	score, member, phase, listed string
	shard                        int
}

func (c cursor) String(what string) string {
	if c.score == "" && c.phase != "b" && c.shard == 0 {
		return ""
	}
	if c.shard > 0 {
		what += "@" + strconv.Itoa(c.shard)
	}
	return strings.Join([]string{what, c.phase, c.listed, c.score, c.member}, ":")
}

func parseCursor(s, what string) (cursor, error) {
	c := cursor{phase: "i", listed: "0"}
	if s == "" {
		return c, nil
	}
	p := strings.SplitN(s, ":", 5)
	bad := zerr("zclaim: list: %w: %q is not a cursor of a %s listing", ErrInvalidArgument, s, what)
	if len(p) != 5 {
		return cursor{}, bad
	}
	name, shard, sharded := strings.Cut(p[0], "@")
	if name != what {
		return cursor{}, bad
	}
	if sharded {
		n, err := strconv.Atoi(shard)
		if err != nil || n < 1 {
			return cursor{}, bad
		}
		c.shard = n
	}
	if _, err := strconv.ParseFloat(p[3], 64); err != nil && p[3] != "" {
		return cursor{}, bad
	}
	c.phase, c.listed, c.score, c.member = p[1], p[2], p[3], p[4]
	if c.phase == "" {
		c.phase = "i"
	}
	return c, nil
}

// MaxDueBuckets is the most buckets one DueCounts call counts.
const MaxDueBuckets = 1000

// DueCounts counts the scheduled jobs due in each of n buckets of width
// step from start: counts[i] holds those due at or after start+i·step and
// before start+(i+1)·step. It sends one ZCOUNT (O(log n)) per bucket and
// shard, in one pipeline. n is 1 to MaxDueBuckets; step at least 1ms.
func (b *Broker) DueCounts(ctx context.Context, start time.Time, step time.Duration, n int) ([]int64, error) {
	if err := ctx.Err(); err != nil {
		return nil, wrap(ctx, "due counts", err, nil)
	}
	if n < 1 || n > MaxDueBuckets || step < time.Millisecond {
		return nil, zerr("zclaim: due counts: %w: n must be between 1 and %d and step at least 1ms, not %d and %v",
			ErrInvalidArgument, MaxDueBuckets, n, step)
	}
	bounds := make([]string, n+1)
	for i := range bounds {
		bounds[i] = b.score(start.Add(time.Duration(i) * step))
	}
	cmds := make([]*redis.IntCmd, 0, n*len(b.shards))
	_, err := b.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, k := range b.shards {
			for i := range n {
				cmds = append(cmds, p.ZCount(ctx, k.schedule, bounds[i], "("+bounds[i+1]))
			}
		}
		return nil
	})
	if err != nil {
		return nil, wrap(ctx, "due counts", err, b.keys.types)
	}
	counts := make([]int64, n)
	for j, c := range cmds {
		counts[j%n] += c.Val()
	}
	return counts, nil
}
