package zclaim

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/zclaim/zclaim/internal/logbuf"
	"github.com/zclaim/zclaim/internal/proc"
	"github.com/zclaim/zclaim/internal/wait"
	"google.golang.org/protobuf/encoding/protowire"
)

// workerRole makes the test binary a worker process of the quick start's
// shape (runWorkerRole, called from TestMain).
const workerRole = "ZCLAIM_TEST_WORKER"

// runWorkerRole runs this process as a worker if the environment says so:
// an asynq server on one queue whose handler, under the middleware, notes
// "<key> <pid>" in a list of the sink key and then blocks (ZT_BLOCK=1)
// until the process is killed.
func runWorkerRole() bool {
	if os.Getenv(workerRole) == "" {
		return false
	}
	addr, queue, prefix, sink := os.Getenv("ZT_REDIS"), os.Getenv("ZT_QUEUE"), os.Getenv("ZT_PREFIX"), os.Getenv("ZT_SINK")
	lease, _ := time.ParseDuration(os.Getenv("ZT_LEASE"))
	var rdb redis.UniversalClient = redis.NewClient(&redis.Options{Addr: addr})
	if os.Getenv("ZT_CLUSTER") == "1" {
		rdb = redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{addr}})
	}
	block, onClient := strings.CutSuffix(os.Getenv("ZT_BLOCK"), "+ac") // +ac: the server on the store's AsynqClient
	var keyFn func(context.Context, *asynq.Task) (string, error)
	if os.Getenv("ZT_KEY") == "payload" {
		keyFn = payloadKey
	}
	idem, err := NewIdempotency(rdb, IdempotencyOptions{Prefix: prefix, Lease: lease, TakeoverQueues: []string{queue},
		Key: keyFn, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	h := idem.Middleware()(noteRuns(rdb, sink, strconv.Itoa(os.Getpid()), block == "1"))
	switch block {
	case "outer":
		// Blocks before the middleware: the worker dies before Begin.
		inner := h
		h = asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
			id, _ := asynq.GetTaskID(ctx)
			rdb.RPush(ctx, sink, id+" outer false")
			<-ctx.Done()
			return inner.ProcessTask(ctx, t)
		})
	case "failed":
		// The handler fails, the middleware releases its run, and the
		// worker blocks before asynq records the failure: it dies there.
		note := noteRuns(rdb, sink, strconv.Itoa(os.Getpid()), false)
		inner := idem.Middleware()(asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
			if err := note.ProcessTask(ctx, t); err != nil {
				return err
			}
			return errors.New("zclaim test: the handler failed")
		}))
		h = asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
			err := inner.ProcessTask(ctx, t)
			<-ctx.Done()
			return err
		})
	}
	var ac redis.UniversalClient = rdb
	if onClient {
		ac = idem.AsynqClient()
	}
	srv := asynq.NewServerFromRedisClient(ac, asynq.Config{Queues: map[string]int{queue: 1}, Concurrency: 10,
		TaskCheckInterval: 10 * time.Millisecond, IsFailure: IsFailure, RetryDelayFunc: RetryDelay,
		Logger: quietLogger{}, LogLevel: asynq.FatalLevel})
	if err := srv.Run(h); err != nil {
		os.Exit(2)
	}
	return true
}

// noteRuns is the handler: it notes "<key> <who> <resumed>" in the sink
// list, then blocks if block is set.
func noteRuns(rdb redis.UniversalClient, sink, who string, block bool) asynq.Handler {
	return asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
		e, _ := ExecutionFromContext(ctx)
		if err := rdb.RPush(ctx, sink, fmt.Sprintf("%s %s %v", e.Key, who, e.Resumed)).Err(); err != nil {
			return err
		}
		if block {
			<-ctx.Done()
			return ctx.Err()
		}
		return nil
	})
}

// startWorker starts a worker process of the test binary, its Key
// function payloadKey (the task's payload) where key is "payload".
func startWorker(t *testing.T, queue, prefix, sink string, lease time.Duration, block string, key ...string) *exec.Cmd {
	t.Helper()
	return startWorkerAt(t, testAddr, false, queue, prefix, sink, lease, block, strings.Join(key, ""))
}

// startWorkerAt is startWorker on the server at addr, a node of a Redis
// Cluster where cluster is set.
func startWorkerAt(t *testing.T, addr string, cluster bool, queue, prefix, sink string, lease time.Duration,
	block, key string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cl := "0"
	if cluster {
		cl = "1"
	}
	cmd.Env = append(os.Environ(), workerRole+"=1", "ZT_REDIS="+addr, "ZT_QUEUE="+queue, "ZT_PREFIX="+prefix,
		"ZT_SINK="+sink, "ZT_LEASE="+lease.String(), "ZT_BLOCK="+block, "ZT_KEY="+key, "ZT_CLUSTER="+cl)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	proc.DieWithParent(cmd)
	must(t, cmd.Start())
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		if stderr.Len() > 0 {
			t.Logf("worker stderr: %s", stderr.String())
		}
	})
	return cmd
}

// runsNoted reads the sink: who ran each key, in order.
func runsNoted(t *testing.T, rdb redis.UniversalClient, sink string) map[string][]string {
	t.Helper()
	all, err := rdb.LRange(ctx, sink, 0, -1).Result()
	must(t, err)
	out := map[string][]string{}
	for _, l := range all {
		f := strings.Fields(l)
		out[f[0]] = append(out[f[0]], f[1]+" "+f[2])
	}
	return out
}

