package zclaim

// Runs: what the takeover's view of asynq's active tasks and the run
// records shows the console, the command line and the metrics.

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
)

// RunState is where a run of an asynq task that is active now stands.
type RunState string

// The states of a run.
const (
	RunLive      RunState = "running"    // its lease is being renewed
	RunAbandoned RunState = "abandoned"  // its worker is gone (see RunInfo.State); a takeover will start it again
	RunTakenOver RunState = "taken over" // a live process enqueued a copy, which has not begun yet
	RunFinished  RunState = "finished"   // the task is still active in asynq (its worker died), but the work is done
	RunNone      RunState = "no record"  // active in asynq, no run record (not yet begun, released, or expired), its worker not known to be gone
)

// RunInfo is a run of an asynq task that is active now, as the
// idempotency store's records and asynq's active lists tell it.
type RunInfo struct {
	Key string // the idempotency key
	// State is where the run stands. A run is abandoned when its lease ran
	// out, or, for a task whose run never began (no record, Token 0) or was
	// released after a failure that leaves the task retries, when asynq's
	// server stopped renewing its own lease of the task (two renewals
	// missed, or the lease ran out): its worker died before the
	// middleware's Begin, or before asynq recorded the failure.
	// A task of a type no middleware handles is started again by asynq's
	// recovery instead.
	State      RunState
	Token      int64     `json:",omitzero"` // the run's fencing token
	Started    time.Time `json:",omitzero"` // when the run began, by Redis' clock (from its token)
	LeaseUntil time.Time `json:",omitzero"` // running or abandoned: the lease deadline by Redis' clock
	Queue      string    // the asynq task's queue
	TaskID     string    // the asynq task's id
	Type       string    // the asynq task's type
	Job        JobInfo   `json:",omitzero"` // the job, for a task a Dispatcher sent
}

// Runs returns the runs of the asynq tasks that are active now in the
// takeover's queues (IdempotencyOptions.TakeoverQueues, else every queue):
// live, abandoned (its worker died: a takeover will start it again), taken
// over, finished while asynq still holds the dead worker's task, or with
// no record while its worker is not known to be gone. They
// are read from Redis, ordered by queue and task id, after the run whose
// queue and task id after names ("queue/taskid"; "" for the first), at
// most limit (0: all). next is the cursor of the page after, "" at the end.
// Under a custom Key function, tasks of a type the store's middleware found
// keyed from the handler's context are left out, and those of a type it
// has not handled are listed under the key the function tells of the task
// alone.
func (i *Idempotency) Runs(ctx context.Context, after string, limit int) (runs []RunInfo, next string, err error) {
	all, err := i.activeRuns(ctx, asynq.NewInspectorFromRedisClient(i.asynqRedis()))
	if err != nil {
		return nil, "", wrap(ctx, "runs", err, nil)
	}
	var active []activeRun
	for _, r := range all {
		if r.task.Queue+"/"+r.task.ID > after {
			active = append(active, r)
		}
	}
	slices.SortFunc(active, func(a, b activeRun) int {
		return strings.Compare(a.task.Queue+"/"+a.task.ID, b.task.Queue+"/"+b.task.ID)
	})
	if limit > 0 && len(active) > limit {
		active = active[:limit]
		next = active[limit-1].task.Queue + "/" + active[limit-1].task.ID
	}
	if len(active) == 0 {
		return nil, "", nil
	}
	cmds, now, err := i.records(ctx, active)
	if err != nil {
		return nil, "", wrap(ctx, "runs", err, nil)
	}
	for n, r := range active {
		ri := RunInfo{Key: r.key, State: RunNone, Queue: r.task.Queue, TaskID: r.task.ID, Type: r.task.Type}
		if r.has {
			ri.Job = r.job
		}
		rec, err := cmds[n].Result()
		if errors.Is(err, redis.Nil) && r.gone {
			ri.State = RunAbandoned // a task whose run never began
		}
		if err == nil {
			if state, tok, until, ok := parseRecord(rec); ok {
				if tok > 0 {
					ri.Token = tok
					ri.Started = time.UnixMicro(tok)
				}
				switch state {
				case "run":
					ri.LeaseUntil = time.UnixMilli(until)
					ri.State = RunLive
					if !ri.LeaseUntil.After(now) {
						ri.State = RunAbandoned
					}
				case "take":
					ri.State = RunTakenOver
				case "done":
					ri.State = RunFinished
				case "free":
					if !finalRelease(r, until) && r.gone {
						ri.State = RunAbandoned
					}
				}
			}
		}
		runs = append(runs, ri)
	}
	return runs, next, nil
}

