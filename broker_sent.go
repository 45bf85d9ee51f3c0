package zclaim

// What happened to a job on the schedule's side: the scripts of each step
// (schedule.lua, the dispatcher's finish.lua, recover.lua) add an event to
// the job id's history (history.lua) as they run: scheduled, enqueued
// (with when its batch was claimed, and the task it became), back on the
// schedule, dead. Jobs reads them back, with asynq's own record of the
// task (its Inspector) and, with BrokerOptions.Runs, the store's history
// of its run.
//
// The histories live in hashes of one time bucket each, History/24 long
// (at least a minute), each expiring History after its bucket ends: no
// index to trim and no pass that trims, and a lookup reads the buckets of
// the last History in one pipeline. A job's "scheduled" and "enqueued"
// events are fields of their own ("<id>\x00s", "<id>\x00e": the newest of
// the bucket, written without a read), its rarer ones one field that
// keeps them all ("<id>").

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
)

// sentJob is a job the dispatcher enqueued: its id, and its "enqueued"
// event for finish.lua (enqueuedEvent).
type sentJob struct{ id, event string }

// enqueuedEvent is the "enqueued" event (history.lua's form) of a job due
// at due, claimed at claimed and enqueued at enqueued (Redis' clock as the
// Dispatcher reads it: the settle that writes the event comes later) as
// task of queue; its detail is
// "<claimed ms>\x00<enqueued ms>\x00<queue>\x00<task>".
func enqueuedEvent(due, claimed, enqueued time.Time, queue, task string) string {
	at := strconv.FormatInt(enqueued.UnixMilli(), 10)
	return at + "\x1fe\x1f" + strconv.FormatInt(due.UnixMilli(), 10) + "\x1f" +
		strconv.FormatInt(claimed.UnixMilli(), 10) + "\x00" + at + "\x00" + queue + "\x00" + task + "\x1e"
}

// enqueuedParts reads an "enqueued" event's detail: when its job was
// claimed and enqueued, its queue and task.
func enqueuedParts(r rawEvent) (claimed, enqueued time.Time, queue, task string, ok bool) {
	f := strings.SplitN(r.detail, "\x00", 4)
	if r.kind != 'e' || len(f) != 4 {
		return
	}
	c, err1 := strconv.ParseInt(f[0], 10, 64)
	e, err2 := strconv.ParseInt(f[1], 10, 64)
	if err1 != nil || err2 != nil {
		return
	}
	return time.UnixMilli(c), time.UnixMilli(e), f[2], f[3], true
}

// sentBuckets is how many buckets History spans.
const sentBuckets = 24

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

// read returns the events of job id (of shard k) in the buckets of the
// last History (and the next bucket: another process's clock may run
// ahead), oldest first.
func (h *jobHistory) read(ctx context.Context, rdb redis.UniversalClient, k *keys, id string) ([]rawEvent, error) {
	if h.keep < 0 {
		return nil, nil
	}
	now := time.Now()
	l := h.bucketLen()
	cmds := make([]*redis.SliceCmd, int(h.keep/l)+3)
	_, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i := range cmds { // the oldest first
			bucket, _ := h.bucket(now.Add(time.Duration(i-len(cmds)+2) * l))
			cmds[i] = p.HMGet(ctx, k.sent+bucket, id+"\x00s", id+"\x00e", id)
		}
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, wrap(ctx, "job", err, nil)
	}
	var raw []rawEvent
	for _, c := range cmds {
		for _, v := range c.Val() {
			if v, ok := v.(string); ok {
				raw = parseEvents(v, raw)
			}
		}
	}
	// The fields' events by time; in one millisecond, scheduled before
	// enqueued before the rest.
	rank := func(k byte) int { return strings.IndexByte("se", k) & 3 } // s 0, e 1, else 3
	slices.SortStableFunc(raw, func(a, b rawEvent) int {
		if a.ms != b.ms {
			return int(a.ms - b.ms)
		}
		return rank(a.kind) - rank(b.kind)
	})
	return raw, nil
}