// A worker process of the quick start's shape (Lease 2s) is SIGKILLed while
// six handlers run (or while six tasks wait in a middleware before ours,
// so that their runs never began, or after six handlers failed and the
// middleware released their runs, before asynq recorded the failures). A
// live process of the same shape runs each of those occurrences again
// within seconds, once each, as resumed runs: a run's within Lease + 3 s
// on an idle machine; a task with no run record, or a released one, once
// the dead server has missed two renewals of asynq's lease of it (7 s to
// 14 s after the kill) or that lease has run out: the test keeps the
// never-begun tasks' leases as last renewed 13 s before, and moves the
// released ones' out at the kill. asynq's own recovery waits 30 s to 90 s
// longer. The tasks themselves went back to the queue and ran there:
// asynq holds each as completed, no retry spent, and no second task of
// any of them waits for asynq's recovery. With
// takeover turned off nothing runs again within Lease + 3 s: the runs
// wait for asynq's own recovery.
func TestTakeoverAfterSIGKILL(t *testing.T) {
	t.Parallel()
	for _, v := range []struct {
		name     string
		takeover bool
		block    string
	}{{"takeover", true, "1"}, {"killed before Begin", true, "outer"}, {"killed after a failed run", true, "failed"},
		{"control", false, "1"}} {
		takeover := v.takeover
		t.Run(v.name, func(t *testing.T) {
			t.Parallel()
			const lease, n = 2 * time.Second, 6
			rdb := newClient(t)
			q := testQueue(t)
			key := testKey(t)
			prefix, sink := key+":run:", key+":sink"
			victim := startWorker(t, q, prefix, sink, lease, v.block)
			c := newAsynqClient(t, testAddr)
			for k := range n {
				_, err := c.Enqueue(asynq.NewTask("work", nil), asynq.Queue(q), asynq.TaskID("tk-"+strconv.Itoa(k)),
					asynq.Retention(time.Hour))
				must(t, err)
			}
			waitFor(t, 20*time.Second, "the victim to start every handler", func() bool {
				return len(runsNoted(t, rdb, sink)) == n
			})
			// The live process: the same shape, in this test process.
			idem, err := NewIdempotency(rdb, IdempotencyOptions{Prefix: prefix, Lease: lease, TakeoverQueues: []string{q},
				DisableTakeover: !takeover, Logger: slog.New(slog.DiscardHandler)})
			must(t, err)
			t.Cleanup(func() { idem.Close() })
			// Two more processes look for abandoned runs: each is taken
			// over once all the same.
			var lookers []*Idempotency
			for range 2 {
				l, err := NewIdempotency(rdb, IdempotencyOptions{Prefix: prefix, Lease: lease, TakeoverQueues: []string{q},
					DisableTakeover: !takeover, Logger: slog.New(slog.DiscardHandler)})
				must(t, err)
				t.Cleanup(func() { l.Close() })
				l.Middleware()
				lookers = append(lookers, l)
			}
			live := idem.Middleware()(noteRuns(rdb, sink, "live", false))
			live.ProcessTask(ctx, asynq.NewTask("work", nil)) // a task of the type it serves (its key fails: no task id)
			startAsynq(t, testAddr, q, live, asynq.Config{IsFailure: IsFailure, RetryDelayFunc: RetryDelay, Concurrency: 10})
			must(t, victim.Process.Kill())
			killed := time.Now()
			victim.Wait()
			// asynq's lease of each task, which the victim renewed every
			// 5 s, is what decides the takeover of a task with no run
			// record. The test keeps the leases of the runs killed before
			// Begin as last renewed 13 s ago (each runs 17 s more: asynq
			// never calls them orphaned) and takes them out of the dead
			// server's list of its workers' (which expires 10 s after its
			// last beat), and moves the leases of the others to now (they
			// ran out).
			ids := make([]string, n)
			for k := range ids {
				ids[k] = "tk-" + strconv.Itoa(k)
			}
			if v.block == "outer" {
				renewAsynqLeases(t, rdb, q, 13*time.Second, true, ids...)
				unlistAsynqWorkers(t, rdb, q, ids...)
			} else {
				lapseAsynqLeases(t, rdb, q, false, ids...)
			}
			limit := lease + 3*time.Second
			if !takeover {
				time.Sleep(limit)
				for k, who := range runsNoted(t, rdb, sink) {
					if len(who) != 1 {
						t.Fatalf("control: %s ran %v within %v of the kill; want only the victim's run", k, who, limit)
					}
				}
				return
			}
			// Within Lease + 3 s on an idle machine (the benchmark measures
			// it); a loaded machine delays the passes that look for abandoned
			// runs, so the test allows 20 s: still before asynq could bring
			// any of these tasks back, since its recoverer moves a task only
			// once its lease ran out 30 s before.
			var took time.Duration
			waitFor(t, 20*time.Second, "every occurrence to run again", func() bool {
				for _, who := range runsNoted(t, rdb, sink) {
					if len(who) < 2 {
						return false
					}
				}
				took = time.Since(killed)
				return true
			})
			t.Logf("the last re-run came %v after the kill", took)
			time.Sleep(300 * time.Millisecond) // a second takeover, if any, would show now
			for k, who := range runsNoted(t, rdb, sink) {
				if len(who) != 2 || who[1] != "live true" {
					t.Fatalf("%s ran %v; want the victim's run, then one resumed run by the live process", k, who)
				}
				_, err := idem.Begin(ctx, k)
				wantErr(t, err, ErrAlreadyDone) // what the original meets when asynq brings it back
			}
			total := idem.Stats().Takeovers
			for _, l := range lookers {
				total += l.Stats().Takeovers
			}
			if total != n {
				t.Fatalf("%d takeovers by the three processes, want %d", total, n)
			}
			in := newInspector(t)
			for k := range n {
				ti, err := in.GetTaskInfo(q, "tk-"+strconv.Itoa(k))
				must(t, err)
				if ti.State != asynq.TaskStateCompleted || ti.Retried != 0 {
					t.Fatalf("task %s: %v, retried %d; want completed by its run again, no retry spent", ti.ID, ti.State, ti.Retried)
				}
			}
			t.Logf("all %d runs again %v after the SIGKILL (Lease %v)", n, took.Round(10*time.Millisecond), lease)
		})
	}
}

// A run that is slow but renews its lease is never taken over, however
// many processes look. A loaded machine can hold a renewal back past the
// lease, and a takeover of the lapsed run (or asynq's retry of its
// cancelled handler) is then right: the run record, watched with Redis'
// clock, tells which. An attempt whose lease was seen lapsed proves
// nothing and starts over on keys of its own (at most 10: a loaded
// machine has held three in a row back); one that ran twice, or was taken
// over, with its lease live fails the test.
func TestTakeoverOnlyAbandonedOnce(t *testing.T) {
	t.Parallel()
	startOver(t, 10, func(int) (fault, excuse string) {
		slowRuns, takeovers, lapsed := takeoverOfASlowRun(t)
		if takeovers == 0 && slowRuns == 1 {
			return "", ""
		}
		fault = fmt.Sprintf("the slow run ran %d times, %d takeovers; want once, none", slowRuns, takeovers)
		if !lapsed {
			return fault + " (its lease live throughout)", ""
		}
		return fault, "the lease lapsed first (a renewal held back past it)"
	})
}

// takeoverOfASlowRun runs one task whose handler takes 4 leases, renewing,
// beside five stores' takeover loops, and returns how many times it ran,
// how many takeovers the stores made, and whether its lease was seen
// lapsed: its run record taken over at a moment past the last deadline
// seen on it (watchRun), or, with no takeover, the handler cancelled by
// the middleware for a lease it gave up.
func takeoverOfASlowRun(t *testing.T) (slowRuns int, takeovers int64, lapsed bool) {
	rdb := newClient(t)
	q := testQueue(t)
	key := testKey(t)
	prefix := key + ":run:"
	const lease = 500 * time.Millisecond // renewed every 167ms
	var stores []*Idempotency
	for range 5 {
		stores = append(stores, newIdem(t, rdb, IdempotencyOptions{Prefix: prefix, Lease: lease, TakeoverQueues: []string{q}}))
	}
	// A slow handler under the first store, renewing its lease.
	release := make(chan struct{})
	var leaseLost atomic.Bool // the middleware cancelled the slow handler: a renewal came too late
	var mu sync.Mutex
	runs := map[string]int{}
	h := stores[0].Middleware()(asynq.HandlerFunc(func(ctx context.Context, _ *asynq.Task) error {
		e, _ := ExecutionFromContext(ctx)
		mu.Lock()
		runs[e.Key]++
		mu.Unlock()
		if e.Key == "slow" {
			select {
			case <-release:
			case <-ctx.Done():
				if errors.Is(context.Cause(ctx), ErrLeaseLost) {
					leaseLost.Store(true)
				}
				return ctx.Err()
			}
		}
		return nil
	}))
	for _, s := range stores[1:] {
		s.Middleware() // every store looks
	}
	startAsynq(t, testAddr, q, h, asynq.Config{IsFailure: IsFailure, RetryDelayFunc: fastRetry})
	c := newAsynqClient(t, testAddr)
	_, err := c.Enqueue(asynq.NewTask("work", nil), asynq.Queue(q), asynq.TaskID("slow"))
	must(t, err)
	watched := watchRun(rdb, stores[0].recordKey("slow"))
	time.Sleep(4 * lease) // about sixteen passes of each of five loops
	close(release)
	waitFor(t, 20*time.Second, "the slow run to complete", func() bool {
		_, err := stores[1].Begin(ctx, "slow")
		return errors.Is(err, ErrAlreadyDone)
	})
	// Watched until then: a loaded machine can hold a renewal back past
	// the lease after the release too, before the run completes.
	lapsed = watched()
	mu.Lock()
	slowRuns = runs["slow"]
	mu.Unlock()
	for _, s := range stores {
		takeovers += s.Stats().Takeovers
	}
	// A renewal held back until the middleware gave the lease up (it
	// cancels the handler before the deadline passes, and releases the
	// run, so watchRun may see no lapse): asynq's retry then runs it again.
	lapsed = lapsed || leaseLost.Load() && takeovers == 0
	return slowRuns, takeovers, lapsed
}

