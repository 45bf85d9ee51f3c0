package zclaim

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
)

// The asynq built into the tests is the one bulk writes for: else every
// test of bulk writes would test the Client instead.
func TestBulkAsynqVersion(t *testing.T) {
	t.Parallel()
	v := asynqVersion()
	if b, why := newBulk(newClient(t), v); b == nil {
		t.Fatalf("asynq %q: %s", v, why)
	}
	for _, v := range []string{"", "v0.25.1", "v0.27.0", "v1.26.0"} {
		if b, why := newBulk(newClient(t), v); b != nil || why == "" {
			t.Errorf("asynq %q: bulk writes (%v), want the Client", v, why)
		}
	}
}

// What bulk writes for a task is byte for byte what asynq's own Enqueue
// writes: its message, its hash's state and its place on the pending list.
func TestBulkWritesAsAsynqDoes(t *testing.T) {
	t.Parallel()
	rdb := newClient(t)
	ac := asynq.NewClientFromRedisClient(rdb)
	bk, _ := newBulk(rdb, knownAsynq+"0")
	q := testQueue(t)
	dl := time.Date(2031, 5, 6, 7, 8, 9, 0, time.UTC)
	cases := []struct {
		name    string
		payload []byte
		headers map[string]string
		opts    []asynq.Option
	}{
		{"bare", nil, nil, nil},
		{"payload", []byte(`{"order":731}`), nil, nil},
		{"header", []byte("p"), map[string]string{headerJob: "j 1 2"}, nil},
		{"empty header value", nil, map[string]string{"k": ""}, nil},
		{"retry", nil, nil, []asynq.Option{asynq.MaxRetry(3)}},
		{"no retry", nil, nil, []asynq.Option{asynq.MaxRetry(-4)}},
		{"timeout", nil, nil, []asynq.Option{asynq.Timeout(90*time.Second + time.Millisecond)}},
		{"deadline", nil, nil, []asynq.Option{asynq.Deadline(dl)}},
		{"deadline and timeout", nil, nil, []asynq.Option{asynq.Deadline(dl), asynq.Timeout(time.Minute)}},
		{"epoch deadline", nil, nil, []asynq.Option{asynq.Deadline(time.Unix(0, 0))}},
		{"deadline before 1970", nil, nil, []asynq.Option{asynq.Deadline(time.Unix(-5, 0))}},
		{"retention", nil, nil, []asynq.Option{asynq.Retention(91 * time.Second), nil}},
		{"all", []byte("é"), map[string]string{"a": "ü"}, []asynq.Option{asynq.MaxRetry(30), asynq.Timeout(time.Hour),
			asynq.Retention(time.Hour), asynq.Deadline(dl)}},
	}
	for i, c := range cases {
		id := fmt.Sprintf("order-%d@2026-12-01T15:09:33.084Z ü", i)
		task := asynq.NewTaskWithHeaders("order:reminder", c.payload, c.headers)
		opts := append([]asynq.Option{asynq.TaskID(id), asynq.Queue(q)}, c.opts...)
		if _, err := ac.Enqueue(task, opts...); err != nil {
			t.Fatalf("%s: asynq: %v", c.name, err)
		}
		tk, pk := "asynq:{"+q+"}:t:"+id, "asynq:{"+q+"}:pending"
		want := rdb.HGetAll(ctx, tk).Val()
		wantList := rdb.LRange(ctx, pk, 0, -1).Val()
		must(t, rdb.Del(ctx, tk, pk).Err())
		m, ok := message(task, opts)
		if !ok {
			t.Fatalf("%s: message refused the task", c.name)
		}
		w := &bulkWrite{}
		w.add(Claim{}, time.Time{}, time.Time{}, m)
		bk.write(ctx, w)
		must(t, w.tasks[0].err)
		got := rdb.HGetAll(ctx, tk).Val()
		if !bytes.Equal([]byte(got["msg"]), []byte(want["msg"])) {
			t.Errorf("%s: message\n%x, asynq's\n%x", c.name, got["msg"], want["msg"])
		}
		if got["state"] != want["state"] || len(got) != len(want) {
			t.Errorf("%s: hash %q, asynq's %q", c.name, got, want)
		}
		ns, _ := strconv.ParseInt(got["pending_since"], 10, 64)
		wns, _ := strconv.ParseInt(want["pending_since"], 10, 64)
		if d := time.Duration(ns - wns); d < 0 || d > 10*time.Second {
			t.Errorf("%s: pending_since %v after asynq's", c.name, d)
		}
		if list := rdb.LRange(ctx, pk, 0, -1).Val(); fmt.Sprint(list) != fmt.Sprint(wantList) {
			t.Errorf("%s: pending %q, asynq's %q", c.name, list, wantList)
		}
		must(t, rdb.Del(ctx, tk, pk).Err())
	}
	if !rdb.SIsMember(ctx, "asynq:queues", q).Val() {
		t.Error("the queue is not in asynq:queues")
	}
}