// enqueued returns the tasks job id became, as its "enqueued" events in
// raw tell, newest first, one per task id.
func enqueued(id string, raw []rawEvent) []JobInfo {
	var out []JobInfo
	seen := map[string]bool{}
	for n := len(raw) - 1; n >= 0; n-- {
		r := raw[n]
		_, at, queue, task, ok := enqueuedParts(r)
		if !ok || seen[task] {
			continue
		}
		seen[task] = true
		j := JobInfo{ID: id, State: StateEnqueued, Queue: queue, TaskID: task, Enqueued: at}
		if due, err := strconv.ParseInt(r.a, 10, 64); err == nil {
			j.Due = time.UnixMilli(due)
		}
		out = append(out, j)
	}
	return out
}

// scheduleStory tells the events of raw of the occurrence due at due.
func scheduleStory(raw []rawEvent, due time.Time) []Event {
	d := strconv.FormatInt(due.UnixMilli(), 10)
	if due.IsZero() {
		d = ""
	}
	var out []Event
	for _, r := range raw {
		if r.a != d {
			continue
		}
		at := time.UnixMilli(r.ms)
		switch r.kind {
		case 's':
			out = append(out, Event{At: at, What: "scheduled", Detail: "due " + due.UTC().Format(occurrenceLayout)})
		case 'e':
			if claimed, enqueued, queue, task, ok := enqueuedParts(r); ok {
				out = append(out, Event{At: claimed, What: "claimed", Detail: "by a dispatcher"},
					Event{At: enqueued, What: "enqueued", Detail: "task " + task + " in queue " + queue})
			}
		case 'r':
			out = append(out, Event{At: at, What: "back on the schedule", Detail: r.detail})
		case 'd':
			out = append(out, Event{At: at, What: "dead", Detail: r.detail})
		}
	}
	return out
}

// taskState fills in asynq's record of j's task: its state, retries and
// last error ("" state when asynq no longer has it: completed past its
// retention, or deleted), and, with a Runs store, whether its run
// finished; and j's History, from raw (the job's events), the store's and
// asynq's.
func (h *jobHistory) taskState(ctx context.Context, rdb redis.UniversalClient, runs *Idempotency, j *JobInfo,
	raw []rawEvent) error {
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
	var run []Event
	if runs != nil {
		if j.RunDone, err = runFinished(ctx, runs, j.TaskID); err != nil {
			return err
		}
		if run, j.TakenOver, err = runEvents(ctx, runs, j.TaskID); err != nil {
			return err
		}
	}
	j.History = story(append(scheduleStory(raw, j.Due), run...), *j, info)
	return nil
}

// story completes h, an enqueued occurrence's events from the schedule
// then the store (each in the order written: a run cannot start before
// its task is enqueued, though the enqueue's time, taken where the
// Dispatcher's call returned, may read a millisecond later), with asynq's
// record of its task (info, nil when asynq no longer has it) where they
// do not tell it, placed by time.
func story(h []Event, j JobInfo, info *asynq.TaskInfo) []Event {
	has := map[string]bool{}
	at := make([]time.Time, len(h)) // the order of h's own events, in time
	for n, e := range h {
		has[e.What] = true
		at[n] = e.At
		if n > 0 && at[n].Before(at[n-1]) {
			at[n] = at[n-1]
		}
	}
	add := func(when time.Time, what, detail string) {
		if !when.IsZero() {
			h = append(h, Event{At: when, What: what, Detail: detail})
			// asynq keeps its times to the second: such an event goes
			// after the others of its second (a failure after its
			// enqueue, say).
			at = append(at, when.Add(time.Second-time.Millisecond))
		}
	}
	if info != nil {
		failed := info.LastErr
		if info.Retried > 1 {
			failed = fmt.Sprintf("%s (the last of %d failures)", failed, info.Retried)
		}
		if info.State == asynq.TaskStateArchived {
			add(info.LastFailedAt, "archived", failed)
		} else if !has["failed"] {
			add(info.LastFailedAt, "failed", failed)
		}
		if !has["finished"] {
			add(info.CompletedAt, "completed", "")
		}
	}
	if j.RunDone && !has["finished"] && (info == nil || info.CompletedAt.IsZero()) {
		h = append(h, Event{What: "finished", Detail: "the Runs store records the run as finished"})
		at = append(at, time.Unix(1<<40, 0)) // no time: last
	}
	idx := make([]int, len(h))
	for n := range idx {
		idx[n] = n
	}
	slices.SortStableFunc(idx, func(a, b int) int { return at[a].Compare(at[b]) })
	out := make([]Event, len(h))
	for n, k := range idx {
		out[n] = h[k]
	}
	return out
}

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