// watchRun reads run record rk and Redis' clock every few milliseconds
// until the returned func is called, which tells whether the run's lease
// was seen lapsed: the record ("run <token> <deadline>") read at a moment
// past its deadline, or taken over ("take …") or run under another token
// at a moment past the deadline of the run last seen, or taken over before
// the run began ("take 0 …": a loaded machine held its Begin back a Lease
// past the task turning active, as a worker that died before Begin
// would), or released ("free …", which the slow handler is not, unless
// the middleware gave its lease up). A takeover needs the deadline passed:
// one seen before it took a run whose lease was live. (A lapsed lease also cancels the handler, and
// asynq's retry of the task begins a run of its own.)
func watchRun(rdb *redis.Client, rk string) func() bool {
	stop, done := make(chan struct{}), make(chan bool, 1)
	go func() {
		deadline, token, lapsed := int64(0), "", false
		for {
			select {
			case <-stop:
				done <- lapsed
				return
			case <-time.After(2 * time.Millisecond):
			}
			var get *redis.StringCmd
			var now *redis.TimeCmd
			if _, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
				get, now = p.Get(ctx, rk), p.Time(ctx)
				return nil
			}); err != nil && !errors.Is(err, redis.Nil) {
				continue
			}
			f := strings.Fields(get.Val())
			if len(f) != 3 {
				continue
			}
			at := now.Val().UnixMilli()
			switch n, _ := strconv.ParseInt(f[2], 10, 64); f[0] {
			case "run":
				lapsed = lapsed || at > n || f[1] != token && deadline > 0 && at > deadline
				deadline, token = n, f[1]
			case "take":
				// "take 0": taken over before any run record was written,
				// its Begin held back a Lease past the task turning active.
				// A run taken over before the watcher saw it (deadline 0,
				// so at > deadline) lapsed while the watcher was held back:
				// on an idle machine it sees the run within milliseconds of
				// Begin.
				lapsed = lapsed || f[1] == "0" || at > deadline
			case "free":
				// Released while the test holds its handler: the middleware
				// gave the lease up (a renewal came too late) and cancelled
				// the handler; a takeover or asynq's retry may follow.
				lapsed = true
			}
		}
	}()
	return func() bool { close(stop); return <-done }
}

// The takeover script fences by token: of many calls for one abandoned
// run, one takes it over; a live run, another token, a finished run or a
// missing record is not taken; a released run is taken with its own token.
func TestTakeoverScriptFenced(t *testing.T) {
	t.Parallel()
	rdb := newClient(t)
	i := newIdem(t, rdb, IdempotencyOptions{Lease: 20 * time.Millisecond})
	// A takeover holds the record a minute: a call held back past the hold
	// may take the run over again, by design.
	take := func(key, token string) bool {
		bucket, field := i.doneOf(key)
		raw, err := takeoverScript.Run(ctx, rdb, []string{i.recordKey(key), bucket, historyOf(bucket, i.Prefix())},
			token, 60000, 20, field, 60000, "test:1").Int64Slice()
		must(t, err)
		return raw[0] == 1
	}
	long := newIdem(t, rdb, IdempotencyOptions{Prefix: i.Prefix(), Lease: time.Minute})
	live, err := long.Begin(ctx, "live")
	must(t, err)
	if take("live", strconv.FormatInt(live.Token, 10)) {
		t.Fatal("a live run was taken over")
	}
	e, err := i.Begin(ctx, "k")
	must(t, err)
	tok := strconv.FormatInt(e.Token, 10)
	time.Sleep(30 * time.Millisecond)
	if take("k", strconv.FormatInt(e.Token+1, 10)) {
		t.Fatal("taken over with another token")
	}
	var wg sync.WaitGroup
	wins := make(chan bool, 20)
	for range 20 {
		wg.Add(1)
		go func() { defer wg.Done(); wins <- take("k", tok) }()
	}
	wg.Wait()
	close(wins)
	n := 0
	for w := range wins {
		if w {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("%d of 20 racing calls took the run over; want 1", n)
	}
	if err := e.Extend(ctx); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("the dead run's Extend after the takeover: %v, want ErrLeaseLost", err)
	}
	e2, err := i.Begin(ctx, "k") // the copy begins at once, resumed
	must(t, err)
	if !e2.Resumed || e2.Token <= e.Token {
		t.Fatalf("copy's run: resumed %v, token %d after %d", e2.Resumed, e2.Token, e.Token)
	}
	must(t, e2.Complete(ctx))
	if take("k", strconv.FormatInt(e2.Token, 10)) || take("missing", tok) {
		t.Fatal("a finished run or a missing record was taken over")
	}
	// A released run whose task asynq still holds: taken with its token,
	// once.
	f, err := i.Begin(ctx, "f")
	must(t, err)
	must(t, f.Release(ctx))
	ftok := strconv.FormatInt(f.Token, 10)
	if take("f", strconv.FormatInt(f.Token+1, 10)) || !take("f", ftok) || take("f", ftok) {
		t.Fatal("a released run: want taken with its own token, once")
	}
	f2, err := i.Begin(ctx, "f")
	must(t, err)
	if !f2.Resumed {
		t.Fatal("the copy of a released run's task did not begin resumed")
	}
	// A failure that ended its task is asynq's: not taken.
	must(t, f2.release(ctx, "failed for good", true))
	if take("f", strconv.FormatInt(f2.Token, 10)) {
		t.Fatal("a run whose failure ended its task was taken over")
	}
}

// The middleware marks a failure that ends its task (SkipRetry, the last
// attempt) in the run record, and no takeover copies it; a failure that
// asynq will retry is marked as an ordinary release.
func TestFinalFailureMarked(t *testing.T) {
	t.Parallel()
	rdb := newClient(t)
	q := testQueue(t)
	// A task still active once asynq's lease of it has run out after its
	// run was released is taken over (asynq's own write may have failed):
	// these are recorded at once.
	i := newIdem(t, rdb, IdempotencyOptions{Prefix: testKey(t) + ":run:", Lease: time.Second, TakeoverQueues: []string{q}})
	var mu sync.Mutex
	records := map[string][]string{} // the record each attempt left, seen from the next
	h := i.Middleware()(asynq.HandlerFunc(func(ctx context.Context, task *asynq.Task) error {
		if string(task.Payload()) == "skip" {
			return fmt.Errorf("zclaim test: %w", asynq.SkipRetry)
		}
		return errors.New("zclaim test: failed")
	}))
	startAsynq(t, testAddr, q, asynq.HandlerFunc(func(ctx context.Context, task *asynq.Task) error {
		err := h.ProcessTask(ctx, task)
		id, _ := asynq.GetTaskID(ctx)
		rec, _ := rdb.Get(context.Background(), i.recordKey(id)).Result()
		state, _, n, _ := parseRecord(rec)
		mu.Lock()
		records[id] = append(records[id], fmt.Sprintf("%s %d", state, n))
		mu.Unlock()
		return err
	}), asynq.Config{IsFailure: IsFailure, RetryDelayFunc: fastRetry})
	c := newAsynqClient(t, testAddr)
	for _, v := range []struct {
		id, payload string
		retries     int
	}{{"skip", "skip", 5}, {"last", "fail", 0}, {"twice", "fail", 1}} {
		_, err := c.Enqueue(asynq.NewTask("work", []byte(v.payload)), asynq.Queue(q), asynq.TaskID(v.id), asynq.MaxRetry(v.retries))
		must(t, err)
	}
	in := newInspector(t)
	waitFor(t, 10*time.Second, "every task archived", func() bool {
		for _, id := range []string{"skip", "last", "twice"} {
			if ti, err := in.GetTaskInfo(q, id); err != nil || ti.State != asynq.TaskStateArchived {
				return false
			}
		}
		return true
	})
	mu.Lock()
	defer mu.Unlock()
	want := map[string][]string{"skip": {"free 1"}, "last": {"free 1"}, "twice": {"free 0", "free 1"}}
	for id, w := range want {
		if !slices.Equal(records[id], w) {
			t.Errorf("%s: records after each attempt %v, want %v", id, records[id], w)
		}
	}
	if n := i.Stats().Takeovers; n != 0 {
		t.Errorf("%d takeovers", n)
	}
}

