package zclaim

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
)

// completes notes how a client sends complete.lua (sha): alone, or in a
// pipeline ahead of asynq's done of the run's task, or in done.lua (done)
// with it (the run's record key then maps to the task key the done named).
type completes struct {
	sha, done string
	mu        sync.Mutex
	lone      []string          // record keys
	fused     map[string]bool   // record keys completed in done.lua
	with      map[string]string // record key -> asynq's task key in the same pipeline
}

func (c *completes) DialHook(next redis.DialHook) redis.DialHook { return next }

func (c *completes) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if k, ok := c.record(cmd); ok {
			c.mu.Lock()
			c.lone = append(c.lone, k)
			c.mu.Unlock()
		}
		if a := cmd.Args(); len(a) > 3 && (a[1] == c.done || a[0] == "eval" && strings.Contains(a[1].(string), "local function complete(KEYS, ARGV)")) {
			n, _ := a[2].(int)
			keys := make([]string, n)
			for j := range keys {
				keys[j], _ = a[3+j].(string)
			}
			k, _ := a[3+n].(int)   // complete.lua's keys
			m, _ := a[3+n+1].(int) // and arguments
			c.mu.Lock()
			c.with[keys[0]], _ = asynqDoneKey(keys[k:], a[3+n+2+m:])
			c.fused[keys[0]] = true // once, whether its EVALSHA met NOSCRIPT and it went again as EVAL or not
			c.mu.Unlock()
		}
		return next(ctx, cmd)
	}
}

func (c *completes) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		c.mu.Lock()
		for j, cmd := range cmds {
			k, ok := c.record(cmd)
			if !ok {
				continue
			}
			task := ""
			if j+1 < len(cmds) {
				task = asynqDone(cmds[j+1])
			}
			if task == "" {
				c.lone = append(c.lone, k)
				continue
			}
			c.with[k] = task
		}
		c.mu.Unlock()
		return next(ctx, cmds)
	}
}

// asynqDone is the task key of a call of asynq's done or mark as
// complete, else "".
func asynqDone(cmd redis.Cmder) string {
	a := cmd.Args()
	if len(a) < 3 || a[0] != "evalsha" && a[0] != "eval" {
		return ""
	}
	n, _ := a[2].(int)
	var keys []string
	for _, k := range a[3:min(3+n, len(a))] {
		s, _ := k.(string)
		keys = append(keys, s)
	}
	task, _ := asynqDoneKey(keys, a[min(3+n, len(a)):])
	return task
}

// record is the record key of a call of complete.lua.
func (c *completes) record(cmd redis.Cmder) (string, bool) {
	a := cmd.Args()
	if len(a) < 4 || a[0] != "evalsha" || a[1] != c.sha {
		return "", false
	}
	k, _ := a[3].(string)
	return k, true
}

// On the store's AsynqClient, an asynq server's successful tasks have
// their runs completed in one pipeline with asynq's done of each task
// (done, done with a unique key, mark as complete), and each task's work
// is finished once: with the runs' histories, and without (NoHistory: one
// key fewer for done.lua's Complete).
func TestAsynqClientCompletesWithDone(t *testing.T) {
	t.Parallel()
	for _, noHistory := range []bool{false, true} {
		t.Run(fmt.Sprint("NoHistory=", noHistory), func(t *testing.T) {
			t.Parallel()
			asynqClientCompletesWithDone(t, noHistory)
		})
	}
}