// One write: a task id asynq holds already, a new one, and the new one
// again; each answered as asynq's Enqueue one after the other would be.
func TestBulkConflicts(t *testing.T) {
	t.Parallel()
	rdb := newClient(t)
	bk, _ := newBulk(rdb, knownAsynq+"0")
	q := testQueue(t)
	if _, err := asynq.NewClientFromRedisClient(rdb).Enqueue(asynq.NewTask("t", []byte("first")), asynq.TaskID("a"), asynq.Queue(q)); err != nil {
		t.Fatal(err)
	}
	w := &bulkWrite{}
	for _, id := range []string{"a", "b", "b"} {
		m, _ := message(asynq.NewTask("t", []byte("bulk")), []asynq.Option{asynq.TaskID(id), asynq.Queue(q)})
		w.add(Claim{}, time.Time{}, time.Time{}, m)
	}
	bk.write(ctx, w)
	for i, want := range []bool{true, false, true} {
		if got := errors.Is(w.tasks[i].err, asynq.ErrTaskIDConflict); got != want || !got && w.tasks[i].err != nil {
			t.Errorf("task %d (%s): %v", i, w.tasks[i].m.id, w.tasks[i].err)
		}
	}
	if list := rdb.LRange(ctx, "asynq:{"+q+"}:pending", 0, -1).Val(); fmt.Sprint(list) != "[b a]" {
		t.Errorf("pending %q, want [b a]", list)
	}
	info, err := newInspector(t).GetTaskInfo(q, "a")
	must(t, err)
	if string(info.Payload) != "first" {
		t.Errorf("task a holds %q: overwritten", info.Payload)
	}
}

// Tasks of two queues, interleaved: one call per queue, both in one round
// trip, each queue's tasks
// in the order given (asynq works a pending list off from its far end).
func TestBulkQueues(t *testing.T) {
	t.Parallel()
	rdb := newClient(t)
	must(t, enqueueScript.Load(ctx, rdb).Err()) // a server that knows the script: one round trip
	calls := &evalCounter{}
	rdb.AddHook(calls)
	bk, _ := newBulk(rdb, knownAsynq+"0")
	q1, q2 := testQueue(t), testQueue(t)
	w := &bulkWrite{}
	for _, x := range [][2]string{{q1, "a"}, {q2, "b"}, {q1, "c"}, {q2, "d"}, {q1, "e"}} {
		m, _ := message(asynq.NewTask("t", nil), []asynq.Option{asynq.TaskID(x[1]), asynq.Queue(x[0])})
		w.add(Claim{}, time.Time{}, time.Time{}, m)
		w.tasks[len(w.tasks)-1].tag = len(w.tasks) - 1
	}
	bk.write(ctx, w)
	for _, task := range w.tasks {
		must(t, task.err)
	}
	if n, trips := calls.bulk.Load(), calls.bulkTrips.Load(); n != 2 || trips != 1 {
		t.Errorf("%d calls in %d round trips for two queues, want 2 in 1", n, trips)
	}
	for q, want := range map[string]string{q1: "[e c a]", q2: "[d b]"} {
		if list := rdb.LRange(ctx, "asynq:{"+q+"}:pending", 0, -1).Val(); fmt.Sprint(list) != want {
			t.Errorf("pending %q, want %s", list, want)
		}
	}
	for _, task := range w.tasks { // each still names its claim
		if want := map[string]int{"a": 0, "b": 1, "c": 2, "d": 3, "e": 4}[task.m.id]; task.tag != want {
			t.Errorf("task %s: tag %d, want %d", task.m.id, task.tag, want)
		}
	}
}

// Several headers: proto.Marshal writes a map in no set order, so the
// message is compared as asynq reads it back.
func TestBulkHeadersAsAsynqReadsThem(t *testing.T) {
	t.Parallel()
	rdb := newClient(t)
	bk, _ := newBulk(rdb, knownAsynq+"0")
	q := testQueue(t)
	h := map[string]string{"a": "1", "b": "", "zclaim-job": "x", "ü": "é"}
	task := asynq.NewTaskWithHeaders("t", []byte("p"), h)
	m, ok := message(task, []asynq.Option{asynq.TaskID("id1"), asynq.Queue(q)})
	if !ok {
		t.Fatal("message refused the task")
	}
	w := &bulkWrite{}
	w.add(Claim{}, time.Time{}, time.Time{}, m)
	bk.write(ctx, w)
	must(t, w.tasks[0].err)
	info, err := newInspector(t).GetTaskInfo(q, "id1")
	must(t, err)
	if fmt.Sprint(info.Headers) != fmt.Sprint(h) || info.Type != "t" || string(info.Payload) != "p" ||
		info.State != asynq.TaskStatePending || info.MaxRetry != 25 || info.Timeout != 30*time.Minute {
		t.Fatalf("asynq reads %+v", info)
	}
}