// With BrokerOptions.Runs, Job and Stats report the runs of active asynq
// tasks: one running under a live lease, one abandoned by a worker that
// is gone.
func TestBrokerReportsRuns(t *testing.T) {
	t.Parallel()
	rdb := newClient(t)
	q := testQueue(t)
	key := testKey(t)
	prefix := key + ":run:"
	started := holdingWorker(t, rdb, q, 4)
	c := newAsynqClient(t, testAddr)
	for _, id := range []string{"order-1", "order-2"} {
		_, err := c.Enqueue(asynq.NewTask("work", nil), asynq.Queue(q), asynq.TaskID(id))
		must(t, err)
		wait.Recv(t, started, 30*time.Second, "the handler of "+id+" to start")
	}
	long := newIdem(t, rdb, IdempotencyOptions{Prefix: prefix, Lease: time.Minute, TakeoverQueues: []string{q}, DisableTakeover: true})
	short := newIdem(t, rdb, IdempotencyOptions{Prefix: prefix, Lease: 20 * time.Millisecond})
	live, err := long.Begin(ctx, "order-1")
	must(t, err)
	dead, err := short.Begin(ctx, "order-2") // and then its worker died
	must(t, err)
	time.Sleep(30 * time.Millisecond)
	b := newBroker(t, BrokerOptions{Key: key, Runs: long})
	j, err := b.Job(ctx, "order-1")
	must(t, err)
	if j.State != StateRunning || j.Token != live.Token || j.TaskID != "order-1" || j.Queue != q || j.LeaseUntil.IsZero() {
		t.Fatalf("order-1: %+v, want running with its token and task", j)
	}
	j, err = b.Job(ctx, "order-2")
	must(t, err)
	if j.State != StateAbandoned || !j.LeaseUntil.Before(time.Now()) {
		t.Fatalf("order-2: %+v, want abandoned", j)
	}
	st, err := b.Stats(ctx)
	must(t, err)
	if st.Running != 1 || st.Abandoned != 1 {
		t.Fatalf("stats %+v, want 1 running, 1 abandoned", st)
	}
	_, err = b.Job(ctx, "order-3")
	wantErr(t, err, ErrNotFound)

	// A pass takes order-2 over: Runs and the Broker say by whom, from
	// which token, after how long.
	long.types.Store("work", true) // as if its middleware had handled a task of the type
	long.takeover.in = asynq.NewInspectorFromRedisClient(rdb)
	took, err := long.takeover.takeoverPass(ctx)
	must(t, err)
	if took != 1 {
		t.Fatalf("the pass took %d runs over, want order-2's", took)
	}
	// The worker takes the task back from its queue; then it is active again.
	waitFor(t, 10*time.Second, "order-2 active again", func() bool { _, err := b.Job(ctx, "order-2"); return err == nil })
	runs, _, err := long.Runs(ctx, "", 0)
	must(t, err)
	for _, r := range runs {
		tk := r.TakenOver
		switch {
		case r.Key == "order-1" && tk != nil:
			t.Fatalf("order-1, live, shows a takeover: %+v", tk)
		case r.Key == "order-2" && (tk == nil || tk.By != thisProcess() || tk.From != dead.Token || tk.Silent <= 0 ||
			time.Since(tk.At) > time.Minute):
			t.Fatalf("order-2's run after the takeover: %+v (takeover %+v), want by %s from token %d", r, tk,
				thisProcess(), dead.Token)
		}
	}
	j, err = b.Job(ctx, "order-2")
	must(t, err)
	if j.TakenOver == nil || j.TakenOver.From != dead.Token {
		t.Fatalf("the Broker's order-2: %+v, want its takeover", j)
	}
	// Its history: the dead run's start, then the takeover, from its
	// token after its silence.
	if got := whats(j.History); !strings.HasPrefix(got, "started taken over") || j.History[0].Token != dead.Token ||
		!strings.Contains(j.History[1].Detail, "from token "+strconv.FormatInt(dead.Token, 10)+", silent ") {
		t.Fatalf("order-2's history: %+v", j.History)
	}
}

// On a Redis Cluster of three masters, with run records spread over their
// slots (a prefix without a hash tag), abandoned runs are taken over by a
// pass over every queue asynq knows, whose active lists are in slots of
// their own.
func TestTakeoverOnCluster(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("starts a Redis Cluster")
	}
	cl := ownCluster(t, 3, 0)
	cc := cl.Client()
	t.Cleanup(func() { cc.Close() })
	const q, n = "zt-cluster-takeover", 6
	must(t, cc.SAdd(ctx, "asynq:queues", "zt-idle-a", "zt-idle-b", "zt-idle-c").Err())
	started := holdingWorker(t, cc, q, 2*n)
	c := asynq.NewClientFromRedisClient(cc)
	t.Cleanup(func() { c.Close() })
	for k := range n {
		_, err := c.Enqueue(asynq.NewTask("work", nil), asynq.Queue(q), asynq.TaskID("c-"+strconv.Itoa(k)))
		must(t, err)
	}
	for range n {
		wait.Recv(t, started, 30*time.Second, "the handlers to start")
	}
	// Each run began, and its worker died: the records' leases run out.
	dead, err := NewIdempotency(cc, IdempotencyOptions{Prefix: "zt:run:", Lease: 20 * time.Millisecond, DisableTakeover: true})
	must(t, err)
	slots := map[int64]bool{}
	for k := range n {
		_, err := dead.Begin(ctx, "c-"+strconv.Itoa(k))
		must(t, err)
		s, err := cc.ClusterKeySlot(ctx, "zt:run:c-"+strconv.Itoa(k)).Result()
		must(t, err)
		slots[s] = true
	}
	if len(slots) < 2 {
		t.Fatalf("records in %d slot(s): the test needs them spread", len(slots))
	}
	time.Sleep(30 * time.Millisecond)
	// The tasks go back to their queue and run again under a plain
	// handler, which never begins them: a live server holds them, so they
	// are not taken over again.
	taker, err := NewIdempotency(cc, IdempotencyOptions{Prefix: "zt:run:", Lease: 2 * time.Second})
	must(t, err)
	t.Cleanup(func() { taker.Close() })
	if got := taker.takeover.busyQueues(ctx, []string{"zt-idle-a", q, "zt-idle-b"}); !slices.Equal(got, []string{q}) {
		t.Fatalf("busy queues %q, want %q", got, q)
	}
	taker.Middleware()
	copies := map[string]bool{}
	timeout := time.After(30 * time.Second)
	for len(copies) < n {
		select {
		case id := <-started:
			copies[id] = true // the task itself, put back on its queue
		case <-timeout:
			t.Fatalf("%d of %d runs taken over in 30s", len(copies), n)
		}
	}
	// The counter moves once the task is back on its queue: it can start
	// first.
	for deadline := time.Now().Add(5 * time.Second); taker.Stats().Takeovers < n && time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond)
	}
	if got := taker.Stats().Takeovers; got != n {
		t.Fatalf("%d takeovers, want %d", got, n)
	}
}

// holdingWorker runs an asynq server on queue q whose plain handler (no
// middleware) reports each task id on the channel it returns and holds the
// task until the test ends: its tasks stay active, as a dead worker's do.
func holdingWorker(t *testing.T, rdb redis.UniversalClient, q string, concurrency int) <-chan string {
	t.Helper()
	started := make(chan string, 4*concurrency)
	release := make(chan struct{})
	srv := asynq.NewServerFromRedisClient(rdb, asynq.Config{Queues: map[string]int{q: 1}, Concurrency: concurrency,
		TaskCheckInterval: 10 * time.Millisecond, Logger: quietLogger{}, LogLevel: asynq.FatalLevel})
	must(t, srv.Start(asynq.HandlerFunc(func(ctx context.Context, _ *asynq.Task) error {
		id, _ := asynq.GetTaskID(ctx)
		started <- id
		select {
		case <-release:
		case <-ctx.Done():
		}
		return nil
	})))
	t.Cleanup(func() { close(release); srv.Shutdown() })
	return started
}

// deadRun has a worker without the middleware (holdingWorker, of n
// workers) take the task id of queue q, and a run of it begin under a
// 20ms lease whose worker then dies: a run a takeover starts again. It
// returns the holding worker's starts, the dead run's store and its run.
func deadRun(t *testing.T, rdb redis.UniversalClient, q, id string, n int) (<-chan string, *Idempotency, *Execution) {
	t.Helper()
	started := holdingWorker(t, rdb, q, n)
	_, err := newAsynqClient(t, testAddr).Enqueue(asynq.NewTask("work", nil), asynq.Queue(q), asynq.TaskID(id))
	must(t, err)
	wait.Recv(t, started, 30*time.Second, "the original to start")
	dead := newIdem(t, rdb, IdempotencyOptions{Lease: 20 * time.Millisecond})
	e, err := dead.Begin(ctx, id) // and its worker died
	must(t, err)
	return started, dead, e
}

