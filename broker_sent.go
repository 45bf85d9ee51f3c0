package zclaim

// What became of a job after the Dispatcher handed it to asynq: the
// schedule remembers, for BrokerOptions.History, the queue and task id of
// each job it dispatched (finish.lua writes them in the call that settles
// the claim), and Jobs reads them back with asynq's own record of the
// task (its Inspector) and, with BrokerOptions.Runs, whether its run
// finished.
//
// The records live in hashes of one time bucket each (field = job id),
// History/24 long (at least a minute), each expiring History after its
// bucket ends: no index to trim and no pass that trims, and a lookup reads
// the buckets of the last History in one pipeline. A job dispatched again
// in the same bucket keeps its newest task there.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
)

// sentJob is one job's entry in a sent bucket: its id, and its task as
// "<queue>\x00<task id>".
type sentJob struct{ id, task string }

// sentBuckets is how many buckets History spans.
const sentBuckets = 24

// jobHistory is what a Broker keeps of the tasks its jobs became: how long
// (BrokerOptions.History; negative: nothing), and asynq's Inspector, made
// on first use, to read the tasks back.
type jobHistory struct {
	keep time.Duration
	once sync.Once
	insp *asynq.Inspector
}

// bucketLen is the length of a sent bucket.
func (h *jobHistory) bucketLen() time.Duration {
	return max(h.keep/sentBuckets, time.Minute)
}

// bucket names the bucket of time t (the key's suffix) and when it
// expires, in Unix ms.
func (h *jobHistory) bucket(t time.Time) (string, int64) {
	l := h.bucketLen().Milliseconds()
	n := t.UnixMilli() / l
	return strconv.FormatInt(n, 10), (n+1)*l + h.keep.Milliseconds()
}

// read returns the tasks job id (of shard k) became in the buckets of the
// last History (and the next bucket: another process's clock may run
// ahead), newest first, one per task id.
func (h *jobHistory) read(ctx context.Context, rdb redis.UniversalClient, k *keys, id string) ([]JobInfo, error) {
	if h.keep < 0 {
		return nil, nil
	}
	now := time.Now()
	l := h.bucketLen()
	cmds := make([]*redis.StringCmd, int(h.keep/l)+3)
	_, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i := range cmds {
			bucket, _ := h.bucket(now.Add(time.Duration(1-i) * l))
			cmds[i] = p.HGet(ctx, k.sent+bucket, id)
		}
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, wrap(ctx, "job", err, nil)
	}
	var out []JobInfo
	seen := map[string]bool{}
	for _, c := range cmds {
		v, err := c.Result()
		if err != nil {
			continue
		}
		parts := strings.SplitN(v, "\x00", 3)
		ms, perr := strconv.ParseInt(parts[0], 10, 64)
		if len(parts) != 3 || perr != nil || seen[parts[2]] {
			continue
		}
		seen[parts[2]] = true
		j := JobInfo{ID: id, State: StateEnqueued, Queue: parts[1], TaskID: parts[2], Enqueued: time.UnixMilli(ms)}
		if oid, due, ok := ParseOccurrence(j.TaskID); ok && oid == id {
			j.Due = due
		}
		out = append(out, j)
	}
	return out, nil
}

// taskState fills in asynq's record of j's task: its state, retries and
// last error ("" state when asynq no longer has it: completed past its
// retention, or deleted), and, with a Runs store, whether its run
// finished.
func (h *jobHistory) taskState(ctx context.Context, rdb redis.UniversalClient, runs *Idempotency, j *JobInfo) error {
	h.once.Do(func() { h.insp = asynq.NewInspectorFromRedisClient(rdb) })
	queue := j.Queue
	if queue == "" {
		queue = "default"
	}
	info, err := h.insp.GetTaskInfo(queue, j.TaskID)
	switch {
	case err == nil:
		j.TaskState, j.Retried, j.LastError = info.State.String(), info.Retried, info.LastErr
	case errors.Is(err, asynq.ErrTaskNotFound) || errors.Is(err, asynq.ErrQueueNotFound):
		info = nil
	default:
		return zerr("zclaim: job: asynq's task %q: %w", j.TaskID, err)
	}
	if runs != nil {
		if j.RunDone, err = runFinished(ctx, runs, j.TaskID); err != nil {
			return err
		}
		if v, err := runs.rdb.Get(ctx, runs.takeover.tookKey(j.TaskID)).Result(); err == nil {
			j.TakenOver = parseTook(v)
		} else if !errors.Is(err, redis.Nil) {
			return wrap(ctx, "job", err, nil)
		}
	}
	j.History = story(*j, info)
	return nil
}

// story tells what happened to enqueued occurrence j, oldest first, from
// what the schedule kept, asynq's record of its task (info, nil when
// asynq no longer has it) and the Runs store's.
func story(j JobInfo, info *asynq.TaskInfo) []Event {
	var h []Event
	add := func(at time.Time, what, detail string) {
		if !at.IsZero() {
			h = append(h, Event{At: at, What: what, Detail: detail})
		}
	}
	add(j.Due, "due", "")
	add(j.Enqueued, "enqueued", "task "+j.TaskID+" in queue "+j.Queue)
	if t := j.TakenOver; t != nil {
		add(t.At, "taken over", t.String())
	}
	if info != nil {
		failed := info.LastErr
		if info.Retried > 1 {
			failed = fmt.Sprintf("%s (the last of %d failures)", failed, info.Retried)
		}
		if info.State == asynq.TaskStateArchived {
			add(info.LastFailedAt, "archived", failed)
		} else {
			add(info.LastFailedAt, "failed", failed)
		}
		add(info.CompletedAt, "completed", "")
	}
	if j.RunDone && (info == nil || info.CompletedAt.IsZero()) {
		h = append(h, Event{At: time.Time{}, What: "finished", Detail: "the Runs store records the run as finished"})
	}
	// In the order things happen to a task; by time within a step (asynq
	// keeps its times to the second, so time alone would put a failure
	// in the second of its enqueue before the enqueue).
	slices.SortStableFunc(h, func(a, b Event) int {
		if c := stepOf[a.What] - stepOf[b.What]; c != 0 {
			return c
		}
		return a.At.Compare(b.At)
	})
	return h
}

// stepOf orders a History's steps.
var stepOf = map[string]int{"due": 0, "enqueued": 1, "failed": 2, "taken over": 2, "archived": 3, "completed": 3,
	"finished": 3}

// runFinished reports whether store i records key's run as finished
// (within its Retention).
func runFinished(ctx context.Context, i *Idempotency, key string) (bool, error) {
	bucket, field := i.doneOf(key)
	v, err := i.rdb.HGet(ctx, bucket, field).Int64()
	switch {
	case errors.Is(err, redis.Nil):
		return false, nil
	case err != nil:
		return false, wrap(ctx, "job", err, nil)
	}
	return time.UnixMilli(v).Add(i.opts.Retention).After(time.Now()), nil
}