// What bulk leaves to asynq's Client: options asynq writes elsewhere or
// checks more, and what asynq refuses.
func TestBulkLeavesToTheClient(t *testing.T) {
	t.Parallel()
	task := asynq.NewTask("t", nil)
	id := asynq.TaskID("id")
	for name, opts := range map[string][]asynq.Option{
		"unique":       {id, asynq.Unique(time.Minute)},
		"process at":   {id, asynq.ProcessAt(time.Now().Add(time.Hour))},
		"process in":   {id, asynq.ProcessIn(time.Hour)},
		"group":        {id, asynq.Group("g")},
		"own option":   {id, ownOption{}},
		"blank queue":  {id, asynq.Queue(" ")},
		"blank id":     {asynq.TaskID(" ")},
		"no id":        {},
		"id not UTF-8": {asynq.TaskID("\xff")},
	} {
		if _, ok := message(task, opts); ok {
			t.Errorf("%s: written in bulk", name)
		}
	}
	bad := asynq.NewTaskWithHeaders("t", nil, map[string]string{"k": "\xff"})
	if _, ok := message(bad, []asynq.Option{id}); ok {
		t.Error("a header that is not UTF-8: written in bulk")
	}
}

type ownOption struct{}

func (ownOption) String() string         { return "own" }
func (ownOption) Type() asynq.OptionType { return asynq.QueueOpt }
func (ownOption) Value() any             { return "elsewhere" }

// evalCounter counts the scripts a client ran, alone or in pipelines:
// bulk's (by enqueue.lua's hash) and asynq's, and the round trips that
// carried bulk's. An EVALSHA that met NOSCRIPT (and went again as an EVAL)
// is not counted.
type evalCounter struct{ bulk, other, bulkTrips atomic.Int64 }

// count counts cmds, sent in one round trip, each with its error
// (errs[i]; a pipeline's commands hold theirs).
func (h *evalCounter) count(cmds []redis.Cmder, errs []error) {
	var bulk int64
	for i, cmd := range cmds {
		err := cmd.Err()
		if errs != nil {
			err = errs[i]
		}
		if (cmd.Name() == "evalsha" || cmd.Name() == "eval") && !redis.HasErrorPrefix(err, "NOSCRIPT") {
			if a := cmd.Args(); a[1] == enqueueScript.Hash() || a[1] == enqueueLua {
				bulk++
			} else {
				h.other.Add(1)
			}
		}
	}
	if bulk > 0 {
		h.bulk.Add(bulk)
		h.bulkTrips.Add(1)
	}
}

func (h *evalCounter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *evalCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		h.count([]redis.Cmder{cmd}, []error{err})
		return err
	}
}
func (h *evalCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		h.count(cmds, nil)
		return err
	}
}