// lapseAsynqLeases moves asynq's lease of the active tasks ids of queue q
// to a second ago, as if their worker had died and its last renewal had
// run out (30 s after it), where asynq's recoverer would move them on
// 30 s later still. With keep, it moves them back every 20 ms until the
// test ends, against a live server's renewals every 5 s: the worker of a
// holdingWorker plays a dead one.
func lapseAsynqLeases(t *testing.T, rdb redis.UniversalClient, q string, keep bool, ids ...string) {
	t.Helper()
	renewAsynqLeases(t, rdb, q, asynqLease+time.Second, keep, ids...)
}

// renewAsynqLeases sets asynq's leases of the tasks ids of queue q as if
// asynq's server had last renewed them ago before now; with keep, again
// every 20 ms until the test ends, each time from the time then.
func renewAsynqLeases(t *testing.T, rdb redis.UniversalClient, q string, ago time.Duration, keep bool, ids ...string) {
	t.Helper()
	key := "asynq:{" + q + "}:lease"
	set := func() error {
		deadline := float64(time.Now().Add(asynqLease - ago).Unix())
		zs := make([]redis.Z, len(ids))
		for k, id := range ids {
			zs[k] = redis.Z{Score: deadline, Member: id}
		}
		return rdb.ZAddXX(context.Background(), key, zs...).Err()
	}
	must(t, set())
	if keep {
		again(t, set)
	}
}

// listAsAsynqWorkers lists the tasks ids of queue q as the workers of a
// live asynq server of its own do at each beat (a hash that expires two
// beats later, whose values are the workers' records), until the test
// ends.
func listAsAsynqWorkers(t *testing.T, rdb redis.UniversalClient, q string, ids ...string) {
	t.Helper()
	key := "asynq:workers:{" + testKey(t) + "}"
	p := rdb.Pipeline()
	for _, id := range ids {
		// asynq's WorkerInfo: task_id (4) and queue (7)
		info := protowire.AppendTag(nil, 4, protowire.BytesType)
		info = protowire.AppendString(info, id)
		info = protowire.AppendTag(info, 7, protowire.BytesType)
		info = protowire.AppendString(info, q)
		p.HSet(ctx, key, id, info)
	}
	p.Expire(ctx, key, time.Minute)
	p.ZAdd(ctx, "asynq:workers", redis.Z{Score: float64(time.Now().Add(time.Minute).Unix()), Member: key})
	_, err := p.Exec(ctx)
	must(t, err)
	t.Cleanup(func() {
		rdb.ZRem(context.Background(), "asynq:workers", key)
		rdb.Del(context.Background(), key)
	})
}

// unlistAsynqWorkers takes the tasks ids of queue q out of every asynq
// server's list of its workers', as a dead server's list is gone two beats
// after its last; again every 20 ms until the test ends, against a live
// server's writes at each beat: the worker of a holdingWorker plays a dead
// one. Those of other queues stay.
func unlistAsynqWorkers(t *testing.T, rdb redis.UniversalClient, q string, ids ...string) {
	t.Helper()
	unlist := func() error {
		bg := context.Background()
		keys, err := rdb.ZRange(bg, "asynq:workers", 0, -1).Result()
		if err != nil {
			return err
		}
		for _, key := range keys {
			infos, err := rdb.HMGet(bg, key, ids...).Result()
			if err != nil {
				continue // not a hash: no server of asynq's wrote it
			}
			for k, info := range infos {
				if s, ok := info.(string); ok && workerQueue(s) == q {
					if err := rdb.HDel(bg, key, ids[k]).Err(); err != nil {
						return err
					}
				}
			}
		}
		return nil
	}
	must(t, unlist())
	again(t, unlist)
}

// again calls f every 20 ms until the test ends.
func again(t *testing.T, f func() error) {
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
				f()
			}
		}
	}()
	t.Cleanup(func() { close(stop); <-done })
}

// With no TakeoverQueues, Runs and a takeover pass read the lengths of
// every queue's active list in one round trip and list the active tasks of
// the busy queues alone (asynq's Inspector takes three round trips a
// queue): beside 300 idle queues, they find a dead run and a live task in
// a few round trips, and the pass takes the dead run over. Under an asynq
// whose keys the store does not know, it lists every queue, and finds the
// same.
func TestTakeoverSkipsIdleQueues(t *testing.T) {
	t.Parallel()
	s := ownRedis(t) // the queues asynq knows are the test's alone
	rdb := redis.NewClient(&redis.Options{Addr: s.Addr})
	t.Cleanup(func() { rdb.Close() })
	const idle = 300
	_, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for k := range idle {
			p.SAdd(ctx, "asynq:queues", "idle-"+strconv.Itoa(k))
		}
		return nil
	})
	must(t, err)
	const q = "busy"
	started := holdingWorker(t, rdb, q, 3) // a worker left free for the copy
	c := asynq.NewClientFromRedisClient(rdb)
	t.Cleanup(func() { c.Close() })
	for _, id := range []string{"dead", "live"} {
		_, err := c.Enqueue(asynq.NewTask("work", nil), asynq.Queue(q), asynq.TaskID(id))
		must(t, err)
		wait.Recv(t, started, 30*time.Second, "task "+id+" to start")
	}
	dead, err := NewIdempotency(rdb, IdempotencyOptions{Prefix: "zt:run:", Lease: 20 * time.Millisecond, DisableTakeover: true})
	must(t, err)
	_, err = dead.Begin(ctx, "dead") // and its worker died
	must(t, err)
	time.Sleep(30 * time.Millisecond)
	for _, known := range []bool{false, true} {
		var trips atomic.Int64
		counted := redis.NewClient(&redis.Options{Addr: s.Addr})
		t.Cleanup(func() { counted.Close() })
		i, err := NewIdempotency(counted, IdempotencyOptions{Prefix: "zt:run:", Lease: time.Second, DisableTakeover: true})
		must(t, err)
		i.adapter.known = known
		i.types.Store("work", true) // as if its middleware had handled a task of the type
		must(t, counted.Ping(ctx).Err())
		counted.AddHook(roundTrips{&trips})
		runs, _, err := i.Runs(ctx, "", 0)
		must(t, err)
		var got []string
		for _, r := range runs {
			got = append(got, r.TaskID+" "+string(r.State))
		}
		if want := []string{"dead " + string(RunAbandoned), "live " + string(RunNone)}; !slices.Equal(got, want) {
			t.Fatalf("asynq known %v: runs %q, want %q", known, got, want)
		}
		switch n := trips.Load(); {
		case !known && n < 3*idle:
			t.Fatalf("Runs under an unknown asynq took %d round trips, want one listing of each of %d queues", n, idle+1)
		case known && n > idle/10:
			t.Fatalf("Runs took %d round trips beside %d idle queues", n, idle)
		}
		if !known {
			continue
		}
		i.takeover.in = asynq.NewInspectorFromRedisClient(counted)
		trips.Store(0)
		took, err := i.takeover.takeoverPass(ctx)
		must(t, err)
		if n := trips.Load(); took != 1 || n > idle/10 {
			t.Fatalf("a pass took over %d runs in %d round trips, want 1 in a few", took, n)
		}
		if id := wait.Recv(t, started, 30*time.Second, "the copy to start"); id != "dead" {
			t.Fatalf("task %s started, want the dead run's task again", id)
		}
	}
}

