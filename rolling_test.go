package zclaim

import (
	"context"
	"log/slog"
	"os/exec"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
)

// A rolling deploy: a worker process with the middleware holds n tasks
// mid-handler and is SIGKILLed; a server with the middleware and a plain
// asynq server without it serve the same queue. Each dead run is taken
// over within Lease + 1 s (two seconds more for a loaded machine) and
// runs again once, on whichever server takes it, counted by a sink that
// does not dedupe. The takeover puts the task itself back on its queue:
// asynq then holds each task completed, and no second task of the work
// (a copy, or an original left active) remains for asynq's recovery to
// run again on a plain server later, as asynq alone would run it once
// more after the kill and never twice.
func TestRollingDeployNeverWorse(t *testing.T) {
	t.Parallel()
	const lease, n = time.Second, 10 // the victim has 10 workers
	rdb := newClient(t)
	q := testQueue(t)
	key := testKey(t)
	prefix, sink := key+":run:", key+":sink"
	victim := victimHolding(t, rdb, testAddr, false, q, prefix, sink, lease, "1", "", "rd-", n)

	var mu sync.Mutex
	ran := map[string][]string{} // task id: the servers that ran it after the kill
	note := func(who string) asynq.Handler {
		return asynq.HandlerFunc(func(ctx context.Context, _ *asynq.Task) error {
			id, _ := asynq.GetTaskID(ctx)
			mu.Lock()
			ran[id] = append(ran[id], who)
			mu.Unlock()
			return nil
		})
	}
	idem := newIdem(t, rdb, IdempotencyOptions{Prefix: prefix, Lease: lease, TakeoverQueues: []string{q},
		Logger: slog.New(slog.DiscardHandler)})
	mw := idem.Middleware()
	mw(note("middleware")).ProcessTask(ctx, asynq.NewTask("work", nil)) // learns the type (its key fails: no task id)
	cfg := asynq.Config{IsFailure: IsFailure, RetryDelayFunc: RetryDelay, Concurrency: n}
	startAsynq(t, testAddr, q, mw(note("middleware")), cfg)
	startAsynq(t, testAddr, q, note("plain"), cfg)

	must(t, victim.Process.Kill())
	killed := time.Now()
	victim.Wait()
	var took time.Duration
	waitFor(t, 20*time.Second, "every task to run again", func() bool {
		mu.Lock()
		defer mu.Unlock()
		took = time.Since(killed)
		return len(ran) == n
	})
	time.Sleep(4 * lease) // a second takeover, if any, runs by now
	mu.Lock()
	defer mu.Unlock()
	servers := map[string]int{}
	for id, who := range ran {
		if len(who) != 1 {
			t.Fatalf("%s ran %v after the kill; want once", id, who)
		}
		servers[who[0]]++
	}
	t.Logf("every task ran again %v after the kill (Lease %v), by %v", took.Round(time.Millisecond), lease, servers)
	if took > lease+3*time.Second {
		t.Fatalf("the last task ran again %v after the kill; want within Lease + 1 s, and 2 s for a loaded machine", took)
	}
	in := newInspector(t)
	for k := range n {
		ti, err := in.GetTaskInfo(q, "rd-"+strconv.Itoa(k))
		must(t, err)
		if ti.State != asynq.TaskStateCompleted || ti.Retried != 0 {
			t.Fatalf("task %s: %v, retried %d; want completed, no retry spent", ti.ID, ti.State, ti.Retried)
		}
	}
	for _, list := range []func(string, ...asynq.ListOption) ([]*asynq.TaskInfo, error){
		in.ListActiveTasks, in.ListPendingTasks, in.ListRetryTasks} {
		if tasks, err := list(q); err != nil || len(tasks) != 0 {
			t.Fatalf("queue %s still holds %d tasks (error %v); want none left for asynq's recovery", q, len(tasks), err)
		}
	}
}

// A worker process on the store's AsynqClient (the quick start's server)
// takes n tasks and is SIGKILLed before their runs begin (they wait in a
// middleware ahead of zclaim's), with the default key and with a Key
// function of the user's (whose tasks the dequeue takes, ahead too,
// without beginning their runs). No run record says the worker died, and
// asynq's lease of each task is fresh for 30 s: the dequeue marked each
// task as the process's, and the process stopped beating. A live process
// runs each again within Lease + 1 s of the kill (2 s more for a loaded
// machine), once, resumed by no one (no run began).
func TestTakeoverBeforeBegin(t *testing.T) {
	t.Parallel()
	for _, key := range []string{"", "payload"} {
		t.Run("key="+key, func(t *testing.T) {
			t.Parallel()
			takeoverBeforeBegin(t, newClient(t), testAddr, false, key)
		})
	}
	// On a Redis Cluster of three masters, where the marks sit in the
	// queue's slot and the live set in the store's.
	t.Run("cluster", func(t *testing.T) {
		t.Parallel()
		cl := ownCluster(t, 3, 0)
		takeoverBeforeBegin(t, cl.Client(), cl.Addrs()[0], true, "payload")
	})
}

