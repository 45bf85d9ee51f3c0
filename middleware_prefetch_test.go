package zclaim

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"pgregory.net/rapid"
)

// enqueueIDs enqueues a task of type "t" for each id into queue, in order.
func enqueueIDs(t *testing.T, queue string, ids ...string) {
	t.Helper()
	cl := newAsynqClient(t, testAddr)
	for _, id := range ids {
		_, err := cl.Enqueue(asynq.NewTask("t", nil), asynq.Queue(queue), asynq.TaskID(id))
		must(t, err)
	}
}

// seqIDs returns n ids of one width: p00, p01, ...
func seqIDs(p string, n int) []string {
	ids := make([]string, n)
	for j := range ids {
		ids[j] = fmt.Sprintf("%s%02d", p, j)
	}
	return ids
}

// On the store's AsynqClient a dequeue takes the tasks asynq's next
// dequeues of the queue get, up to TakeAhead, as many more each time
// asynq asked for all it took: each task once, in the queue's order, its
// run begun, and fewer round trips than tasks.
func TestDequeueTakesAhead(t *testing.T) {
	t.Parallel()
	rdb := newClient(t)
	calls := &scriptCalls{}
	rdb.AddHook(calls)
	idem := newIdem(t, rdb, IdempotencyOptions{Lease: time.Minute})
	idem.ahead.hold = time.Minute // none goes back while the test looks
	calls.sha = dequeueScript.Hash()
	idem.handled("t")
	queue := testQueue(t)
	ids := seqIDs("a", 40)
	enqueueIDs(t, queue, ids...)
	c := idem.AsynqClient()
	for _, id := range ids {
		reply, err := dequeueOn(c, queue)
		if msg, ok := reply.(string); err != nil || !ok || !strings.Contains(msg, id) {
			t.Fatalf("dequeue: %v, %v; want task %s", reply, err, id)
		}
		if rdb.HGet(ctx, heldKey(queue), id).Val() != idem.held.id {
			t.Fatalf("task %s not marked as held by the process", id)
		}
	}
	// 1, 2, 4, 8, 8, 8, 8: 39 tasks; the 40th's dequeue takes it alone.
	if n := calls.n.Load(); n != 8 {
		t.Errorf("%d dequeues reached Redis for 40 tasks, want 8", n)
	}
	if _, err := dequeueOn(c, queue); err != redis.Nil {
		t.Errorf("dequeue of the empty queue: %v, want redis.Nil", err)
	}
	p := "asynq:{" + queue + "}:"
	if n := rdb.LLen(ctx, p+"active").Val(); n != 40 {
		t.Errorf("%d tasks active, want 40", n)
	}
}

// TakeAhead bounds what a dequeue takes: with 3, the dequeues of 10 tasks
// take 1, 2, 3, 3 and 1; with 1, one each, as asynq's own.
func TestTakeAheadOption(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ most, calls int }{{3, 5}, {1, 10}} {
		rdb := newClient(t)
		calls := &scriptCalls{}
		rdb.AddHook(calls)
		idem := newIdem(t, rdb, IdempotencyOptions{Lease: time.Minute, TakeAhead: c.most})
		idem.ahead.hold = time.Minute
		calls.sha = dequeueScript.Hash()
		queue := testQueue(t)
		ids := seqIDs(fmt.Sprintf("m%d-", c.most), 10)
		enqueueIDs(t, queue, ids...)
		for _, id := range ids {
			reply, err := dequeueOn(idem.AsynqClient(), queue)
			if msg, ok := reply.(string); err != nil || !ok || !strings.Contains(msg, id) {
				t.Fatalf("TakeAhead %d: dequeue: %v, %v; want task %s", c.most, reply, err, id)
			}
		}
		if n := calls.n.Load(); n != int64(c.calls) {
			t.Errorf("TakeAhead %d: %d dequeues reached Redis for 10 tasks, want %d", c.most, n, c.calls)
		}
	}
}

// startAhead makes the store take k tasks in its next dequeue of queue.
func startAhead(idem *Idempotency, queue string, k int) {
	idem.ahead.mu.Lock()
	defer idem.ahead.mu.Unlock()
	idem.ahead.qs = map[string]*aheadQueue{queue: {k: k}}
}