// Keys of asynq's that are of another type than asynq writes (a hostile
// queue's active list, a key listed among asynq's servers' workers) slow
// no takeover and stop none: the pass still reads the lengths of the
// queues' active lists in one pipeline and lists the busy queues alone,
// the hostile queue among them so that its listing reports the error; and
// a run whose worker died before its Begin is taken over, the hostile
// workers' key read as no server's.
func TestTakeoverPastHostileAsynqKeys(t *testing.T) {
	t.Parallel()
	s := ownRedis(t) // the queues and servers asynq knows are the test's alone
	rdb := redis.NewClient(&redis.Options{Addr: s.Addr})
	t.Cleanup(func() { rdb.Close() })
	const q, idle = "busy", 60
	started := holdingWorker(t, rdb, q, 2)
	_, err := asynq.NewClientFromRedisClient(rdb).Enqueue(asynq.NewTask("work", nil), asynq.Queue(q), asynq.TaskID("never"))
	must(t, err)
	wait.Recv(t, started, 30*time.Second, "the task to start") // and its worker died before the middleware's Begin
	// Its server last renewed asynq's lease 13 s ago (missed two renewals),
	// which has not run out yet: only the servers' lists of their workers'
	// tasks (none lists it) tell that the worker is gone.
	renewAsynqLeases(t, rdb, q, 13*time.Second, true, "never")
	unlistAsynqWorkers(t, rdb, q, "never")
	_, err = rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for k := range idle {
			p.SAdd(ctx, "asynq:queues", "idle-"+strconv.Itoa(k))
		}
		p.SAdd(ctx, "asynq:queues", "hostile")
		p.Set(ctx, "asynq:{hostile}:active", "junk", 0)
		// Listed last (the latest deadline), after the live server's key.
		p.ZAdd(ctx, "asynq:workers", redis.Z{Score: float64(time.Now().Add(time.Hour).Unix()), Member: "asynq:workers:{hostile}"})
		p.Set(ctx, "asynq:workers:{hostile}", "junk", 0)
		return nil
	})
	must(t, err)

	var trips atomic.Int64
	counted := redis.NewClient(&redis.Options{Addr: s.Addr})
	t.Cleanup(func() { counted.Close() })
	i, err := NewIdempotency(counted, IdempotencyOptions{Prefix: "zt:run:", Lease: time.Second, DisableTakeover: true})
	must(t, err)
	i.types.Store("work", true) // as if its middleware had handled a task of the type
	i.takeover.in = asynq.NewInspectorFromRedisClient(counted)
	must(t, counted.Ping(ctx).Err())
	counted.AddHook(roundTrips{&trips})
	took, err := i.takeover.takeoverPass(ctx)
	if took != 1 || err == nil || !strings.Contains(err.Error(), "WRONGTYPE") {
		t.Fatalf("a pass took over %d runs, error %v; want 1, and the hostile queue's WRONGTYPE", took, err)
	}
	if n := trips.Load(); n > idle/2 {
		t.Fatalf("a pass made %d round trips beside %d idle queues, want a few", n, idle)
	}
	if id := wait.Recv(t, started, 30*time.Second, "the copy to start"); id != "never" {
		t.Fatalf("task %s started, want the task of the run that never began again", id)
	}
	// Runs lists the other queues' runs and names the hostile one; a
	// Broker's Stats counts them.
	runs, _, err := i.Runs(ctx, "", 0)
	var qe *QueueError
	if !errors.As(err, &qe) || qe.Queue != "hostile" || !slices.ContainsFunc(runs, func(r RunInfo) bool { return r.TaskID == "never" }) {
		t.Fatalf("Runs: %+v, error %v; want the run of never and a QueueError naming hostile", runs, err)
	}
	b, err := NewBroker(counted, BrokerOptions{Key: "zt:{hostile}", Runs: i})
	must(t, err)
	if st, err := b.Stats(ctx); err != nil || st.Running+st.Abandoned == 0 {
		t.Fatalf("Stats: %+v, error %v; want the runs of the queues that can be read", st, err)
	}
	// Jobs gives the run of never, from a queue it can read, with the
	// error naming the other; Job finds a scheduled job whatever the
	// queues, and names the hostile queue for one it finds nowhere (its
	// run may be there).
	entries, err := b.Jobs(ctx, "never")
	if !errors.As(err, &qe) || !slices.ContainsFunc(entries, func(j JobInfo) bool { return j.TaskID == "never" }) {
		t.Fatalf("Jobs: %+v, error %v; want never's run and a QueueError", entries, err)
	}
	must(t, b.Schedule(ctx, Job{ID: "later", RunAt: time.Now().Add(time.Hour), Type: "work"}))
	if j, err := b.Job(ctx, "later"); err != nil || j.State != StateScheduled {
		t.Fatalf("Job of a scheduled job: %+v, %v", j, err)
	}
	if _, err := b.Job(ctx, "nowhere"); !errors.As(err, &qe) || errors.Is(err, ErrNotFound) {
		t.Fatalf("Job of a job found nowhere: %v; want the QueueError", err)
	}
}

// A takeover pass that fails (here, asynq's Redis cannot be reached) is
// logged at Warn, once per cause per claimWarnEvery: while passes fail, no
// dead worker's run is taken over.
func TestTakeoverPassFailureLogged(t *testing.T) {
	t.Parallel()
	px := newProxy(t, testAddr)
	px.SetDown(true)
	gone := clientVia(t, px)
	var logs logbuf.Buffer
	i := newIdem(t, newClient(t), IdempotencyOptions{Lease: 400 * time.Millisecond, AsynqRedis: gone, TakeoverQueues: []string{"q"},
		Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	i.Middleware()
	const line = "level=WARN msg=\"zclaim: takeover pass failed\""
	waitFor(t, 10*time.Second, "a failed pass logged", func() bool { return strings.Contains(logs.String(), line) })
	first, passes := time.Now(), i.takeover.passes.Load()
	waitFor(t, 20*time.Second, "three more passes", func() bool { return i.takeover.passes.Load() >= passes+3 })
	// One line per claimWarnEvery (a slow machine may take longer than
	// that over the three passes).
	if n, most := strings.Count(logs.String(), line), 1+int(time.Since(first)/claimWarnEvery); n > most {
		t.Fatalf("%d passes failed, %d logged; want at most %d:\n%s", i.takeover.passes.Load(), n, most, logs.String())
	}
}

// A takeover pass reports what stops it taking a dead run over, leaves
// that run as it is and takes the others over: a run record of another
// type, one that is not the middleware's, or, for a run that never began
// (no record, asynq's lease of its task lapsed), a bucket of finished
// records of another type (the takeover script's error). Runs lists the
// queue's runs all the same. With the keys mended, the next pass takes the
// run over.
func TestTakeoverPassReportsBadKeys(t *testing.T) {
	t.Parallel()
	rdb := newClient(t)
	q := testQueue(t)
	started, dead, _ := deadRun(t, rdb, q, "dead", 4)
	// Another run of the queue whose worker died, with sound keys.
	_, err := newAsynqClient(t, testAddr).Enqueue(asynq.NewTask("work", nil), asynq.Queue(q), asynq.TaskID("other"))
	must(t, err)
	wait.Recv(t, started, 30*time.Second, "the other task to start")
	_, err = dead.Begin(ctx, "other")
	must(t, err)
	i := newIdem(t, rdb, IdempotencyOptions{Prefix: dead.Prefix(), Lease: time.Second, TakeoverQueues: []string{q}})
	i.types.Store("work", true) // as if its middleware had handled a task of the type
	i.takeover.in = newInspector(t)
	time.Sleep(30 * time.Millisecond) // the dead run's lease runs out
	record := i.recordKey("dead")
	bucket, _ := i.doneOf("dead")
	rec, err := rdb.Get(ctx, record).Result()
	must(t, err)
	for _, c := range []struct {
		name  string
		spoil func() error
		want  string
		took  int // the other run, in the first pass
	}{
		{"a record of another type", func() error { rdb.Del(ctx, record); return rdb.HSet(ctx, record, "f", "v").Err() }, "WRONGTYPE", 1},
		{"a record not the middleware's", func() error { return rdb.Set(ctx, record, "junk", 0).Err() }, ErrCorrupt.Error(), 0},
		{"a bucket of another type", func() error {
			lapseAsynqLeases(t, rdb, q, true, "dead")
			unlistAsynqWorkers(t, rdb, q, "dead")
			rdb.Del(ctx, record)
			return rdb.Set(ctx, bucket, "junk", 0).Err()
		}, "WRONGTYPE", 0},
	} {
		must(t, rdb.Del(ctx, record, bucket).Err())
		must(t, rdb.Set(ctx, record, rec, 0).Err())
		must(t, c.spoil())
		took, err := i.takeover.takeoverPass(ctx)
		if took != c.took || err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), `"dead"`) {
			t.Fatalf("%s: a pass took over %d runs, error %v; want %d, an error naming the key and %s", c.name, took, err, c.took, c.want)
		}
		if runs, _, err := i.Runs(ctx, "", 0); err != nil || !slices.ContainsFunc(runs, func(r RunInfo) bool { return r.TaskID == "dead" }) {
			t.Fatalf("%s: Runs listed %+v, error %v; want the queue's, dead's among them", c.name, runs, err)
		}
	}
	if id := wait.Recv(t, started, 30*time.Second, "the other run's copy to start"); id != "other" {
		t.Fatalf("task %s started, want the other run's task again", id)
	}
	must(t, rdb.Del(ctx, record, bucket).Err())
	must(t, rdb.Set(ctx, record, rec, 0).Err())
	if took, err := i.takeover.takeoverPass(ctx); took != 1 || err != nil {
		t.Fatalf("with the keys mended, a pass took over %d runs, error %v; want 1", took, err)
	}
	if id := wait.Recv(t, started, 30*time.Second, "the copy to start"); id != "dead" {
		t.Fatalf("task %s started, want the dead run's task again", id)
	}
}