func takeoverBeforeBegin(t *testing.T, rdb redis.UniversalClient, addr string, cluster bool, key string) {
	const lease, n = time.Second, 6
	q := testQueue(t)
	k := testKey(t)
	prefix, sink := k+":run:", k+":sink"
	victim := victimHolding(t, rdb, addr, cluster, q, prefix, sink, lease, "outer+ac", key, "tb-", n)
	var keyFn func(context.Context, *asynq.Task) (string, error)
	if key == "payload" {
		keyFn = payloadKey
	}
	var mu sync.Mutex
	ran := map[string]int{}
	idem := newIdem(t, rdb, IdempotencyOptions{Prefix: prefix, Lease: lease, TakeoverQueues: []string{q}, Key: keyFn,
		Logger: slog.New(slog.DiscardHandler)})
	live := idem.Middleware()(asynq.HandlerFunc(func(ctx context.Context, _ *asynq.Task) error {
		if id, ok := asynq.GetTaskID(ctx); ok {
			mu.Lock()
			ran[id]++
			mu.Unlock()
		}
		return nil
	}))
	live.ProcessTask(ctx, asynq.NewTask("work", []byte("learn"))) // learns the type
	startAsynqOn(t, rdb, addr, q, live, asynq.Config{IsFailure: IsFailure, RetryDelayFunc: RetryDelay, Concurrency: n})
	if h, err := rdb.HLen(ctx, heldKey(q)).Result(); err != nil || h != n {
		t.Fatalf("%d tasks marked as held (error %v), want %d", h, err, n)
	}
	must(t, victim.Process.Kill())
	killed := time.Now()
	victim.Wait()
	took := ranOnceEach(t, &mu, ran, n, killed, lease)
	t.Logf("every task ran again %v after the kill (Lease %v)", took.Round(time.Millisecond), lease)
	if took > lease+3*time.Second {
		t.Fatalf("the last task ran again %v after the kill; want within Lease + 1 s, and 2 s for a loaded machine", took)
	}
	if h, err := rdb.HLen(ctx, heldKey(q)).Result(); err != nil || h != 0 {
		t.Fatalf("%d holder marks left (error %v), want none", h, err)
	}
}

// No process alive: a worker on the store's AsynqClient holds n tasks,
// mid-handler (their runs begun) or before Begin, and is SIGKILLed, and
// no process of the store lives for a Lease after. The first process to
// start takes every task over at its first pass (a quarter of its Lease),
// before its middleware has handled any task of their type, and runs each
// once, where asynq alone would wait out its 30 s lease and a recoverer's
// minute.
func TestTakeoverFirstProcess(t *testing.T) {
	t.Parallel()
	for _, block := range []string{"1+ac", "outer+ac"} {
		t.Run(block, func(t *testing.T) {
			t.Parallel()
			const lease, n = time.Second, 6
			rdb := newClient(t)
			q := testQueue(t)
			k := testKey(t)
			prefix, sink := k+":run:", k+":sink"
			victim := victimHolding(t, rdb, testAddr, false, q, prefix, sink, lease, block, "", "fp-", n)
			must(t, victim.Process.Kill())
			victim.Wait()
			time.Sleep(lease + 200*time.Millisecond) // no process lives meanwhile
			var mu sync.Mutex
			ran := map[string]int{}
			started := time.Now()
			idem := newIdem(t, rdb, IdempotencyOptions{Prefix: prefix, Lease: lease, TakeoverQueues: []string{q},
				Logger: slog.New(slog.DiscardHandler)})
			startAsynq(t, testAddr, q, idem.Middleware()(asynq.HandlerFunc(func(ctx context.Context, _ *asynq.Task) error {
				id, _ := asynq.GetTaskID(ctx)
				mu.Lock()
				ran[id]++
				mu.Unlock()
				return nil
			})), asynq.Config{IsFailure: IsFailure, RetryDelayFunc: RetryDelay, Concurrency: n})
			took := ranOnceEach(t, &mu, ran, n, started, lease)
			t.Logf("every task ran again %v after the first process started", took.Round(time.Millisecond))
			if bound := takeoverInterval(lease) + time.Second; took > bound+2*time.Second {
				t.Fatalf("the last task ran %v after the first process started; want within a pass and a second (%v), "+
					"and 2 s for a loaded machine", took, bound)
			}
		})
	}
}

// ranOnceEach waits until ran (under mu) counts n tasks, then a while for
// any second run, and fails unless each ran once; it returns how long
// after since the last one first ran.
func ranOnceEach(t *testing.T, mu *sync.Mutex, ran map[string]int, n int, since time.Time, lease time.Duration) time.Duration {
	t.Helper()
	var took time.Duration
	waitFor(t, 25*time.Second, "every task to run again", func() bool {
		mu.Lock()
		defer mu.Unlock()
		took = time.Since(since)
		return len(ran) == n
	})
	time.Sleep(3 * lease)
	mu.Lock()
	defer mu.Unlock()
	for id, c := range ran {
		if c != 1 {
			t.Fatalf("%s ran %d times, want once", id, c)
		}
	}
	return took
}

// victimHolding starts a worker process (startWorkerAt) and has it take n
// tasks of queue q, TaskIDs ids + 0, 1, ..., payloads "p0", "p1", ...,
// kept by asynq for an hour once done; it returns once the worker noted
// each in sink.
func victimHolding(t *testing.T, rdb redis.UniversalClient, addr string, cluster bool, q, prefix, sink string,
	lease time.Duration, block, key, ids string, n int) *exec.Cmd {
	t.Helper()
	victim := startWorkerAt(t, addr, cluster, q, prefix, sink, lease, block, key)
	c := asynq.NewClientFromRedisClient(rdb)
	for j := range n {
		_, err := c.Enqueue(asynq.NewTask("work", []byte("p"+strconv.Itoa(j))), asynq.Queue(q),
			asynq.TaskID(ids+strconv.Itoa(j)), asynq.Retention(time.Hour))
		must(t, err)
	}
	waitFor(t, 20*time.Second, "the victim to take every task", func() bool {
		return len(runsNoted(t, rdb, sink)) == n
	})
	return victim
}