// checkGivenBack checks that the tasks ids of queue, taken ahead by idem,
// are back where asynq's dequeue takes them first, in order, no longer
// marked as held.
func checkGivenBack(t *testing.T, rdb redis.UniversalClient, idem *Idempotency, queue string, ids []string) {
	t.Helper()
	p := "asynq:{" + queue + "}:"
	for _, id := range ids {
		if rdb.HExists(ctx, heldKey(queue), id).Val() {
			t.Errorf("task %s given back, still marked as held", id)
		}
		if st := rdb.HGet(ctx, p+"t:"+id, "state").Val(); st != "pending" {
			t.Errorf("task %s given back in state %q", id, st)
		}
		if rdb.HExists(ctx, p+"t:"+id, "pending_since").Val() != true {
			t.Errorf("task %s given back without pending_since", id)
		}
		if _, err := rdb.ZScore(ctx, p+"lease", id).Result(); err != redis.Nil {
			t.Errorf("task %s given back, still leased (%v)", id, err)
		}
	}
	for _, id := range ids {
		reply, err := dequeueOn(rdb, queue) // asynq's own dequeue
		if msg, ok := reply.(string); err != nil || !ok || !strings.Contains(msg, id) {
			t.Fatalf("asynq's dequeue after the give back: %v, %v; want task %s", reply, err, id)
		}
	}
}

// Tasks taken ahead that asynq does not ask for within the hold go back
// to the queue, where asynq's next dequeue takes them first, in order,
// their marks gone; the next dequeues take half as many. Close
// gives back at once those it still holds.
func TestTakenAheadGoBack(t *testing.T) {
	t.Parallel()
	rdb := newClient(t)
	idem := newIdem(t, rdb, IdempotencyOptions{Lease: time.Minute})
	idem.ahead.hold = time.Minute // the test gives back itself, as the timer does
	idem.handled("t")
	queue := testQueue(t)
	ids := seqIDs("b", 10)
	enqueueIDs(t, queue, ids...)
	startAhead(idem, queue, 8)
	c := idem.AsynqClient()
	reply, err := dequeueOn(c, queue)
	if msg, ok := reply.(string); err != nil || !ok || !strings.Contains(msg, ids[0]) {
		t.Fatalf("dequeue: %v, %v", reply, err)
	}
	p := "asynq:{" + queue + "}:"
	if n := rdb.LLen(ctx, p+"active").Val(); n != 8 {
		t.Fatalf("%d tasks active after a dequeue that takes 8", n)
	}
	for _, id := range ids[:8] {
		if !rdb.HExists(ctx, heldKey(queue), id).Val() {
			t.Fatalf("task %s taken ahead without its mark", id)
		}
	}
	idem.ahead.giveBack(queue, 0)
	if !rdb.HExists(ctx, heldKey(queue), ids[0]).Val() {
		t.Errorf("the mark of the task asynq got went")
	}
	checkGivenBack(t, rdb, idem, queue, ids[1:])
	idem.ahead.mu.Lock()
	k := idem.ahead.qs[queue].k
	idem.ahead.mu.Unlock()
	if k != 4 {
		t.Errorf("after a give back the next dequeue takes %d, want 4", k)
	}

	// The timer gives back once the hold has run out.
	idem3 := newIdem(t, rdb, IdempotencyOptions{Lease: time.Minute})
	idem3.handled("t")
	ids = seqIDs("e", 3)
	enqueueIDs(t, queue, ids...)
	startAhead(idem3, queue, 8)
	start := time.Now()
	if _, err := dequeueOn(idem3.AsynqClient(), queue); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "the tasks given back", func() bool { return rdb.LLen(ctx, p+"pending").Val() == 2 })
	if d := time.Since(start); d < idem3.ahead.hold {
		t.Errorf("given back after %v, before the hold (%v)", d, idem3.ahead.hold)
	}
	checkGivenBack(t, rdb, idem3, queue, ids[1:])

	// Close gives back at once.
	idem2 := newIdem(t, rdb, IdempotencyOptions{Lease: time.Minute})
	idem2.ahead.hold = time.Minute
	idem2.handled("t")
	ids = seqIDs("c", 5)
	enqueueIDs(t, queue, ids...)
	startAhead(idem2, queue, 8)
	if _, err := dequeueOn(idem2.AsynqClient(), queue); err != nil {
		t.Fatal(err)
	}
	// One no longer active (asynq's recovery moved it) stays where it is.
	must(t, rdb.LRem(ctx, p+"active", 0, ids[4]).Err())
	must(t, rdb.HSet(ctx, p+"t:"+ids[4], "state", "retry").Err())
	must(t, idem2.Close())
	if st := rdb.HGet(ctx, p+"t:"+ids[4], "state").Val(); st != "retry" {
		t.Errorf("a task no longer active given back: state %q", st)
	}
	checkGivenBack(t, rdb, idem2, queue, ids[1:4])
	if n := rdb.LLen(ctx, p+"pending").Val(); n != 0 {
		t.Errorf("%d tasks pending after the given back were taken, want 0", n)
	}
}

