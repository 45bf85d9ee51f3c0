package zclaim

// Tasks written into asynq's Redis many to a call
// (DispatcherOptions.AsynqRedis): for each task, what asynq v0.26's
// Client.Enqueue writes.

import (
	"context"
	_ "embed"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"google.golang.org/protobuf/encoding/protowire"
)

var (
	//go:embed lua/enqueue.lua
	enqueueLua    string
	enqueueScript = redis.NewScript(enqueueLua)
)

// bulkMax is how many claims an enqueue worker takes at once when it
// writes in bulk.
const bulkMax = 32

// take adds to its the claims queued now, without waiting for more, up to
// bulkMax in all.
func (p *pipeline) take(its []queued) []queued {
	for len(its) < bulkMax {
		select {
		case it, ok := <-p.queue:
			if !ok {
				return its
			}
			its = append(its, it)
		default:
			return its
		}
	}
	return its
}

// dispatchBulk dispatches queued claims its as dispatch does each, but
// writes the tasks that asynq's Enqueue would write alike together, in w
// (bulk.write).
func (p *pipeline) dispatchBulk(ctx context.Context, its []queued, w *bulkWrite) {
	w.tasks = w.tasks[:0]
	for i, it := range its {
		it.c.LeaseUntil = time.UnixMilli(it.run.until.Load())
		if o, later := p.d.dispatch(ctx, it.c, it.redisNow, it.claimedAt, w); later {
			w.tasks[len(w.tasks)-1].tag = i
		} else {
			p.ended.Add(1)
			it.run.settled(it.index, o, p.acks)
		}
	}
	if len(w.tasks) == 0 {
		return
	}
	start := time.Now()
	p.d.bulk.write(ctx, w)
	p.d.enqueueTime.observe(time.Since(start))
	for i := range w.tasks {
		t := &w.tasks[i]
		if t.err == nil {
			p.d.inBulk.Add(1)
		}
		o := p.d.afterEnqueue(ctx, t.c, t.redisNow, t.claimedAt, t.err, nil)
		p.ended.Add(1)
		it := its[t.tag]
		it.run.settled(it.index, o, p.acks)
	}
}

// bulk writes tasks into asynq's Redis.
type bulk struct {
	rdb       redis.UniversalClient
	published sync.Map // queues added to asynq's set of queues, as asynq's client remembers them
}

// newBulk returns the bulk writer of a dispatcher whose AsynqRedis is rdb
// under asynq version v, or nil and why not.
func newBulk(rdb redis.UniversalClient, v string) (*bulk, string) {
	if !strings.HasPrefix(v, knownAsynq) {
		if v == "" {
			v = "of no known version"
		}
		return nil, fmt.Sprintf("asynq is %s, not %sx, whose Enqueue the dispatcher knows how to write", v, knownAsynq)
	}
	return &bulk{rdb: rdb}, ""
}

// bulkWrite gathers the tasks of the claims an enqueue worker holds, to
// write them in one script call per queue, in one round trip.
type bulkWrite struct{ tasks []bulkTask }

// bulkTask is one task of a bulkWrite and the claim it is for.
type bulkTask struct {
	tag                 int // the claim's place among the worker's (dispatchBulk)
	c                   Claim
	redisNow, claimedAt time.Time
	m                   asynqMessage
	err                 error
}

// add adds task m of claim c to w.
func (w *bulkWrite) add(c Claim, redisNow, claimedAt time.Time, m asynqMessage) {
	w.tasks = append(w.tasks, bulkTask{c: c, redisNow: redisNow, claimedAt: claimedAt, m: m})
}

// write writes w's tasks, one script call per queue, all in one round
// trip, and sets each task's err: nil when written,
// asynq.ErrTaskIDConflict when asynq holds a task of its id, or the call's
// error. The tasks of a queue keep their order.
func (b *bulk) write(ctx context.Context, w *bulkWrite) {
	slices.SortStableFunc(w.tasks, func(x, y bulkTask) int { return strings.Compare(x.m.queue, y.m.queue) })
	var queues [][]bulkTask // the tasks of each queue
	for i := 0; i < len(w.tasks); {
		j := i + 1
		for j < len(w.tasks) && w.tasks[j].m.queue == w.tasks[i].m.queue {
			j++
		}
		queues = append(queues, w.tasks[i:j])
		i = j
	}
	if err := b.publish(ctx, queues); err != nil {
		setErr(w.tasks, err)
		return
	}
	call := func(i int) (*redis.Script, []string, []any) {
		tasks := queues[i]
		prefix := asynqKey(tasks[0].m.queue, "")
		keys := make([]string, len(tasks)+1)
		args := make([]any, 1, 1+2*len(tasks))
		args[0] = time.Now().UnixNano()
		for k, t := range tasks {
			keys[k] = prefix + "t:" + t.m.id
			args = append(args, t.m.msg, t.m.id)
		}
		keys[len(tasks)] = prefix + "pending"
		return enqueueScript, keys, args
	}
	var cmds []*redis.Cmd
	if len(queues) == 1 {
		s, keys, args := call(0)
		cmds = []*redis.Cmd{s.Run(ctx, b.rdb, keys, args...)}
	} else {
		cmds = pipelinedScripts(ctx, b.rdb, len(queues), call)
	}
	for i, tasks := range queues {
		res, err := cmds[i].Int64Slice()
		if err == nil && len(res) != len(tasks) {
			err = fmt.Errorf("zclaim: enqueue.lua answered %d values for %d tasks", len(res), len(tasks))
		}
		if err != nil {
			setErr(tasks, err)
			continue
		}
		for j, n := range res {
			if n == 0 {
				tasks[j].err = fmt.Errorf("%w", asynq.ErrTaskIDConflict)
			}
		}
	}
}

