package zclaim

import (
	"context"
	"errors"
	"fmt"
	"pgregory.net/rapid"
	"strconv"
	"strings"
	"sync"
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

// On the store's AsynqClient, once the middleware has handled a task of a
// type, the runs of that type's tasks begin in asynq's dequeue: no Begin
// of their own, each task's work done once, and a task whose work
// finished skipped there too.
func TestAsynqClientBeginsWithDequeue(t *testing.T) {
	t.Parallel()
	rdb := redis.NewClient(&redis.Options{Addr: testAddr})
	t.Cleanup(func() { rdb.Close() })
	begins := &scriptCalls{}
	rdb.AddHook(begins)
	idem := newIdem(t, rdb, IdempotencyOptions{Lease: 5 * time.Second})
	begins.sha = idem.begin.Hash()
	queue := testQueue(t)
	var mu sync.Mutex
	runs := map[string]int{}
	var tokens sync.Map
	h := idem.Middleware()(asynq.HandlerFunc(func(ctx context.Context, task *asynq.Task) error {
		id, _ := asynq.GetTaskID(ctx)
		e, ok := ExecutionFromContext(ctx)
		if !ok || e.Key != id || e.Token == 0 {
			t.Errorf("task %s: execution %+v", id, e)
		}
		tokens.Store(id, e.Token)
		mu.Lock()
		runs[id]++
		mu.Unlock()
		return nil
	}))
	startAsynqOn(t, idem.AsynqClient(), testAddr, queue, h, asynq.Config{Concurrency: 16})
	cl := newAsynqClient(t, testAddr)
	enqueue := func(id string) {
		_, err := cl.Enqueue(asynq.NewTask("t", []byte(id)), asynq.Queue(queue), asynq.TaskID(id))
		must(t, err)
	}
	enqueue("first")
	waitFor(t, 10*time.Second, "the first task's run", func() bool { return idem.Stats().Completed == 1 })
	before := begins.n.Load()
	const n = 300
	for k := range n {
		enqueue(fmt.Sprintf("task-%d{%d}", k, k%7))
	}
	waitProgress(t, 5*time.Second, "completed runs", n+1, func() int { return int(idem.Stats().Completed) }, nil)
	if b := begins.n.Load() - before; b != 0 {
		t.Errorf("%d of %d runs made a Begin of their own", b, n)
	}
	mu.Lock()
	for k := range n {
		id := fmt.Sprintf("task-%d{%d}", k, k%7)
		if runs[id] != 1 {
			t.Errorf("task %s ran %d times", id, runs[id])
		}
		if _, err := idem.Begin(ctx, id); !errors.Is(err, ErrAlreadyDone) {
			t.Errorf("Begin of %s after its run: %v, want ErrAlreadyDone", id, err)
		}
	}
	mu.Unlock()
	before = begins.n.Load() // the test's own Begins
	// The same work again (asynq keeps no finished task, so it takes the
	// ids again): skipped in the dequeue's Begin.
	for k := range 20 {
		enqueue(fmt.Sprintf("task-%d{%d}", k, k%7))
	}
	waitProgress(t, 5*time.Second, "skipped tasks", 20, func() int { return int(idem.Stats().Skipped) }, nil)
	if b := begins.n.Load() - before; b != 0 {
		t.Errorf("%d runs made a Begin of their own", b)
	}
	mu.Lock()
	defer mu.Unlock()
	for k := range 20 {
		if id := fmt.Sprintf("task-%d{%d}", k, k%7); runs[id] != 1 {
			t.Errorf("task %s ran %d times", id, runs[id])
		}
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

// pre is the run a dequeue began for task id of queue, if any.
func (i *Idempotency) pre(queue, id string) *preBegun {
	i.guards.mu.Lock()
	defer i.guards.mu.Unlock()
	return i.guards.pre[queue+"\x00"+id]
}

// The dequeue script looks for a task's finished record where the store's
// Go code puts it (bucket and field, SHA-1, the slot's tag where the
// prefix has no hash tag of its own) and writes its run record, for any
// task id; it begins nothing for an id the middleware refuses.
func TestDequeueBeginsWhereGoLooks(t *testing.T) {
	t.Parallel()
	rdb := newClient(t)
	untagged := "zt-" + t.Name() + ":LEASE_MS:run:" // the script's names of options, in a prefix
	t.Cleanup(func() {
		if ks, err := rdb.Keys(ctx, untagged+"*").Result(); err == nil && len(ks) > 0 {
			rdb.Del(ctx, ks...)
		}
	})
	cl := newAsynqClient(t, testAddr)
	for _, prefix := range []string{"", untagged} {
		idem := newIdem(t, rdb, IdempotencyOptions{Prefix: prefix, Lease: time.Minute})
		if idem.deq.Load() == nil {
			t.Fatalf("prefix %q: the store begins no runs in asynq's dequeue", prefix)
		}
		idem.handled("t")
		c := idem.AsynqClient()
		queue := testQueue(t)
		n := 0
		check := func(t interface{ Fatalf(string, ...any) }, id string) {
			n++
			id += "#" + strconv.Itoa(n) // asynq refuses an id it holds
			if _, err := cl.Enqueue(asynq.NewTask("t", nil), asynq.Queue(queue), asynq.TaskID(id)); err != nil {
				t.Fatalf("enqueue %q: %v", id, err)
			}
			reply, err := dequeueOn(c, queue)
			if msg, ok := reply.(string); err != nil || !ok || !strings.Contains(msg, id) {
				t.Fatalf("dequeue of %q: %v, %v", id, reply, err)
			}
			p := idem.pre(queue, id)
			if len(id) > MaxIDLen || strings.HasPrefix(id, doneInfix) {
				if p != nil {
					t.Fatalf("a run begun for %q, which the middleware refuses", id)
				}
				return
			}
			bucket, field := idem.doneOf(id)
			if p == nil || p.key != id || p.bucket != bucket || p.field != field || p.token == 0 {
				t.Fatalf("id %q: begun %+v, want bucket %q field %x", id, p, bucket, field)
			}
			rec, err := rdb.Get(ctx, idem.recordKey(id)).Result()
			if want := fmt.Sprintf("run %d %d", p.token, p.token/1000+60000); err != nil || rec != want {
				t.Fatalf("id %q: record %q (%v), want %q", id, rec, err, want)
			}
		}
		for _, id := range []string{"a", "order-731@2026-12-01T08:00:00.000Z", "x{y}z", "{", "}{", "a{}b{c}",
			"\x00{\x01}", strings.Repeat("é", 200), strings.Repeat("z", MaxIDLen-2), strings.Repeat("z", MaxIDLen),
			doneInfix + ":1"} {
			check(t, id)
		}
		rapid.Check(t, func(rt *rapid.T) {
			check(rt, rapid.StringN(1, 40, -1).Draw(rt, "id")+
				rapid.SampledFrom([]string{"", "{", "}", "{tag}", "{}"}).Draw(rt, "brace"))
		})
		// The store's names elsewhere in the message (a queue, a payload,
		// another header) are no header of its own.
		q2 := "zclaim-job-" + queue
		t.Cleanup(func() { rdb.SRem(ctx, "asynq:queues", q2) })
		_, err := cl.Enqueue(asynq.NewTaskWithHeaders("t", []byte(headerJob+headerTakeover), map[string]string{"h": headerJob}),
			asynq.Queue(q2), asynq.TaskID("named"))
		must(t, err)
		_, err = dequeueOn(c, q2)
		must(t, err)
		if p := idem.pre(q2, "named"); p == nil || p.token == 0 {
			t.Errorf("no run begun for a task that names the store's headers elsewhere: %+v", p)
		}
		idem.flushPre()
	}
}

// A run begun in a dequeue whose handler never takes it (the task's
// handler is not the middleware, or asynq did not call it) is taken back
// within the lease: its record deleted, the key as it was. Close takes
// back those still held; a handler that comes for one being taken back
// begins as usual once it is gone.
func TestDequeueRunsTakenBack(t *testing.T) {
	t.Parallel()
	rdb := newClient(t)
	const lease = 500 * time.Millisecond // taken back from 250 ms, and by its end under load
	idem := newIdem(t, rdb, IdempotencyOptions{Lease: lease})
	idem.handled("t")
	c := idem.AsynqClient()
	queue := testQueue(t)
	cl := newAsynqClient(t, testAddr)
	begun := func(id string) *preBegun {
		t.Helper()
		_, err := cl.Enqueue(asynq.NewTask("t", nil), asynq.Queue(queue), asynq.TaskID(id))
		must(t, err)
		_, err = dequeueOn(c, queue)
		must(t, err)
		p := idem.pre(queue, id)
		if p == nil || rdb.Exists(ctx, idem.recordKey(id)).Val() != 1 {
			t.Fatalf("%s: no run begun in the dequeue (%+v)", id, p)
		}
		return p
	}
	start := time.Now()
	begun("swept")
	waitFor(t, lease, "the run taken back", func() bool { return rdb.Exists(ctx, idem.recordKey("swept")).Val() == 0 })
	if d := time.Since(start); d < lease/sweepPreAfter {
		t.Errorf("taken back after %v, before Lease/%d", d, sweepPreAfter)
	}
	waitFor(t, lease, "the run forgotten", func() bool { return idem.pre(queue, "swept") == nil })

	// A handler that meets its run being taken back waits, then begins.
	p := begun("late")
	idem.guards.mu.Lock()
	p.undone = make(chan struct{})
	idem.guards.mu.Unlock()
	go func() {
		time.Sleep(10 * time.Millisecond)
		idem.sweepPre(queue+"\x00late", p)
	}()
	e, err := idem.takePre(ctx, queue, "late", "late")
	if e != nil || err != nil {
		t.Fatalf("took a run being taken back: %+v, %v", e, err)
	}
	if rdb.Exists(ctx, idem.recordKey("late")).Val() != 0 {
		t.Fatal("the handler went on before the run was taken back")
	}
	e, err = idem.Begin(ctx, "late")
	must(t, err)
	must(t, e.Complete(ctx))

	begun("closed")
	must(t, idem.Close())
	if rdb.Exists(ctx, idem.recordKey("closed")).Val() != 0 || idem.pre(queue, "closed") != nil {
		t.Error("Close left a run begun in a dequeue")
	}
}

// The dequeue makes asynq's writes and replies as asynq's script does,
// and begins no run where the middleware's Begin must make its own call,
// or where its commands fail.
func TestDequeueBeginsNothing(t *testing.T) {
	t.Parallel()
	rdb := newClient(t)
	idem := newIdem(t, rdb, IdempotencyOptions{Lease: time.Minute})
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
	nothing := func(task *asynq.Task, id string) {
		t.Helper()
		_, err := cl.Enqueue(task, asynq.Queue(queue), asynq.TaskID(id))
		must(t, err)
		reply, err := dequeueOn(c, queue)
		if msg, ok := reply.(string); err != nil || !ok || !strings.Contains(msg, id) {
			t.Fatalf("dequeue of %s: %v, %v", id, reply, err)
		}
		ti, err := in.GetTaskInfo(queue, id)
		if err != nil || ti.State != asynq.TaskStateActive {
			t.Fatalf("%s after the dequeue: %+v, %v", id, ti, err)
		}
		if p := idem.pre(queue, id); p != nil {
			t.Errorf("%s: a run begun in the dequeue: %+v", id, p)
		}
	}
	// No type handled yet, then another type than the one handled.
	nothing(asynq.NewTask("t", nil), "before")
	idem.handled("t")
	nothing(asynq.NewTask("other", nil), "other")
	// The key is not the id: a header of the store's.
	nothing(asynq.NewTaskWithHeaders("t", nil, map[string]string{headerJob: "2 1787991500000 job"}), "header")
	nothing(asynq.NewTaskWithHeaders("t", nil, map[string]string{"a": "b", headerTakeover: "key"}), "takeover")
	// A key with a run record: the record stays as it was.
	e, err := idem.Begin(ctx, "running")
	must(t, err)
	before := rdb.Get(ctx, idem.recordKey("running")).Val()
	nothing(asynq.NewTask("t", nil), "running")
	if rec := rdb.Get(ctx, idem.recordKey("running")).Val(); rec != before {
		t.Errorf("the record of a running key went from %q to %q", before, rec)
	}
	must(t, e.Release(ctx))
	// A key whose record is of another type: asynq's part is made all the same.
	must(t, rdb.HSet(ctx, idem.recordKey("wrongtype"), "f", "v").Err())
	nothing(asynq.NewTask("t", nil), "wrongtype")
	bucket, _ := idem.doneOf("badbucket")
	must(t, rdb.Set(ctx, bucket, "x", 0).Err())
	nothing(asynq.NewTask("t", nil), "badbucket")
	must(t, rdb.Del(ctx, bucket).Err())

	// A paused queue dequeues nothing.
	_, err = cl.Enqueue(asynq.NewTask("t", nil), asynq.Queue(queue), asynq.TaskID("paused"))
	must(t, err)
	must(t, in.PauseQueue(queue))
	if _, err := dequeueOn(c, queue); err != redis.Nil {
		t.Errorf("dequeue of a paused queue: %v, want redis.Nil", err)
	}
	if rdb.Exists(ctx, idem.recordKey("paused")).Val() != 0 {
		t.Error("a run begun in a paused queue")
	}
	must(t, in.UnpauseQueue(queue))
}

// A run the dequeue began under another record than the middleware's key
// names is taken back, and the middleware begins as usual; a key the
// dequeue found finished is done.
func TestDequeueRunOfAnotherKey(t *testing.T) {
	t.Parallel()
	rdb := newClient(t)
	idem := newIdem(t, rdb, IdempotencyOptions{Lease: time.Minute})
	idem.handled("t")
	c := idem.AsynqClient()
	queue := testQueue(t)
	cl := newAsynqClient(t, testAddr)
	for _, id := range []string{"a", "b", "c"} {
		_, err := cl.Enqueue(asynq.NewTask("t", nil), asynq.Queue(queue), asynq.TaskID(id))
		must(t, err)
		_, err = dequeueOn(c, queue)
		must(t, err)
	}
	pb := idem.pre(queue, "b")
	idem.guards.mu.Lock()
	pb.field = "elsewhere" // as if Lua had looked elsewhere
	idem.guards.mu.Unlock()
	for _, k := range []struct{ id, key string }{{"a", "a-other"}, {"b", "b"}} {
		e, err := idem.takePre(ctx, queue, k.id, k.key)
		if e != nil || err != nil {
			t.Errorf("%s: took a run begun for another record: %+v, %v", k.id, e, err)
		}
		if rdb.Exists(ctx, idem.recordKey(k.id)).Val() != 0 {
			t.Errorf("%s: the run begun for another record was not taken back", k.id)
		}
	}
	e, err := idem.takePre(ctx, queue, "c", "c")
	if err != nil || e == nil || e.Key != "c" || e.Token == 0 || e.LeaseUntil().Before(time.Now()) {
		t.Fatalf("the run begun for c: %+v, %v", e, err)
	}
	must(t, e.Complete(ctx))
	_, err = cl.Enqueue(asynq.NewTask("t", nil), asynq.Queue(queue), asynq.TaskID("c"))
	if err != nil { // asynq still holds the first c (the test made no done)
		must(t, rdb.Del(ctx, asynqKey(queue, "t:c")).Err())
		_, err = cl.Enqueue(asynq.NewTask("t", nil), asynq.Queue(queue), asynq.TaskID("c"))
		must(t, err)
	}
	_, err = dequeueOn(c, queue)
	must(t, err)
	if _, err := idem.takePre(ctx, queue, "c", "c"); !errors.Is(err, ErrAlreadyDone) {
		t.Errorf("c after its run: %v, want ErrAlreadyDone", err)
	}
}

// The store's middleware begins the runs of at most maxDequeueTypes types
// in the dequeue, each once.
func TestDequeueTypes(t *testing.T) {
	t.Parallel()
	idem := newIdem(t, newClient(t), IdempotencyOptions{})
	for k := range maxDequeueTypes + 4 {
		idem.handled("t" + strconv.Itoa(k))
		idem.handled("t0")
	}
	types := *idem.dequeueTypes.Load()
	if len(types) != maxDequeueTypes || types[0] != "t0" || types[1] != "t1" {
		t.Errorf("types begun in the dequeue: %v", types)
	}
}