// With a Key function of the user's and on a Redis Cluster (whose slots
// keep asynq's keys and the store's apart) the dequeue takes tasks ahead
// all the same: fewer dequeues than tasks, each task once and in order, no
// run record written (the marks sit in the queue's slot); those not asked
// for go back. Under the middleware each task's run begins in the
// handler, and runs once.
func TestTakeAheadBeginsNone(t *testing.T) {
	t.Parallel()
	srv, cc := oneNodeCluster(t)
	byPayload := func(_ context.Context, task *asynq.Task) (string, error) { return "p-" + string(task.Payload()), nil }
	for _, c := range []struct {
		name string
		rdb  redis.UniversalClient
		addr string
		opts IdempotencyOptions
	}{
		{"Key", newClient(t), testAddr, IdempotencyOptions{Lease: time.Minute, Key: byPayload}},
		{"cluster", cc, srv.Addr, IdempotencyOptions{Lease: time.Minute, Prefix: "zt-run:"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			idem := newIdem(t, c.rdb, c.opts)
			idem.ahead.hold = time.Minute // the test gives back itself
			calls := &scriptCalls{sha: dequeueScript.Hash()}
			c.rdb.AddHook(calls)
			idem.handled("t")
			queue := testQueue(t)
			ac := asynq.NewClientFromRedisClient(c.rdb)
			enqueue := func(ids []string) {
				for _, id := range ids {
					_, err := ac.Enqueue(asynq.NewTask("t", []byte(id)), asynq.Queue(queue), asynq.TaskID(id))
					must(t, err)
				}
			}
			ids := seqIDs("n", 10)
			enqueue(ids)
			for _, id := range ids {
				reply, err := dequeueOn(idem.AsynqClient(), queue)
				if msg, ok := reply.(string); err != nil || !ok || !strings.Contains(msg, id) {
					t.Fatalf("dequeue: %v, %v; want task %s", reply, err, id)
				}
				if n := c.rdb.Exists(ctx, idem.recordKey(id), idem.recordKey("p-"+id)).Val(); n != 0 {
					t.Fatalf("task %s: a run record written in the dequeue", id)
				}
			}
			// 1, 2, 4, then the 3 left.
			if n := calls.n.Load(); n != 4 {
				t.Errorf("%d dequeues reached Redis for 10 tasks, want 4", n)
			}

			ids = seqIDs("g", 4)
			enqueue(ids)
			startAhead(idem, queue, 4)
			if _, err := dequeueOn(idem.AsynqClient(), queue); err != nil {
				t.Fatal(err)
			}
			idem.ahead.giveBack(queue, 0)
			checkGivenBack(t, c.rdb, idem, queue, ids[1:])

			// Under the middleware, on a server of the store's AsynqClient.
			var mu sync.Mutex
			runs := map[string]int{}
			h := idem.Middleware()(asynq.HandlerFunc(func(ctx context.Context, _ *asynq.Task) error {
				e, _ := ExecutionFromContext(ctx)
				mu.Lock()
				defer mu.Unlock()
				runs[e.Key]++
				return nil
			}))
			startAsynqOn(t, idem.AsynqClient(), c.addr, queue, h, asynq.Config{Concurrency: 8})
			ids = seqIDs("s", 40)
			enqueue(ids)
			dequeues := calls.n.Load()
			waitProgress(t, 5*time.Second, "tasks run", len(ids), func() int {
				mu.Lock()
				defer mu.Unlock()
				return len(runs)
			}, nil)
			mu.Lock()
			defer mu.Unlock()
			want := func(id string) string {
				if c.opts.Key != nil {
					return "p-" + id
				}
				return id
			}
			for _, id := range ids {
				if runs[want(id)] != 1 {
					t.Errorf("task %s ran %d times under key %q", id, runs[want(id)], want(id))
				}
			}
			t.Logf("%d dequeues reached Redis for %d tasks", calls.n.Load()-dequeues, len(ids))
		})
	}
}