func asynqClientCompletesWithDone(t *testing.T, noHistory bool) {
	rdb := redis.NewClient(&redis.Options{Addr: testAddr})
	t.Cleanup(func() { rdb.Close() })
	c := &completes{with: map[string]string{}, fused: map[string]bool{}}
	rdb.AddHook(c)
	// A Complete waits for its done up to 1.25 s.
	idem := newIdem(t, rdb, IdempotencyOptions{Lease: 5 * time.Second, NoHistory: noHistory})
	c.sha, c.done = idem.complete.Hash(), idem.done.Hash()
	queue := testQueue(t)
	var mu sync.Mutex
	runs := map[string]int{}
	h := idem.Middleware()(asynq.HandlerFunc(func(ctx context.Context, task *asynq.Task) error {
		id, _ := asynq.GetTaskID(ctx)
		mu.Lock()
		runs[id]++
		mu.Unlock()
		return nil
	}))
	startAsynqOn(t, idem.AsynqClient(), testAddr, queue, h, asynq.Config{Concurrency: 16})
	cl := newAsynqClient(t, testAddr)
	enqueue := func(id string, k int) {
		opts := []asynq.Option{asynq.Queue(queue), asynq.TaskID(id)}
		if k%4 == 1 || k%4 == 3 {
			opts = append(opts, asynq.Retention(time.Minute)) // asynq's mark as complete
		}
		if k%4 >= 2 {
			opts = append(opts, asynq.Unique(time.Minute)) // with a unique key
		}
		_, err := cl.Enqueue(asynq.NewTask("t", []byte(id)), opts...)
		must(t, err)
	}
	// The first done through the client tells the store that a server runs on it.
	enqueue("first", 0)
	waitFor(t, 10*time.Second, "the first task's run", func() bool { return idem.Stats().Completed == 1 })
	const n = 400
	for k := range n {
		enqueue(fmt.Sprintf("task-%d", k), k)
	}
	waitProgress(t, 5*time.Second, "completed runs", n+1, func() int { return int(idem.Stats().Completed) }, nil)

	c.mu.Lock()
	defer c.mu.Unlock()
	paired := 0
	for k := range n {
		id := fmt.Sprintf("task-%d", k)
		if runs[id] != 1 {
			t.Errorf("task %s ran %d times", id, runs[id])
		}
		if task, ok := c.with[idem.recordKey(id)]; ok {
			if want := asynqKey(queue, "t:"+id); task != want {
				t.Errorf("the Complete of %s went with asynq's done of %q, not of %q", id, task, want)
			}
			paired++
		}
		if _, err := idem.Begin(ctx, id); !errors.Is(err, ErrAlreadyDone) {
			t.Errorf("Begin of %s after its run: %v, want ErrAlreadyDone", id, err)
		}
	}
	// A Complete goes alone only when asynq's done did not come within
	// Lease/4 of its handler's return.
	if paired < n*9/10 {
		t.Errorf("%d of %d Completes went with asynq's done (%d alone)", paired, n, len(c.lone))
	}
	// asynq is v0.26: every pair is one call of done.lua, in place of
	// asynq's own script (asynqDones names its SHA1s).
	if len(c.fused) != paired {
		t.Errorf("%d of the %d Completes sent with asynq's done went in done.lua", len(c.fused), paired)
	}
	// asynq's records are those its own scripts make: the tasks kept
	// (Retention) completed, the others gone, the unique locks released,
	// every task counted processed.
	in := newInspector(t)
	q, err := in.GetQueueInfo(queue)
	must(t, err)
	if q.Processed != n+1 || q.ProcessedTotal != n+1 || q.Completed != n/2 || q.Active != 0 || q.Size != n/2 {
		t.Errorf("asynq's queue after the runs: %+v", q)
	}
	kept, err := in.ListCompletedTasks(queue, asynq.PageSize(n))
	must(t, err)
	for _, ti := range kept {
		state, err := rdb.HGet(ctx, asynqKey(queue, "t:"+ti.ID), "state").Result()
		if err != nil || state != "completed" || ti.CompletedAt.IsZero() || ti.Retention != time.Minute {
			t.Errorf("completed task %+v, state %q (%v)", ti, state, err)
		}
	}
	if locks, err := rdb.Keys(ctx, asynqKey(queue, "unique:*")).Result(); err != nil || len(locks) != 0 {
		t.Errorf("unique locks left: %v (%v)", locks, err)
	}
}

// heldStore returns a client, a store of lease on it, and a queue of the
// test's own whose dones the store takes to come through its AsynqClient:
// its middleware holds the Completes of that queue's tasks back.
func heldStore(t *testing.T, lease time.Duration) (*redis.Client, *Idempotency, string) {
	t.Helper()
	rdb := newClient(t)
	idem := newIdem(t, rdb, IdempotencyOptions{Lease: lease})
	queue := testQueue(t)
	idem.viaDone.Store(queue, true)
	return rdb, idem, queue
}

// A store whose AsynqClient carried an asynq done holds Completes back
// for theirs; a task whose server is on another client has its Complete
// sent alone Lease/4 after its handler returned.
func TestAsynqClientLateCompleteAlone(t *testing.T) {
	t.Parallel()
	_, idem, queue := heldStore(t, 80*time.Millisecond)
	h := idem.Middleware()(asynq.HandlerFunc(func(ctx context.Context, task *asynq.Task) error { return nil }))
	startAsynq(t, testAddr, queue, h, asynq.Config{Concurrency: 8})
	cl := newAsynqClient(t, testAddr)
	const n = 40
	for k := range n {
		_, err := cl.Enqueue(asynq.NewTask("t", nil), asynq.Queue(queue), asynq.TaskID(fmt.Sprintf("late-%d", k)))
		must(t, err)
	}
	waitProgress(t, 5*time.Second, "completed runs", n, func() int { return int(idem.Stats().Completed) }, nil)
	for k := range n {
		if _, err := idem.Begin(ctx, fmt.Sprintf("late-%d", k)); !errors.Is(err, ErrAlreadyDone) {
			t.Errorf("Begin of late-%d after its run: %v, want ErrAlreadyDone", k, err)
		}
	}
}

