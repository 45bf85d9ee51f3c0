package zclaim

// Active runs: the asynq tasks that are active now, as a takeover pass and
// Runs read them: the busy queues, each task's key, its run record, and
// whether its worker is gone.

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"google.golang.org/protobuf/encoding/protowire"
)

// activeRuns lists, through in, the active tasks of the takeover's queues
// (TakeoverQueues, else every queue asynq knows), with their keys; tasks
// whose key cannot be told from the task alone are left out. A queue that
// cannot be read is passed over: each such queue's *QueueError, in name
// order, is returned joined (errors.Join) beside the others' tasks.
func (tk *takeover) activeRuns(ctx context.Context, in *asynq.Inspector) ([]activeRun, error) {
	i := tk.i
	queues := slices.Clone(i.opts.TakeoverQueues)
	if len(queues) == 0 {
		var err error
		if queues, err = in.Queues(); err != nil {
			return nil, err
		}
	}
	slices.Sort(queues) // the queues that cannot be read, by name
	queues = i.takeover.busyQueues(ctx, queues)
	var out []activeRun
	var unread []error
	for _, q := range queues {
		for page := 1; ; page++ {
			tasks, err := in.ListActiveTasks(q, asynq.PageSize(500), asynq.Page(page))
			if err != nil {
				if !errors.Is(err, asynq.ErrQueueNotFound) {
					unread = append(unread, &QueueError{Queue: q, Err: err})
				}
				break
			}
			for _, ti := range tasks {
				if r, ok := i.takeover.runOf(ti); ok {
					out = append(out, r)
				}
			}
			if len(tasks) < 500 {
				break
			}
		}
	}
	return out, errors.Join(unread...)
}

// busyQueues returns the queues among qs whose active lists hold a task,
// read in one pipeline: asynq's Inspector takes three round trips to list
// a queue's active tasks, busy or idle, so that a pass over hundreds of
// idle queues would outlast its interval. A queue whose length Redis
// refused to read (an active list of another type) is kept, so that its
// listing reports the error. Under an asynq of another release line than
// knownAsynq, whose keys it does not know, or when Redis cannot be
// reached, it returns qs.
func (tk *takeover) busyQueues(ctx context.Context, qs []string) []string {
	i := tk.i
	if len(qs) < 2 || !i.adapter.known {
		return qs
	}
	lens := make([]*redis.IntCmd, len(qs))
	_, err := i.asynqRedis().Pipelined(ctx, func(p redis.Pipeliner) error {
		for n, q := range qs {
			lens[n] = p.LLen(ctx, asynqKey(q, "active"))
		}
		return nil
	})
	if err != nil && !isReplyErr(err) {
		return qs
	}
	var busy []string
	for n, q := range qs {
		if lens[n].Val() > 0 || lens[n].Err() != nil {
			busy = append(busy, q)
		}
	}
	return busy
}

// records reads the run records of runs in one pipeline, with Redis TIME.
// A missing record's command holds redis.Nil; a finished one's holds
// "done 0 0" (its token is not kept); one Redis refused to read (of
// another type), its error. It marks the runs whose worker is gone
// (workersGone).
func (tk *takeover) records(ctx context.Context, runs []activeRun) ([]*redis.StringCmd, time.Time, error) {
	i := tk.i
	if err := i.readyDone(ctx); err != nil {
		return nil, time.Time{}, err
	}
	cmds := make([]*redis.StringCmd, len(runs))
	fins := make([]*redis.StringCmd, len(runs))
	var clock *redis.TimeCmd
	_, err := i.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		clock = p.Time(ctx)
		for n, r := range runs {
			cmds[n] = p.Get(ctx, i.recordKey(r.key))
			bucket, field := i.doneOf(r.key)
			fins[n] = p.HGet(ctx, bucket, field)
		}
		return nil
	})
	// A reply's own error (a record of another type) is its run's: it
	// keeps no other run from being read.
	if err != nil && !isReplyErr(err) {
		return nil, time.Time{}, err
	}
	now := clock.Val()
	for n := range runs {
		fin, ferr := fins[n].Int64()
		if errors.Is(cmds[n].Err(), redis.Nil) && ferr == nil && time.UnixMilli(fin).Add(i.opts.Retention).After(now) {
			cmds[n].SetErr(nil)
			cmds[n].SetVal("done 0 0")
		}
	}
	i.takeover.workersGone(ctx, runs, cmds, now)
	return cmds, now, nil
}

// runOf tells the key of an active task as the middleware gives it.
func (tk *takeover) runOf(ti *asynq.TaskInfo) (activeRun, bool) {
	i := tk.i
	t := asynq.NewTaskWithHeaders(ti.Type, ti.Payload, ti.Headers)
	job, has := jobOf(t, ti.ID)
	r := activeRun{task: ti, job: job, has: has}
	if k := ti.Headers[headerTakeover]; k != "" {
		r.key = k
		return r, true
	}
	if i.defaultKey {
		r.key = ti.ID
		if has {
			r.key = job.Occurrence()
		}
		return r, true
	}
	// A Key function of the user's. A function that reads asynq's metadata
	// from the context tells another key here (a pass has no handler's
	// context), and a takeover under that key would run the task again
	// beside its live run: a type the middleware found so is left out, and
	// only one it found telling keys from the task alone is sure.
	v, seen := i.types.Load(ti.Type)
	if seen && !v.(bool) {
		return r, false
	}
	k, err := i.keyFromTask(t, job, has)
	if err != nil || k == "" {
		return r, false
	}
	r.key, r.unsure = k, !seen
	return r, true
}