// Processes of one shape (a store prefix, the same TakeoverQueues, the
// same task types) share their passes: five make about one pass an
// interval between them, not one each, and a dead run among the active
// tasks is taken over all the same, once. A store that handles another
// type makes passes of its own.
func TestTakeoverPassesShared(t *testing.T) {
	t.Parallel()
	rdb := newClient(t)
	q := testQueue(t)
	const lease = 400 * time.Millisecond // a pass every 100ms
	_, dead, _ := deadRun(t, rdb, q, "orig", 1)
	var same []*Idempotency
	for range 5 {
		i := newIdem(t, rdb, IdempotencyOptions{Prefix: dead.Prefix(), Lease: lease, TakeoverQueues: []string{q}})
		i.types.Store("work", true) // as if its middleware had handled a task of the type
		i.Middleware()
		same = append(same, i)
	}
	other := newIdem(t, rdb, IdempotencyOptions{Prefix: dead.Prefix(), Lease: lease, TakeoverQueues: []string{q}})
	other.types.Store("mail", true)
	other.Middleware()
	start := time.Now()
	time.Sleep(20 * takeoverInterval(lease))
	elapsed := time.Since(start)
	var passes, takeovers int64
	for _, i := range same {
		passes += i.takeover.passes.Load()
		takeovers += i.Stats().Takeovers
	}
	// A pass holds the turn for 4/5 of an interval: at most one pass that
	// long, whatever the number of processes (five unshared would make
	// about a hundred).
	limit := int64(elapsed/(takeoverInterval(lease)*4/5)) + 2
	if passes > limit {
		t.Fatalf("five processes of one shape made %d passes in %v, want at most %d", passes, elapsed, limit)
	}
	if n := other.takeover.passes.Load(); n == 0 {
		t.Fatal("the store that handles another type made no pass")
	}
	if takeovers+other.Stats().Takeovers != 1 {
		t.Fatalf("%d takeovers of the dead run, want 1", takeovers+other.Stats().Takeovers)
	}
}

// A task that a live server without the middleware holds (during a
// rolling deploy) has no run record, but asynq's lease of it is renewed:
// it is never taken over, however many passes look, since its copy would
// run beside it. Once that lease runs out (its worker died), each is taken
// over once. A task that asynq lost its lease of (its recoverer never
// moves such a task on) whose run finished longer ago than Retention has
// no record either: it is never taken over, or it would run again each
// Retention.
func TestTakeoverLeavesLiveWorkers(t *testing.T) {
	t.Parallel()
	rdb := newClient(t)
	q := testQueue(t)
	const lease = 100 * time.Millisecond   // a pass every 100ms
	started := holdingWorker(t, rdb, q, 3) // the old server, without the middleware
	c := newAsynqClient(t, testAddr)
	for _, id := range []string{"old-0", "old-1", "lost"} {
		_, err := c.Enqueue(asynq.NewTask("work", nil), asynq.Queue(q), asynq.TaskID(id))
		must(t, err)
		wait.Recv(t, started, 30*time.Second, "the old server to start "+id)
	}
	const retention = 300 * time.Millisecond
	idem := newIdem(t, rdb, IdempotencyOptions{Lease: lease, Retention: retention, TakeoverQueues: []string{q}})
	e, err := idem.Begin(ctx, "lost")
	must(t, err)
	must(t, e.Complete(ctx))
	must(t, rdb.ZRem(ctx, "asynq:{"+q+"}:lease", "lost").Err())
	type run struct {
		key     string
		resumed bool
	}
	runs := make(chan run, 64)
	startAsynq(t, testAddr, q, idem.Middleware()(asynq.HandlerFunc(func(ctx context.Context, _ *asynq.Task) error {
		e, _ := ExecutionFromContext(ctx)
		runs <- run{e.Key, e.Resumed}
		return nil
	})), asynq.Config{IsFailure: IsFailure, RetryDelayFunc: fastRetry})
	_, err = c.Enqueue(asynq.NewTask("work", nil), asynq.Queue(q), asynq.TaskID("new-0"))
	must(t, err)
	if r := wait.Recv(t, runs, 30*time.Second, "the new server to run new-0"); r != (run{"new-0", false}) {
		t.Fatalf("first run %+v, want new-0's", r)
	}
	time.Sleep(8 * lease) // about eight passes, each past a Lease since it first saw the old server's tasks
	select {
	case r := <-runs:
		t.Fatalf("a run of %+v while the old server holds its task live", r)
	default:
	}
	if n := idem.Stats().Takeovers; n != 0 {
		t.Fatalf("%d takeovers of tasks that a live worker holds", n)
	}
	lapseAsynqLeases(t, rdb, q, true, "old-0", "old-1")
	got := map[string]bool{}
	for len(got) < 2 {
		r := wait.Recv(t, runs, 20*time.Second, "the old server's tasks to be taken over once their asynq leases ran out")
		if r.key != "old-0" && r.key != "old-1" || !r.resumed {
			t.Fatalf("run %+v, want resumed runs of old-0 and old-1", r)
		}
		got[r.key] = true
	}
	time.Sleep(3 * lease) // passes past lost's Retention
	for len(runs) > 0 {
		if r := <-runs; r.key == "lost" {
			t.Fatalf("run %+v of a task whose run finished and whose asynq lease is lost", r)
		}
	}
	if n := idem.Stats().Takeovers; n < 2 {
		t.Fatalf("%d takeovers, want 2", n)
	}
}