// asynq's server leases each task it holds for asynqLease and renews the
// leases of all its tasks every asynqBeat (asynq v0.24 and later; both
// fixed in asynq). A lease last renewed more than asynqGone ago belongs to
// a server that missed two renewals: its process is gone (or stalled so
// long that a takeover is due: the middleware's Begin still lets only one
// run of the key go on).
const (
	asynqLease = 30 * time.Second
	asynqBeat  = 5 * time.Second
	asynqGone  = 2*asynqBeat + 2*time.Second
)

// workersGone marks the runs whose worker is gone: asynq's lease of the
// task ran out (IsOrphaned), or, for a run whose record does not tell
// whether its worker lives (cmds[n] holds none, or a "free" or "take"
// one), its server last renewed the lease more than asynqGone ago, as the
// lease's deadline tells (Unix seconds, by the worker's clock, which
// asynq's recoverer and IsOrphaned compare with their own too), and no
// live asynq server lists the task among its workers' (asynqHeld: a
// worker whose clock runs behind this process's is not taken for dead).
// The deadlines are read from asynq's lease sets in one pipeline, only
// when such runs have a lease that has not run out, and the servers'
// lists only when one of those looks stale; what cannot be read leaves
// its run to IsOrphaned.
func (i *Idempotency) workersGone(ctx context.Context, runs []activeRun, cmds []*redis.StringCmd) {
	var ask []int
	for n := range runs {
		rec, err := cmds[n].Result()
		undecided := errors.Is(err, redis.Nil)
		if state, _, _, ok := parseRecord(rec); err == nil && ok {
			undecided = state == "free" || state == "take"
		}
		runs[n].gone = runs[n].task.IsOrphaned
		if undecided && !runs[n].task.IsOrphaned {
			ask = append(ask, n)
		}
	}
	if len(ask) == 0 {
		return
	}
	scores := make([]*redis.FloatCmd, len(ask))
	_, _ = i.asynqRedis().Pipelined(ctx, func(p redis.Pipeliner) error {
		for k, n := range ask {
			t := runs[n].task
			scores[k] = p.ZScore(ctx, "asynq:{"+t.Queue+"}:lease", t.ID)
		}
		return nil
	})
	renewedBy := time.Now().Add(asynqLease - asynqGone)
	var stale []int
	for k, n := range ask {
		if deadline, err := scores[k].Result(); err == nil && deadline < float64(renewedBy.Unix()) {
			stale = append(stale, n)
		}
	}
	if len(stale) == 0 {
		return
	}
	held, err := i.asynqHeld(ctx)
	if err != nil {
		return
	}
	for _, n := range stale {
		runs[n].gone = !held[runs[n].task.ID]
	}
}

// asynqHeld returns the ids of the tasks that the workers of asynq's live
// servers hold. At each beat a server writes them as the fields of a hash
// of its own (asynq:workers:{host:pid:id}, listed in asynq:workers), which
// expires two beats later by Redis' clock: a task a live server listed is
// not taken for its worker's, whatever the clocks of the two processes
// say of its lease. The list's scores are deadlines by the servers'
// clocks; entries that ran out more than ten minutes ago by this one's are
// left out (a killed server's entry stays there).
func (i *Idempotency) asynqHeld(ctx context.Context) (map[string]bool, error) {
	rdb := i.asynqRedis()
	since := strconv.FormatInt(time.Now().Add(-10*time.Minute).Unix(), 10)
	keys, err := rdb.ZRangeByScore(ctx, "asynq:workers", &redis.ZRangeBy{Min: since, Max: "+inf"}).Result()
	if err != nil {
		return nil, err
	}
	fields := make([]*redis.StringSliceCmd, len(keys))
	if _, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for k, key := range keys {
			fields[k] = p.HKeys(ctx, key)
		}
		return nil
	}); err != nil {
		return nil, err
	}
	held := map[string]bool{}
	for _, f := range fields {
		for _, id := range f.Val() {
			held[id] = true
		}
	}
	return held, nil
}