// keyFromTask is what the Key function tells of task t without a
// handler's context: the context holds only the task's job, where it has
// one (has).
func (i *Idempotency) keyFromTask(t *asynq.Task, job JobInfo, has bool) (string, error) {
	ctx := context.Background()
	if has {
		ctx = context.WithValue(ctx, jobInfoKey{}, job)
	}
	return i.opts.Key(ctx, t)
}

// parseRecord reads a run record: state, token and its number.
func parseRecord(rec string) (state string, token int64, n int64, ok bool) {
	f := strings.Fields(rec)
	if len(f) != 3 {
		return "", 0, 0, false
	}
	t, err1 := strconv.ParseInt(f[1], 10, 64)
	v, err2 := strconv.ParseInt(f[2], 10, 64)
	return f[0], t, v, err1 == nil && err2 == nil
}

// workersGone marks the runs whose worker is gone: asynq's lease of the
// task ran out (IsOrphaned), or, for a run whose record does not tell
// whether its worker lives, the process that holds it stopped beating
// (heldGone), or
// whether its worker lives (cmds[n] holds none, or a "free" or "take"
// one), its server last renewed the lease more than asynqGone ago, as the
// lease's deadline tells (Unix seconds, by the worker's clock, which
// asynq's recoverer and IsOrphaned compare with their own too), and no
// live asynq server lists the task of its queue among its workers'
// (asynqHeld: a worker whose clock runs behind this process's is not
// taken for dead).
// The deadlines are read from asynq's lease sets in one pipeline, only
// when such runs have a lease that has not run out, and the servers'
// lists only when one of those looks stale; what cannot be read leaves
// its run to IsOrphaned, and so does an asynq of another release line
// than knownAsynq, whose keys may mean something else.
func (tk *takeover) workersGone(ctx context.Context, runs []activeRun, cmds []*redis.StringCmd, now time.Time) {
	i := tk.i
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
	if len(ask) == 0 || !i.adapter.known {
		return
	}
	// A task marked as held by a process that stopped beating is gone
	// within a Lease (heldGone); the rest as asynq's lease tells.
	i.takeover.heldGone(ctx, runs, ask, now)
	ask = slices.DeleteFunc(ask, func(n int) bool { return runs[n].gone })
	if len(ask) == 0 {
		return
	}
	scores := make([]*redis.FloatCmd, len(ask))
	_, _ = i.asynqRedis().Pipelined(ctx, func(p redis.Pipeliner) error {
		for k, n := range ask {
			t := runs[n].task
			scores[k] = p.ZScore(ctx, asynqKey(t.Queue, "lease"), t.ID)
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
	ids := make([]string, len(stale))
	for k, n := range stale {
		ids[k] = runs[n].task.ID
	}
	held, err := i.takeover.asynqHeld(ctx, ids)
	if err != nil {
		return
	}
	for _, n := range stale {
		runs[n].gone = !holds(held, runs[n].task.Queue, runs[n].task.ID)
	}
}

// asynqHeld returns which of the task ids ids the workers of asynq's live
// servers hold, by queue and id. At each beat a server writes the tasks
// its workers hold as the fields of a hash of its own
// (asynq:workers:{host:pid:id}, listed in asynq:workers), each field's
// value the worker's record, which names the task's queue; the hash
// expires two beats later by Redis' clock: a task a live server listed is
// not taken for its worker's, whatever the clocks of the two processes say
// of its lease. Only the records of ids are read (a record holds its
// task's payload). A record that does not tell a queue holds its task id
// in every queue (heldTask's queue ""). The list's scores are deadlines by
// the servers' clocks; entries that ran out more than ten minutes ago by
// this one's are left out (a killed server's entry stays there), and so is
// a listed key of another type than a hash: no server of asynq's wrote it.
func (tk *takeover) asynqHeld(ctx context.Context, ids []string) (map[heldTask]bool, error) {
	i := tk.i
	rdb := i.asynqRedis()
	since := strconv.FormatInt(time.Now().Add(-10*time.Minute).Unix(), 10)
	keys, err := rdb.ZRangeByScore(ctx, "asynq:workers", &redis.ZRangeBy{Min: since, Max: "+inf"}).Result()
	if err != nil {
		return nil, err
	}
	infos := make([]*redis.SliceCmd, len(keys))
	if _, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for k, key := range keys {
			infos[k] = p.HMGet(ctx, key, ids...)
		}
		return nil
	}); err != nil && !isReplyErr(err) {
		return nil, err
	}
	held := map[heldTask]bool{}
	for _, f := range infos {
		for n, v := range f.Val() {
			if info, ok := v.(string); ok {
				held[heldTask{workerQueue(info), ids[n]}] = true
			}
		}
	}
	return held, nil
}

// holds tells whether held names the task id of queue q.
func holds(held map[heldTask]bool, q, id string) bool {
	return held[heldTask{q, id}] || held[heldTask{"", id}]
}

// workerQueue reads the queue (field 7) of asynq's WorkerInfo record in
// its protobuf encoding; "" where info is not such a record or names none.
func workerQueue(info string) string {
	b := []byte(info)
	q := ""
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return ""
		}
		b = b[n:]
		if num == 7 && typ == protowire.BytesType {
			v, m := protowire.ConsumeBytes(b)
			if m < 0 {
				return ""
			}
			q = string(v)
			b = b[m:]
			continue
		}
		m := protowire.ConsumeFieldValue(num, typ, b)
		if m < 0 {
			return ""
		}
		b = b[m:]
	}
	return q
}

// headerTakeover is the header of a copy of an abandoned run's task, as
// takeovers of earlier versions enqueued one: the key of the run it starts
// again. The middleware keys such a task by it, whatever its Key function
// says of the copy. Takeovers now put the task itself back (requeue).
const headerTakeover = "zclaim-takeover"