// Close sends the Completes held back, at once.
func TestAsynqClientCloseSendsLate(t *testing.T) {
	t.Parallel()
	_, idem, queue := heldStore(t, time.Minute) // held back 15 s
	h := idem.Middleware()(asynq.HandlerFunc(func(ctx context.Context, task *asynq.Task) error { return nil }))
	startAsynq(t, testAddr, queue, h, asynq.Config{Concurrency: 4})
	cl := newAsynqClient(t, testAddr)
	const n = 10
	for k := range n {
		_, err := cl.Enqueue(asynq.NewTask("t", nil), asynq.Queue(queue), asynq.TaskID(fmt.Sprintf("held-%d", k)),
			asynq.Retention(time.Minute))
		must(t, err)
	}
	in := newInspector(t)
	waitFor(t, 10*time.Second, "asynq's completed tasks", func() bool {
		q, err := in.GetQueueInfo(queue)
		return err == nil && q.Completed == n
	})
	if got := idem.Stats().Completed; got != 0 {
		t.Fatalf("%d runs completed before Close, want 0 (held back)", got)
	}
	must(t, idem.Close())
	if got := idem.Stats().Completed; got != n {
		t.Fatalf("%d runs completed after Close, want %d", got, n)
	}
}

// A Complete held back whose run lost its token is refused, changing
// nothing, and asynq's done of its task goes through all the same.
func TestAsynqClientLateCompleteFenced(t *testing.T) {
	t.Parallel()
	rdb, idem, queue := heldStore(t, time.Second)
	var later atomic.Int64
	h := idem.Middleware()(asynq.HandlerFunc(func(ctx context.Context, task *asynq.Task) error {
		e, _ := ExecutionFromContext(ctx)
		// Another run takes the key: the record goes, and a Begin makes one of a larger token.
		must(t, rdb.Del(ctx, idem.recordKey(e.Key)).Err())
		e2, err := idem.Begin(ctx, e.Key)
		must(t, err)
		later.Store(e2.Token)
		return nil
	}))
	startAsynqOn(t, idem.AsynqClient(), testAddr, queue, h, asynq.Config{})
	_, err := newAsynqClient(t, testAddr).Enqueue(asynq.NewTask("t", nil), asynq.Queue(queue), asynq.TaskID("fenced"))
	must(t, err)
	waitFor(t, 10*time.Second, "the lost lease", func() bool { return idem.Stats().LeaseLost == 1 })
	in := newInspector(t)
	waitFor(t, 10*time.Second, "asynq's done", func() bool {
		q, err := in.GetQueueInfo(queue)
		return err == nil && q.Processed == 1 && q.Active == 0 && q.Retry == 0
	})
	if s := idem.Stats(); s.Completed != 0 {
		t.Errorf("stats %+v: a fenced Complete counted", s)
	}
	_, err = idem.Begin(ctx, "fenced")
	var ip *InProgressError
	if !errors.As(err, &ip) {
		t.Errorf("Begin after the fenced Complete: %v, want the later run in progress", err)
	}
}

// done.lua writes asynq's processed counter as asynq's done does (from
// the largest int64 it goes back to 1), and a Complete that fails on a key
// of another type leaves asynq's done to go through.
func TestAsynqClientDoneEdges(t *testing.T) {
	t.Parallel()
	rdb, idem, queue := heldStore(t, time.Second)
	must(t, rdb.Set(ctx, asynqKey(queue, "processed"), int64(math.MaxInt64), 0).Err())
	h := idem.Middleware()(asynq.HandlerFunc(func(ctx context.Context, task *asynq.Task) error {
		if e, _ := ExecutionFromContext(ctx); e.Key == "wrongtype" { // its bucket of finished records is made a list
			return rdb.LPush(ctx, e.keys[1], "not a hash").Err()
		}
		return nil
	}))
	startAsynqOn(t, idem.AsynqClient(), testAddr, queue, h, asynq.Config{Concurrency: 1})
	cl := newAsynqClient(t, testAddr)
	for _, id := range []string{"counted", "wrongtype"} {
		_, err := cl.Enqueue(asynq.NewTask("t", nil), asynq.Queue(queue), asynq.TaskID(id))
		must(t, err)
	}
	in := newInspector(t)
	waitFor(t, 10*time.Second, "asynq's dones", func() bool {
		q, err := in.GetQueueInfo(queue)
		return err == nil && q.Processed == 2 && q.Size == 0
	})
	if got, err := rdb.Get(ctx, asynqKey(queue, "processed")).Int64(); err != nil || got != 2 {
		t.Errorf("processed counter %d (%v), want 2 (wrapped to 1, then 2)", got, err)
	}
	waitFor(t, 5*time.Second, "the first run's Complete", func() bool { return idem.Stats().Completed == 1 })
	if _, err := idem.Begin(ctx, "counted"); !errors.Is(err, ErrAlreadyDone) {
		t.Errorf("Begin of counted after its run: %v, want ErrAlreadyDone", err)
	}
	rec, err := rdb.Get(ctx, idem.recordKey("wrongtype")).Result()
	if err != nil || !strings.HasPrefix(rec, "run ") {
		t.Errorf("the run whose Complete failed: record %q (%v), want it running still", rec, err)
	}
}