// Several asynq servers on one queue, each on a store's AsynqClient of its
// own connections, with workers busy long enough that tasks taken ahead go
// back: each task's handler runs once, and no task is left active.
func TestTakeAheadServersShareQueue(t *testing.T) {
	t.Parallel()
	queue := testQueue(t)
	prefix := testKey(t) + ":run:"
	var mu sync.Mutex
	runs := map[string]int{}
	gives := make([]*scriptCalls, 3)
	for s := range gives {
		rdb := redis.NewClient(&redis.Options{Addr: testAddr, PoolSize: 8})
		t.Cleanup(func() { rdb.Close() })
		gives[s] = &scriptCalls{sha: givebackScript.Hash()}
		rdb.AddHook(gives[s])
		idem := newIdem(t, rdb, IdempotencyOptions{Prefix: prefix, Lease: 2 * time.Second})
		h := idem.Middleware()(asynq.HandlerFunc(func(ctx context.Context, task *asynq.Task) error {
			id, _ := asynq.GetTaskID(ctx)
			mu.Lock()
			runs[id]++
			mu.Unlock()
			if rand.IntN(3) == 0 {
				time.Sleep(time.Duration(5+rand.IntN(40)) * time.Millisecond)
			}
			return nil
		}))
		startAsynqOn(t, idem.AsynqClient(), testAddr, queue, h, asynq.Config{Concurrency: 3})
	}
	ids := seqIDs("d", 300)
	enqueueIDs(t, queue, ids...)
	count := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(runs)
	}
	waitProgress(t, 5*time.Second, "tasks run", len(ids), count, nil)
	p := "asynq:{" + queue + "}:"
	rdb := newClient(t)
	waitFor(t, 5*time.Second, "no task active", func() bool { return rdb.LLen(ctx, p+"active").Val() == 0 })
	mu.Lock()
	defer mu.Unlock()
	for _, id := range ids {
		if runs[id] != 1 {
			t.Errorf("task %s ran %d times", id, runs[id])
		}
	}
	var n int64
	for _, g := range gives {
		n += g.n.Load()
	}
	t.Logf("give backs: %d", n)
	if n == 0 {
		t.Errorf("no task taken ahead went back: the test did not test that")
	}
	if l := rdb.LLen(ctx, p+"pending").Val(); l != 0 {
		t.Errorf("%d tasks left pending", l)
	}
}

// What a store takes ahead, against a model: asynq gets each task once,
// from next or the queue after a give back, in the order taken; a
// dequeue takes k, which doubles up to its most when asynq asked for
// all a full dequeue took, and halves on a give back.
func TestAheadModel(t *testing.T) {
	t.Parallel()
	rapid.Check(t, func(rt *rapid.T) {
		most := rapid.IntRange(1, MaxTakeAhead).Draw(rt, "most")
		a := ahead{most: most}
		var held []string // the model's tasks taken ahead
		k, batch, gen, seq := 1, 0, uint64(0), 0
		var seen []string // asynq's tasks, and those given back, in order
		var taken []string
		for range rapid.IntRange(1, 60).Draw(rt, "steps") {
			if rapid.IntRange(0, 4).Draw(rt, "op") == 0 { // the hold ran out
				g := gen
				if rapid.Bool().Draw(rt, "stale") {
					g-- // an earlier dequeue's timer: nothing goes back
				}
				ts, _, _ := a.takeBack("q", g)
				if g == gen && len(held) > 0 {
					k = max(1, k/2)
				} else if len(ts) > 0 {
					rt.Fatalf("gave back %d tasks of generation %d, at %d", len(ts), g, gen)
				}
				for _, x := range ts {
					seen = append(seen, x.id)
				}
				if g == gen {
					held = nil
				}
				continue
			}
			tt, ok, kk := a.next("q")
			if ok != (len(held) > 0) {
				rt.Fatalf("next: ok %v with %d held", ok, len(held))
			}
			if ok {
				if tt.id != held[0] {
					rt.Fatalf("next gave %s, want %s", tt.id, held[0])
				}
				seen = append(seen, tt.id)
				if held = held[1:]; len(held) == 0 && batch == k {
					k = min(2*k, most)
				}
				continue
			}
			if kk != k {
				rt.Fatalf("a dequeue takes %d, want %d", kk, k)
			}
			n := rapid.IntRange(1, kk).Draw(rt, "n")
			var rest []takenTask
			for j := range n {
				seq++
				id := fmt.Sprint(seq)
				taken = append(taken, id)
				if j == 0 {
					seen = append(seen, id)
				} else {
					rest = append(rest, takenTask{id: id})
					held = append(held, id)
				}
			}
			gen = a.took("q", []string{"p", "x", "a", "l"}, "t:", kk, n, rest)
			batch = n
			if n == 1 && kk == 1 {
				k = min(2*k, most)
			}
		}
		for _, x := range held {
			seen = append(seen, x)
		}
		if fmt.Sprint(seen) != fmt.Sprint(taken) {
			rt.Fatalf("tasks out %v, taken %v", seen, taken)
		}
	})
}