// publish adds the queues that this dispatcher has not yet added to
// asynq's set of queues, as asynq's client does before a queue's first task.
func (b *bulk) publish(ctx context.Context, queues [][]bulkTask) error {
	var add []any
	for _, tasks := range queues {
		if _, ok := b.published.Load(tasks[0].m.queue); !ok {
			add = append(add, tasks[0].m.queue)
		}
	}
	if len(add) == 0 {
		return nil
	}
	if err := b.rdb.SAdd(ctx, "asynq:queues", add...).Err(); err != nil {
		return err
	}
	for _, q := range add {
		b.published.Store(q, true)
	}
	return nil
}

// setErr sets the err of each of tasks.
func setErr(tasks []bulkTask, err error) {
	for i := range tasks {
		tasks[i].err = err
	}
}

// asynqMessage is a task as asynq stores it: its id, queue and encoded
// message.
type asynqMessage struct {
	id, queue string
	msg       []byte
}

// Options asynq's Enqueue applies to the message alone, by their Go type
// as its composeOptions tells them apart. Any other option (Unique,
// ProcessAt, ProcessIn, Group, or one of a type asynq does not know) makes
// asynq write elsewhere or check more: such tasks go through the client.
var (
	optRetry     = reflect.TypeOf(asynq.MaxRetry(0))
	optQueue     = reflect.TypeOf(asynq.Queue(""))
	optTaskID    = reflect.TypeOf(asynq.TaskID(""))
	optTimeout   = reflect.TypeOf(asynq.Timeout(0))
	optDeadline  = reflect.TypeOf(asynq.Deadline(time.Time{}))
	optRetention = reflect.TypeOf(asynq.Retention(0))
)

// message encodes task with opts as asynq v0.26's Client.EnqueueContext
// would store it as a pending task, or returns false where asynq would do
// more than that (see the options above) or refuse the task (a blank
// queue or task id, a string that is not UTF-8).
func message(task *asynq.Task, opts []asynq.Option) (asynqMessage, bool) {
	retry, queue, id := 25, "default", ""
	var timeout, retention time.Duration
	var deadline time.Time
	for _, o := range opts {
		if o == nil {
			continue // asynq ignores it too
		}
		switch reflect.TypeOf(o) {
		case optRetry:
			retry = o.Value().(int)
		case optQueue:
			queue = o.Value().(string)
		case optTaskID:
			id = o.Value().(string)
		case optTimeout:
			timeout = o.Value().(time.Duration)
		case optDeadline:
			deadline = o.Value().(time.Time)
		case optRetention:
			retention = o.Value().(time.Duration)
		default:
			return asynqMessage{}, false
		}
	}
	typ, h := task.Type(), task.Headers()
	if blank(id) || blank(queue) || blank(typ) ||
		!utf8.ValidString(id) || !utf8.ValidString(queue) || !utf8.ValidString(typ) {
		return asynqMessage{}, false
	}
	noDeadline := time.Unix(0, 0)
	if deadline.IsZero() {
		deadline = noDeadline
	}
	if deadline.Equal(noDeadline) && timeout == 0 {
		timeout = 30 * time.Minute // asynq's default
	}
	// The fields in number order, zero values left out, as proto.Marshal
	// writes asynq's TaskMessage (internal/proto/asynq.proto).
	b := make([]byte, 0, 48+len(typ)+len(task.Payload())+len(id)+len(queue))
	b = appendString(b, 1, typ)
	if p := task.Payload(); len(p) > 0 {
		b = protowire.AppendTag(b, 2, protowire.BytesType)
		b = protowire.AppendBytes(b, p)
	}
	b = appendString(b, 3, id)
	b = appendString(b, 4, queue)
	b = appendInt(b, 5, int64(int32(retry)))
	b = appendInt(b, 8, int64(timeout.Seconds()))
	b = appendInt(b, 9, deadline.Unix())
	b = appendInt(b, 12, int64(retention.Seconds()))
	if len(h) > 0 {
		names := make([]string, 0, len(h))
		for k, v := range h {
			if !utf8.ValidString(k) || !utf8.ValidString(v) {
				return asynqMessage{}, false
			}
			names = append(names, k)
		}
		slices.Sort(names)
		for _, k := range names {
			// A map entry: key (1) and value (2), both written even when
			// empty.
			n := protowire.SizeTag(1) + protowire.SizeBytes(len(k)) + protowire.SizeTag(2) + protowire.SizeBytes(len(h[k]))
			b = protowire.AppendTag(b, 15, protowire.BytesType)
			b = protowire.AppendVarint(b, uint64(n))
			b = protowire.AppendTag(b, 1, protowire.BytesType)
			b = protowire.AppendString(b, k)
			b = protowire.AppendTag(b, 2, protowire.BytesType)
			b = protowire.AppendString(b, h[k])
		}
	}
	return asynqMessage{id: id, queue: queue, msg: b}, true
}

func appendString(b []byte, field protowire.Number, s string) []byte {
	if s == "" {
		return b
	}
	b = protowire.AppendTag(b, field, protowire.BytesType)
	return protowire.AppendString(b, s)
}

func appendInt(b []byte, field protowire.Number, v int64) []byte {
	if v == 0 {
		return b
	}
	b = protowire.AppendTag(b, field, protowire.VarintType)
	return protowire.AppendVarint(b, uint64(v))
}
