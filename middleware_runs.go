package zclaim

// Runs: what the takeover's view of asynq's active tasks and the run
// records shows the console, the command line and the metrics.

import (
	"context"
	"errors"
	"slices"
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
	RunTakenOver RunState = "taken over" // a live process put its task back on its queue; no run has begun it since
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
	// TakenOver is set when a live process took the task's run over from
	// a dead worker (kept for the store's Retention).
	TakenOver *Takeover `json:",omitempty"`
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
// alone. A queue whose active tasks cannot be listed (its keys of another
// type, say) is passed over: Runs returns the other queues' runs with an
// error that joins a *QueueError for each such queue, in name order
// (errors.As finds the first).
func (i *Idempotency) Runs(ctx context.Context, after string, limit int) (runs []RunInfo, next string, err error) {
	all, err := i.takeover.activeRuns(ctx, asynq.NewInspectorFromRedisClient(i.asynqRedis()))
	var queueErr *QueueError
	if err != nil && !errors.As(err, &queueErr) {
		return nil, "", wrap(ctx, "runs", err, nil)
	}
	partial := err // a queue passed over, returned with the others' runs
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
		return nil, "", partial
	}
	cmds, now, err := i.takeover.records(ctx, active)
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
	if err := takenOver(ctx, i, runs); err != nil {
		return nil, "", wrap(ctx, "runs", err, nil)
	}
	return runs, next, partial
}

// takenOver fills in the Takeover of each run that has one, from the
// runs' histories, in one round trip.
func takenOver(ctx context.Context, i *Idempotency, runs []RunInfo) error {
	if len(runs) == 0 {
		return nil
	}
	cmds := make([]*redis.StringCmd, len(runs))
	_, err := i.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for n, r := range runs {
			bucket, field := i.doneOf(r.Key)
			cmds[n] = p.HGet(ctx, historyOf(bucket, i.opts.Prefix), field)
		}
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) && !isReplyErr(err) {
		return err
	}
	for n := range runs {
		if v, err := cmds[n].Result(); err == nil {
			_, runs[n].TakenOver = runStory(parseEvents(v, nil))
		}
	}
	return nil
}