// Dispatchers writing in bulk, four at once on one schedule, each on
// connections of its own, beside asynq's server under the middleware:
// every job runs exactly once, most tasks go many to a call, the tasks
// with an option bulk leaves to the Client go through it, and a job whose
// occurrence asynq already holds meets its TaskID.
func TestDispatcherBulk(t *testing.T) {
	t.Parallel()
	key, q, log := handledSetup(t)
	b := newBroker(t, BrokerOptions{Key: key, Lease: 2 * time.Second})
	jobs, ids := spreadJobs(t, b, 1200, 300*time.Millisecond)
	unique := func(j Job) bool { return strings.HasSuffix(j.ID, "7:reminder") }
	opts := func(j Job) []asynq.Option {
		o := []asynq.Option{asynq.Queue(q), asynq.MaxRetry(3)}
		if unique(j) {
			o = append(o, asynq.Unique(time.Minute))
		}
		return o
	}
	var counts []*evalCounter
	var dsps []*Dispatcher
	for range 4 {
		rdb := redis.NewClient(&redis.Options{Addr: testAddr})
		t.Cleanup(func() { rdb.Close() })
		ec := &evalCounter{}
		rdb.AddHook(ec)
		d, err := NewDispatcher(newBroker(t, BrokerOptions{Key: key, Lease: 2 * time.Second}),
			asynq.NewClientFromRedisClient(rdb), DispatcherOptions{AsynqRedis: rdb, TaskOptions: opts, Concurrency: 4, DefaultType: "reminder"})
		must(t, err)
		runDispatcher(t, d)
		counts, dsps = append(counts, ec), append(dsps, d)
	}
	must(t, b.Schedule(ctx, jobs...))
	waitProgress(t, 30*time.Second, "jobs handled", len(ids), log.count, nil)
	time.Sleep(100 * time.Millisecond) // room for a duplicate to show
	log.check(t, ids)
	var bulkCalls, clientCalls, enqueued, inBulk int64
	for i, d := range dsps {
		st := d.Stats()
		if st.Failed != 0 || st.Dead != 0 || st.Conflicts != 0 {
			t.Errorf("dispatcher %d: %+v", i, st)
		}
		enqueued, inBulk = enqueued+st.Enqueued, inBulk+st.InBulk
		bulkCalls += counts[i].bulk.Load()
		clientCalls += counts[i].other.Load()
	}
	nUnique := 0
	for _, j := range jobs {
		if unique(j) {
			nUnique++
		}
	}
	t.Logf("%d tasks: %d bulk calls, %d through the Client", enqueued, bulkCalls, clientCalls)
	if enqueued != int64(len(jobs)) || clientCalls != int64(nUnique) || bulkCalls == 0 || bulkCalls >= int64(len(jobs)-nUnique) {
		t.Fatalf("%d tasks enqueued of %d: %d bulk calls, %d through the Client (want %d)",
			enqueued, len(jobs), bulkCalls, clientCalls, nUnique)
	}
	if inBulk != enqueued-int64(nUnique) {
		t.Fatalf("%d tasks counted in bulk, want %d", inBulk, enqueued-int64(nUnique))
	}

	// The first job again, at the due time it ran for: the same
	// occurrence, which asynq still holds (the dispatcher's Retention).
	again := jobs[0]
	again.Type, again.Payload = "", nil
	must(t, b.rdb.Do(ctx, "ZADD", key, b.score(again.RunAt), again.ID).Err())
	waitFor(t, 20*time.Second, "the conflict", func() bool {
		var n int64
		for _, d := range dsps {
			n += d.Stats().Conflicts
		}
		return n == 1
	})
	time.Sleep(100 * time.Millisecond)
	log.check(t, ids)
}

// A bulk write that fails (asynq's Redis went away) gives every claim in
// it back with backoff; they are written once Redis answers again.
func TestDispatcherBulkFailure(t *testing.T) {
	t.Parallel()
	b := newBroker(t, BrokerOptions{Key: testKey(t), Lease: time.Second})
	q := testQueue(t)
	px := newProxy(t, testAddr)
	rdb := clientVia(t, px)
	calls := &evalCounter{}
	rdb.AddHook(calls)
	px.SetDown(true)
	const n = 200
	scheduleDueJobs(t, b, n, q)
	var mu sync.Mutex
	var errs []error
	d, err := NewDispatcher(b, asynq.NewClientFromRedisClient(rdb), DispatcherOptions{AsynqRedis: rdb,
		RecoveryInterval: 20 * time.Millisecond, EnqueueTimeout: 200 * time.Millisecond,
		OnDispatch: func(_ JobInfo, _ time.Duration, err error) {
			mu.Lock()
			errs = append(errs, err)
			mu.Unlock()
		}})
	must(t, err)
	runDispatcher(t, d)
	waitFor(t, 20*time.Second, "failed writes", func() bool { return d.Stats().Failed >= n })
	if st := d.Stats(); st.Enqueued != 0 {
		t.Fatalf("enqueued while asynq's Redis was down: %+v", st)
	}
	mu.Lock()
	for _, err := range errs {
		if err == nil || errors.Is(err, asynq.ErrTaskIDConflict) {
			t.Fatalf("a failed write reported %v", err)
		}
	}
	mu.Unlock()
	px.SetDown(false)
	waitFor(t, 30*time.Second, "every job enqueued", func() bool { return d.Stats().Enqueued == n })
	qi, err := newInspector(t).GetQueueInfo(q)
	must(t, err)
	if qi.Pending != n {
		t.Fatalf("asynq holds %d pending tasks, want %d", qi.Pending, n)
	}
	if calls.bulk.Load() == 0 || calls.other.Load() != 0 {
		t.Fatalf("%d bulk calls, %d through the Client: want bulk only", calls.bulk.Load(), calls.other.Load())
	}
	if st := d.Stats(); st.InBulk != n {
		t.Fatalf("%d of %d tasks counted in bulk: %+v", st.InBulk, n, st)
	}
	if st, _ := b.Stats(ctx); st.Dead != 0 {
		t.Fatalf("dead: %+v", st)
	}
}
