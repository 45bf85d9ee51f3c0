package zclaim

import (
	"context"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
)

// scriptCalls counts a client's calls of one script (by SHA1), alone or
// in pipelines.
type scriptCalls struct {
	sha string
	n   atomic.Int64
}

func (c *scriptCalls) DialHook(next redis.DialHook) redis.DialHook { return next }
func (c *scriptCalls) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.count(cmd)
		return next(ctx, cmd)
	}
}
func (c *scriptCalls) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			c.count(cmd)
		}
		return next(ctx, cmds)
	}
}
func (c *scriptCalls) count(cmd redis.Cmder) {
	if a := cmd.Args(); len(a) > 1 && a[0] == "evalsha" && a[1] == c.sha {
		c.n.Add(1)
	}
}

// asynqDequeueScript is asynq v0.26's dequeue script (internal/rdb).
var asynqDequeueScript = redis.NewScript(`
if redis.call("EXISTS", KEYS[2]) == 0 then
	local id = redis.call("RPOPLPUSH", KEYS[1], KEYS[3])
	if id then
		local key = ARGV[2] .. id
		redis.call("HSET", key, "state", "active")
		redis.call("HDEL", key, "pending_since")
		redis.call("ZADD", KEYS[4], ARGV[1], id)
		return redis.call("HGET", key, "msg")
	end
end
return nil`)

// dequeueOn makes asynq's dequeue of queue through c, as asynq v0.26's
// processor does, and returns its reply.
func dequeueOn(c redis.UniversalClient, queue string) (any, error) {
	p := "asynq:{" + queue + "}:"
	return asynqDequeueScript.Run(ctx, c, []string{p + "pending", p + "paused", p + "active", p + "lease"},
		time.Now().Add(30*time.Second).Unix(), p+"t:").Result()
}

// The store's dequeue makes asynq's writes and replies as asynq's script
// does (its SHA1 is the one the adapter knows), marks each task it takes
// as held by the process, and dequeues nothing from an empty or a paused
// queue; a run's Begin takes its task's mark out at the process's next
// beat, and Close takes the process out of the live set.
func TestDequeueMarksHeld(t *testing.T) {
	t.Parallel()
	rdb := newClient(t)
	const lease = 300 * time.Millisecond // a beat every 100ms
	idem := newIdem(t, rdb, IdempotencyOptions{Lease: lease, TakeAhead: 1})
	c := idem.AsynqClient()
	queue := testQueue(t)
	cl := newAsynqClient(t, testAddr)
	in := newInspector(t)
	if h := asynqDequeueScript.Hash(); h != asynqDequeue {
		t.Fatalf("asynq's dequeue script is %s, asynqDequeue %s", h, asynqDequeue)
	}
	if _, err := dequeueOn(c, queue); err != redis.Nil {
		t.Fatalf("dequeue of an empty queue: %v, want redis.Nil", err)
	}
	for _, id := range []string{"a", "b"} {
		_, err := cl.Enqueue(asynq.NewTask("t", nil), asynq.Queue(queue), asynq.TaskID(id))
		must(t, err)
		reply, err := dequeueOn(c, queue)
		if msg, ok := reply.(string); err != nil || !ok || !strings.Contains(msg, id) {
			t.Fatalf("dequeue of %s: %v, %v", id, reply, err)
		}
		ti, err := in.GetTaskInfo(queue, id)
		if err != nil || ti.State != asynq.TaskStateActive {
			t.Fatalf("%s after the dequeue: %+v, %v", id, ti, err)
		}
		if h := rdb.HGet(ctx, heldKey(queue), id).Val(); h == "" || h != idem.held.id {
			t.Fatalf("%s marked as held by %q, want this process, %q", id, h, idem.held.id)
		}
	}
	if s, err := rdb.ZScore(ctx, idem.held.liveKey(), idem.held.id).Result(); err != nil || s == 0 {
		t.Fatalf("the process's beat: %v, %v", s, err)
	}
	// A server on the client runs a task of another queue: the dequeue
	// marks it, its run begins, and its mark goes at the next beat; those
	// of a and b, whose runs never began, stay.
	q2 := testQueue(t) + "-2"
	ran := make(chan struct{}, 1)
	startAsynqOn(t, c, testAddr, q2, idem.Middleware()(asynq.HandlerFunc(func(context.Context, *asynq.Task) error {
		ran <- struct{}{}
		return nil
	})), asynq.Config{})
	_, err := cl.Enqueue(asynq.NewTask("t", nil), asynq.Queue(q2), asynq.TaskID("c"))
	must(t, err)
	<-ran
	waitFor(t, 10*time.Second, "c's mark to go", func() bool { return rdb.HLen(ctx, heldKey(q2)).Val() == 0 })
	if n := rdb.HLen(ctx, heldKey(queue)).Val(); n != 2 {
		t.Fatalf("%d marks of tasks whose runs never began, want a's and b's", n)
	}
	// Marks of tasks no longer active (asynq finished them before a beat,
	// or no middleware began them) go at a pass's sweep; those of active
	// tasks stay.
	must(t, rdb.HSet(ctx, heldKey(queue), "done-1", "x", "done-2", "x").Err())
	idem.held.sweepMarks(ctx, []string{queue})
	if ids := rdb.HKeys(ctx, heldKey(queue)).Val(); len(ids) != 2 || slices.Contains(ids, "done-1") {
		t.Fatalf("marks after the sweep: %q, want a's and b's", ids)
	}
	// A paused queue dequeues nothing, and marks nothing.
	_, err = cl.Enqueue(asynq.NewTask("t", nil), asynq.Queue(queue), asynq.TaskID("paused"))
	must(t, err)
	must(t, in.PauseQueue(queue))
	if _, err := dequeueOn(c, queue); err != redis.Nil {
		t.Errorf("dequeue of a paused queue: %v, want redis.Nil", err)
	}
	if rdb.HExists(ctx, heldKey(queue), "paused").Val() {
		t.Error("a task of a paused queue marked as held")
	}
	must(t, idem.Close())
	if rdb.ZScore(ctx, idem.held.liveKey(), idem.held.id).Err() != redis.Nil {
		t.Error("a closed process is still in the live set")
	}
}