// Completes wait for asynq's done only in the queues whose dones came
// through the store's AsynqClient: a server of another queue on a client
// of its own has its runs completed before the middleware returns.
func TestAsynqClientOtherQueue(t *testing.T) {
	t.Parallel()
	rdb := newClient(t)
	idem := newIdem(t, rdb, IdempotencyOptions{Lease: time.Minute}) // a Complete held back would wait 15 s
	via, other := testQueue(t), testQueue(t)
	var afterReturn []error // for each task of other: Begin of its key once the middleware returned
	var mu sync.Mutex
	mw := idem.Middleware()(asynq.HandlerFunc(func(ctx context.Context, task *asynq.Task) error { return nil }))
	h := asynq.HandlerFunc(func(ctx context.Context, task *asynq.Task) error {
		err := mw.ProcessTask(ctx, task)
		if q, _ := asynq.GetQueueName(ctx); q == other {
			id, _ := asynq.GetTaskID(ctx)
			_, berr := idem.Begin(ctx, id)
			mu.Lock()
			afterReturn = append(afterReturn, berr)
			mu.Unlock()
		}
		return err
	})
	startAsynqOn(t, idem.AsynqClient(), testAddr, via, h, asynq.Config{})
	startAsynq(t, testAddr, other, h, asynq.Config{})
	cl := newAsynqClient(t, testAddr)
	_, err := cl.Enqueue(asynq.NewTask("t", nil), asynq.Queue(via), asynq.TaskID("via"))
	must(t, err)
	waitFor(t, 10*time.Second, "the done of via's task", func() bool { _, ok := idem.viaDone.Load(via); return ok })
	const n = 5
	for k := range n {
		_, err := cl.Enqueue(asynq.NewTask("t", nil), asynq.Queue(other), asynq.TaskID(fmt.Sprintf("other-%d", k)))
		must(t, err)
	}
	waitFor(t, 10*time.Second, "the other queue's tasks", func() bool { mu.Lock(); defer mu.Unlock(); return len(afterReturn) == n })
	mu.Lock()
	defer mu.Unlock()
	for k, err := range afterReturn {
		if !errors.Is(err, ErrAlreadyDone) {
			t.Errorf("task %d of the other queue: Begin once the middleware returned: %v, want ErrAlreadyDone", k, err)
		}
	}
}

// An error in asynq's part of done.lua (here its day's counter of another
// type) is asynq's reply, as its own script's would be; the Complete
// before it counts as made, and is not sent again.
func TestAsynqClientDoneAsynqError(t *testing.T) {
	t.Parallel()
	rdb, idem, queue := heldStore(t, 200*time.Millisecond)
	now := time.Now().UTC()
	for _, d := range []time.Time{now, now.Add(time.Hour)} { // the day asynq names, should it turn meanwhile
		must(t, rdb.LPush(ctx, asynqKey(queue, "processed:"+d.Format("2006-01-02")), "not a counter").Err())
	}
	h := idem.Middleware()(asynq.HandlerFunc(func(ctx context.Context, task *asynq.Task) error { return nil }))
	startAsynqOn(t, idem.AsynqClient(), testAddr, queue, h, asynq.Config{Concurrency: 1})
	_, err := newAsynqClient(t, testAddr).Enqueue(asynq.NewTask("t", nil), asynq.Queue(queue), asynq.TaskID("run"))
	must(t, err)
	waitFor(t, 10*time.Second, "the run's Complete", func() bool { return idem.Stats().Completed == 1 })
	time.Sleep(300 * time.Millisecond) // six times Lease/4: a Complete held again would have gone
	if s := idem.Stats(); s.Completed != 1 || s.LeaseLost != 0 {
		t.Errorf("stats %+v, want one Complete and no lost lease", s)
	}
	if _, err := idem.Begin(ctx, "run"); !errors.Is(err, ErrAlreadyDone) {
		t.Errorf("Begin after the run: %v, want ErrAlreadyDone", err)
	}
}