// A Key function of the user's that tells the key from the task alone (its
// payload) has its tasks taken over; one that reads asynq's task id from
// the handler's context, without checking that it is there, has none: a
// pass has no handler's context and would tell another key, under which
// a takeover's copy would run beside the live run. A worker without the
// middleware holds five tasks active, two of each type whose runs never
// began (as a worker's that died before Begin) and one keyed by its
// payload whose run a dead worker began; the live store learns each
// type from a task of it that its middleware handles. A second store looks
// too but handles no task: it takes nothing over, not even where the key
// its Key function tells without the context names a run that a dead
// worker left.
func TestTakeoverCustomKey(t *testing.T) {
	t.Parallel()
	rdb := newClient(t)
	q := testQueue(t)
	const lease = 100 * time.Millisecond
	keyOf := func(ctx context.Context, t *asynq.Task) (string, error) {
		if t.Type() == "by-payload" {
			return "pay:" + string(t.Payload()), nil
		}
		id, _ := asynq.GetTaskID(ctx) // "ctx:" without a handler's context
		return "ctx:" + id, nil
	}
	idem := newIdem(t, rdb, IdempotencyOptions{Lease: lease, Key: keyOf, TakeoverQueues: []string{q}})
	looker := newIdem(t, rdb, IdempotencyOptions{Prefix: idem.Prefix(), Lease: lease, Key: keyOf, TakeoverQueues: []string{q}})
	looker.Middleware()
	dead := newIdem(t, rdb, IdempotencyOptions{Prefix: idem.Prefix(), Lease: 20 * time.Millisecond})
	for _, k := range []string{"ctx:", "pay:p4"} {
		_, err := dead.Begin(ctx, k) // and its worker died
		must(t, err)
	}
	started := holdingWorker(t, rdb, q, 5)
	c := newAsynqClient(t, testAddr)
	for k, typ := range []string{"by-payload", "by-context", "by-payload", "by-context", "by-payload"} {
		_, err := c.Enqueue(asynq.NewTask(typ, []byte("p"+strconv.Itoa(k))), asynq.Queue(q),
			asynq.TaskID("held-"+strconv.Itoa(k)))
		must(t, err)
		wait.Recv(t, started, 30*time.Second, "held task "+strconv.Itoa(k)+" to start")
	}
	lapseAsynqLeases(t, rdb, q, true, "held-0", "held-1", "held-2", "held-3", "held-4")
	type run struct {
		key     string
		resumed bool
	}
	runs := make(chan run, 64)
	h := idem.Middleware()(asynq.HandlerFunc(func(ctx context.Context, _ *asynq.Task) error {
		e, _ := ExecutionFromContext(ctx)
		runs <- run{e.Key, e.Resumed}
		return nil
	}))
	startAsynq(t, testAddr, q, h, asynq.Config{IsFailure: IsFailure, RetryDelayFunc: fastRetry})
	for _, typ := range []string{"by-payload", "by-context"} {
		_, err := c.Enqueue(asynq.NewTask(typ, []byte("warm")), asynq.Queue(q), asynq.TaskID("warm-"+typ))
		must(t, err)
	}
	got := map[string][]bool{}
	note := func(r run) { got[r.key] = append(got[r.key], r.resumed) }
	for len(got["pay:p0"]) == 0 || len(got["pay:p2"]) == 0 || len(got["pay:p4"]) == 0 {
		note(wait.Recv(t, runs, 20*time.Second, "the held tasks keyed by their payload to be taken over"))
	}
	// Several more passes, for a takeover of the tasks keyed by context to
	// show (their type was learned with the other's).
	time.Sleep(3 * lease)
	for len(runs) > 0 {
		note(<-runs)
	}
	// What must never happen is checked exactly: a run under another key
	// than the five, a resumed run of a task keyed by context, a takeover
	// by the store that handles nothing. A loaded machine can hold a run's
	// Complete back past its 100ms lease, and asynq's retry or a second
	// takeover then runs it again: the runs of the five are counted at
	// least once.
	for k, resumed := range got {
		switch k {
		case "pay:p0", "pay:p2", "pay:p4":
			if !resumed[0] {
				t.Fatalf("%s first ran not resumed: not by a takeover (runs %v)", k, got)
			}
		case "pay:warm":
		case "ctx:warm-by-context":
			if resumed[0] {
				t.Fatalf("%s ran resumed (runs %v)", k, got)
			}
		default:
			t.Fatalf("a run under %q, a key none of the tasks has (runs, key: resumed each time: %v)", k, got)
		}
	}
	if len(got) != 5 {
		t.Fatalf("runs (key: resumed each time) %v, want the three held tasks keyed by payload and the two warm ones", got)
	}
	if n, m := idem.Stats().Takeovers, looker.Stats().Takeovers; n < 3 || m != 0 {
		t.Fatalf("%d takeovers by the live store, %d by the one that handles nothing; want at least 3, and 0", n, m)
	}
	listed, _, err := idem.Runs(ctx, "", 0)
	must(t, err)
	for _, r := range listed {
		if r.Type == "by-context" {
			t.Fatalf("Runs lists %+v, a task whose key its Key function tells only from the handler's context", r)
		}
	}
}

// Runs tells a task whose worker died before its run began from one a live
// worker holds: both have no run record, and asynq's lease of the task
// decides, as it decides the takeover. A worker without the middleware
// holds seven tasks; two of them had their run released after a failure,
// one with retries left and one whose failure ended its task. Before
// asynq's leases run out every one is "no record"; once they have run out
// (for one never-begun task and the final release), or once they were
// last renewed 13 s ago (they have not run out: for another never-begun
// task and the release with retries left), the never-begun tasks and the
// released run with retries left are abandoned, as a takeover would start
// them again, and the other two stay "no record" (the live one's lease
// kept as renewed 7 s ago: a renewal 2 s late). So does a task whose
// lease looks renewed 13 s ago but which a live server lists among its
// workers' (a server whose clock runs behind), while a task whose lease
// looks as old is abandoned though a live server lists its id in another
// queue. A Broker's Stats counts the four. Under an asynq of another
// release line only the lapsed lease's task is abandoned.
func TestRunsShowNotBegunAbandoned(t *testing.T) {
	t.Parallel()
	rdb := newClient(t)
	q := testQueue(t)
	idem := newIdem(t, rdb, IdempotencyOptions{Lease: 100 * time.Millisecond, TakeoverQueues: []string{q}, DisableTakeover: true})
	started := holdingWorker(t, rdb, q, 7)
	c := newAsynqClient(t, testAddr)
	ids := []string{"alive", "skewed", "not-begun", "silent", "released", "final", "twin"}
	for _, id := range ids {
		_, err := c.Enqueue(asynq.NewTask("work", nil), asynq.Queue(q), asynq.TaskID(id))
		must(t, err)
		wait.Recv(t, started, 30*time.Second, "the worker to start "+id)
	}
	e, err := idem.Begin(ctx, "released")
	must(t, err)
	must(t, e.Release(ctx))
	e, err = idem.Begin(ctx, "final")
	must(t, err)
	must(t, e.release(ctx, "failed for good", true))
	states := func() map[string]RunState {
		runs, _, err := idem.Runs(ctx, "", 0)
		must(t, err)
		got := map[string]RunState{}
		for _, r := range runs {
			got[r.TaskID] = r.State
		}
		return got
	}
	for id, s := range states() {
		if s != RunNone {
			t.Fatalf("%s is %q while its worker holds it live; want %q", id, s, RunNone)
		}
	}
	lapseAsynqLeases(t, rdb, q, true, "not-begun", "final")
	renewAsynqLeases(t, rdb, q, 13*time.Second, true, "silent", "released")
	unlistAsynqWorkers(t, rdb, q, "silent", "released")
	renewAsynqLeases(t, rdb, q, 7*time.Second, true, "alive") // a live server's renewal, 2 s late
	// A live server whose clock runs 13 s behind: its renewals look 13 s
	// old, but it lists the task among its workers'.
	renewAsynqLeases(t, rdb, q, 13*time.Second, true, "skewed")
	listAsAsynqWorkers(t, rdb, q, "skewed")
	// A live server holds a task of another queue under twin's id: twin's
	// own server is as silent as silent's.
	renewAsynqLeases(t, rdb, q, 13*time.Second, true, "twin")
	unlistAsynqWorkers(t, rdb, q, "twin")
	listAsAsynqWorkers(t, rdb, q+"-other", "twin")
	want := map[string]RunState{"alive": RunNone, "skewed": RunNone, "not-begun": RunAbandoned, "silent": RunAbandoned,
		"released": RunAbandoned, "final": RunNone, "twin": RunAbandoned}
	b := newBroker(t, BrokerOptions{Runs: idem})
	for deadline := time.Now().Add(10 * time.Second); ; {
		got := states()
		if got["alive"] != RunNone || got["skewed"] != RunNone || got["final"] != RunNone {
			t.Fatalf("runs %v: a task held live, or one whose failure ended it, is not %q", got, RunNone)
		}
		if maps.Equal(got, want) {
			break
		}
		// The holding server's renewal (every 5 s) can move a lease back
		// for up to 20 ms before lapseAsynqLeases moves it out again.
		if time.Now().After(deadline) {
			t.Fatalf("runs %v once asynq's leases ran out; want %v", got, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
	for deadline := time.Now().Add(10 * time.Second); ; {
		st, err := b.Stats(ctx)
		must(t, err)
		if st.Abandoned == 4 {
			break
		}
		if st.Abandoned > 4 || time.Now().After(deadline) {
			t.Fatalf("Stats().Abandoned = %d, want 4", st.Abandoned)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Under an asynq whose keys the store does not know, a lease set's
	// scores and the servers' lists are not read: only the inspector's
	// IsOrphaned (the lease ran out) tells that a worker is gone.
	idem.adapter.known = false
	want = map[string]RunState{"alive": RunNone, "skewed": RunNone, "not-begun": RunAbandoned, "silent": RunNone,
		"released": RunNone, "final": RunNone, "twin": RunNone}
	for deadline := time.Now().Add(10 * time.Second); ; {
		got := states()
		if got["silent"] != RunNone || got["released"] != RunNone {
			t.Fatalf("runs %v under an unknown asynq: a task whose asynq lease has not run out is not %q", got, RunNone)
		}
		if maps.Equal(got, want) {
			break
		}
		if time.Now().After(deadline) { // as above: a renewal can move a lapsed lease back for a moment
			t.Fatalf("runs %v under an unknown asynq; want %v", got, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
