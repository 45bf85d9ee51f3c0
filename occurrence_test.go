package zclaim

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/zclaim/zclaim/internal/logbuf"
	"github.com/zclaim/zclaim/internal/proc"
	"github.com/zclaim/zclaim/internal/wait"
	"pgregory.net/rapid"
)

// runsLog counts handler runs per job id and keeps the JobInfo of each.
type runsLog struct {
	mu   sync.Mutex
	runs map[string][]JobInfo
}

func (l *runsLog) handler() asynq.Handler {
	return asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
		j, ok := JobFromContext(ctx)
		if !ok {
			return fmt.Errorf("no JobInfo in the context of task %+v", t.Headers())
		}
		l.mu.Lock()
		defer l.mu.Unlock()
		l.runs[j.ID] = append(l.runs[j.ID], j)
		return nil
	})
}

func (l *runsLog) get(id string) []JobInfo {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]JobInfo(nil), l.runs[id]...)
}

// counts returns how many times each job ran.
func (l *runsLog) counts() map[string]int {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make(map[string]int, len(l.runs))
	for id, r := range l.runs {
		out[id] = len(r)
	}
	return out
}

// serveRuns runs an asynq server on rdb (its default queue) whose handler,
// wrapped in idem's middleware, logs each run; stopped when the test ends.
// serveRuns runs an asynq server on idem's AsynqClient (the quick start's)
// whose handler, under idem's middleware, logs each run; rdb is idem's
// client.
func serveRuns(t *testing.T, rdb redis.UniversalClient, idem *Idempotency) *runsLog {
	log := &runsLog{runs: map[string][]JobInfo{}}
	if idem.rdb != rdb {
		t.Fatal("serveRuns: rdb is not the store's client")
	}
	srv := asynq.NewServerFromRedisClient(idem.AsynqClient(), asynq.Config{Concurrency: 4, TaskCheckInterval: 10 * time.Millisecond,
		Logger: quietLogger{}, LogLevel: asynq.FatalLevel})
	must(t, srv.Start(idem.Middleware()(log.handler())))
	t.Cleanup(srv.Shutdown)
	return log
}

func (l *runsLog) total() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, r := range l.runs {
		n += len(r)
	}
	return n
}

// A member added again by a producer's plain ZADD while it waits as a
// retry is new work: the ZADD only moves the member, and the claim that
// finds it at another score than the retry was put back at starts a new
// occurrence due at that score (the retry's run of the old occurrence may
// have finished: its settle came after its lease). A retry moved by the
// broker (RunNow) or claimed at its own score stays a retry of its
// occurrence. Per job, as a batch, and as the dispatcher's batch of ids.
func TestZAddOfAWaitingRetryIsNewWork(t *testing.T) {
	t.Parallel()
	for name, mode := range map[string]claimMode{"per job": leasePerJob, "batch": leaseBatch, "batch of ids": leaseBatchIDs} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			key := plainKey(t)
			rdb := newClient(t)
			short := newBroker(t, BrokerOptions{Key: key}) // a lease of 50 ms
			b := newBroker(t, BrokerOptions{Key: key, Lease: time.Minute})
			now := redisNow(t, rdb)
			first := float64(now.Add(-time.Second).UnixMilli()) / 1000
			for i, id := range []string{"readded", "run-now", "retried"} {
				must(t, rdb.ZAdd(ctx, key, redis.Z{Score: first + float64(i)/1000, Member: id}).Err())
			}
			// readded: its lease runs out without an Ack, and recovery puts
			// it back after its backoff.
			cs, err := short.Claim(ctx, 1)
			must(t, err)
			if len(cs) != 1 || cs[0].ID != "readded" || cs[0].Attempt != 1 {
				t.Fatalf("first claim %+v", cs)
			}
			occurrence := map[string]time.Time{}
			waitFor(t, 10*time.Second, "the expired claim to be recovered", func() bool {
				r, err := short.Recover(ctx)
				return err == nil && r.Requeued == 1
			})
			// run-now waits as a retry an hour away and is run now; retried
			// is put back at a score already due.
			cs, err = b.Claim(ctx, 2)
			must(t, err)
			if len(cs) != 2 || cs[0].ID != "run-now" || cs[1].ID != "retried" {
				t.Fatalf("second claim %+v", cs)
			}
			for _, c := range cs {
				occurrence[c.ID] = c.Due
			}
			must(t, b.Retry(ctx, cs[0], now.Add(time.Hour)))
			must(t, b.Retry(ctx, cs[1], now.Add(-500*time.Millisecond)))
			_, err = b.RunNow(ctx, "run-now")
			must(t, err)
			second := first + 0.5 // due already, before readded's backoff ends
			must(t, rdb.ZAdd(ctx, key, redis.Z{Score: second, Member: "readded"}).Err())
			got := claimByID(t, b, mode, 3)
			at := time.UnixMilli(int64(second*1000 + 0.5))
			if c := got["readded"]; c.Attempt != 1 || !c.Due.Equal(at) || mode != leaseBatchIDs && !c.RunAt.Equal(at) {
				t.Errorf("readded: attempt %d, due %v, run at %v; want attempt 1 of a new occurrence due %v",
					c.Attempt, c.Due, c.RunAt, at)
			}
			for _, id := range []string{"run-now", "retried"} {
				if c := got[id]; c.Attempt != 2 || !c.Due.Equal(occurrence[id]) {
					t.Errorf("%s: attempt %d, due %v; want attempt 2 of the occurrence due %v", id, c.Attempt, c.Due, occurrence[id])
				}
			}
			// What the claim took left no record behind.
			if n, _ := rdb.HLen(ctx, b.shards[0].pending).Result(); n != 0 {
				t.Errorf("%d pending records left", n)
			}
		})
	}
}

// A member added again with plain ZADD after it ran is a new occurrence
// and runs again; the same ZADD repeated (same score) is the same
// occurrence and does not. The task's id names the occurrence and the
// handler reads the job from its context.
func TestReaddedMemberRunsAgain(t *testing.T) {
	t.Parallel()
	for _, mw := range []bool{false, true} {
		t.Run(map[bool]string{false: "plain", true: "middleware"}[mw], func(t *testing.T) {
			key, q := plainKey(t), testQueue(t)
			rdb := newClient(t)
			log := &runsLog{runs: map[string][]JobInfo{}}
			h := WithJob(log.handler())
			var idem *Idempotency
			if mw {
				idem = newIdem(t, rdb, IdempotencyOptions{})
				h = idem.Middleware()(log.handler())
			}
			startAsynq(t, testAddr, q, h, asynq.Config{})
			// A lease far longer than a loaded machine takes to settle a
			// claim, so that the test sees only the runs it makes: were the
			// lease to run out first, recovery would give the first
			// occurrence back as a retry (which the second ZADD then turns
			// into new work, TestZAddOfAWaitingRetryIsNewWork).
			b := newBroker(t, BrokerOptions{Key: key, Lease: time.Second})
			d, err := NewDispatcher(b, newAsynqClient(t, testAddr), DispatcherOptions{DefaultType: "adopted",
				TaskOptions: func(Job) []asynq.Option { return []asynq.Option{asynq.Queue(q)} }})
			must(t, err)
			runDispatcher(t, d)
			defer func() { // what a failure saw
				if t.Failed() {
					st, err := b.Stats(ctx)
					t.Logf("dispatcher %+v; schedule %+v (%v); runs %+v", d.Stats(), st, err, log.get("order-731"))
					if idem != nil {
						t.Logf("middleware %+v", idem.Stats())
					}
					if qi, err := newInspector(t).GetQueueInfo(q); err == nil {
						t.Logf("asynq queue %+v", *qi)
					}
				}
			}()

			zadd := func(score float64) {
				t.Helper()
				must(t, rdb.ZAdd(ctx, key, redis.Z{Score: score, Member: "order-731"}).Err())
			}
			first := float64(redisNow(t, rdb).Add(-time.Second).UnixMilli()) / 1000
			zadd(first)
			waitFor(t, 20*time.Second, "the first run", func() bool { return len(log.get("order-731")) == 1 })
			second := first + 0.5
			zadd(second) // a new due time: new work
			waitFor(t, 20*time.Second, "the second run", func() bool { return len(log.get("order-731")) == 2 })
			zadd(second) // the same ZADD again: the same occurrence
			waitFor(t, 20*time.Second, "the repeat to be settled", func() bool {
				st, err := b.Stats(ctx)
				return err == nil && st.Scheduled == 0 && st.Inflight == 0 && d.Stats().Conflicts == 1
			})
			time.Sleep(50 * time.Millisecond) // a third run would start by now
			runs := log.get("order-731")
			if len(runs) != 2 {
				t.Fatalf("order-731 ran %d times, want 2: %+v", len(runs), runs)
			}
			for i, want := range []float64{first, second} {
				due := time.UnixMilli(int64(want*1000 + 0.5))
				if runs[i].ID != "order-731" || !runs[i].Due.Equal(due) || runs[i].Attempt != 1 {
					t.Errorf("run %d: JobFromContext gave %+v, want order-731 due %v, attempt 1", i, runs[i], due)
				}
				info, err := newInspector(t).GetTaskInfo(q, OccurrenceID("order-731", due))
				if err != nil {
					t.Fatalf("asynq has no task named by occurrence %s: %v", OccurrenceID("order-731", due), err)
				}
				if len(info.Headers) != 0 || info.State != asynq.TaskStateCompleted || info.Retention < time.Minute {
					t.Errorf("task %s: headers %v, state %v, retention %v", info.ID, info.Headers, info.State, info.Retention)
				}
			}
			if mw {
				if st := idem.Stats(); st.Completed != 2 {
					t.Errorf("middleware stats %+v, want 2 completed", st)
				}
			}
		})
	}
}

// A retry's backoff moves the job but not its occurrence; a new Schedule
// of a job that has not run yet moves it to a new occurrence.
func TestOccurrenceSurvivesRetries(t *testing.T) {
	t.Parallel()
	b := newBroker(t, BrokerOptions{Backoff: func(int) time.Duration { return 0 }})
	due := redisNow(t, b.rdb).Add(-time.Second).Truncate(time.Millisecond)
	must(t, b.Schedule(ctx, Job{ID: "j", RunAt: due.Add(-time.Hour)}))
	must(t, b.Schedule(ctx, Job{ID: "j", RunAt: due})) // moved before it ran
	cs, err := b.Claim(ctx, 1)
	must(t, err)
	if len(cs) != 1 || !cs[0].Due.Equal(due) || !cs[0].RunAt.Equal(due) {
		t.Fatalf("claims %+v, want one due %v", cs, due)
	}
	must(t, b.Retry(ctx, cs[0], time.Time{}))
	cs, err = b.Claim(ctx, 1)
	must(t, err)
	if len(cs) != 1 || !cs[0].Due.Equal(due) || cs[0].Attempt != 2 || !cs[0].RunAt.After(due) {
		t.Fatalf("after a retry: %+v, want attempt 2 of the occurrence due %v, run later", cs, due)
	}
	time.Sleep(60 * time.Millisecond) // the lease (50ms) expires
	r, err := b.Recover(ctx)
	must(t, err)
	cs, err = b.Claim(ctx, 1)
	must(t, err)
	if r.Requeued != 1 || len(cs) != 1 || !cs[0].Due.Equal(due) || cs[0].Attempt != 3 {
		t.Fatalf("after recovery %+v: %+v, want attempt 3 of the occurrence due %v", r, cs, due)
	}
	if got, want := cs[0].info().Occurrence(), "j@"+due.UTC().Format("2006-01-02T15:04:05.000Z"); got != want {
		t.Fatalf("occurrence %q, want %q", got, want)
	}
	must(t, b.Kill(ctx, cs[0], "test"))
	n, err := b.Revive(ctx, "j")
	must(t, err)
	cs, err = b.Claim(ctx, 1)
	must(t, err)
	if n != 1 || len(cs) != 1 || !cs[0].Due.Equal(due) || cs[0].Attempt != 1 {
		t.Fatalf("revived: %+v, want attempt 1 of the occurrence due %v", cs, due)
	}
}

// The crash test's dispatcher runs in a child process (this test binary,
// run again with crashRole set to "addr key queue n retention") so that
// it can be SIGKILLed.
const crashRole = "ZCLAIM_TEST_CRASH"

// runCrashRole is the child, taken by TestMain when crashRole is set: it
// dispatches the schedule named there and prints "enqueued" once per
// task. Each enqueueing goroutine then blocks, so no batch is ever
// settled: the parent kills the process between its enqueues and its
// settle.
func runCrashRole() bool {
	cfg := os.Getenv(crashRole)
	if cfg == "" {
		return false
	}
	var addr, key, queue string
	var n, retention int
	_, err := fmt.Sscan(cfg, &addr, &key, &queue, &n, &retention)
	roleMust(err)
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	// No recovery here: a claim whose lease ran out before a worker took
	// it would never be enqueued. The lease outlasts a loaded machine's
	// wait; the parent recovers the claims after it once this child is dead.
	b, err := NewBroker(rdb, BrokerOptions{Key: key, Lease: 2 * time.Second})
	roleMust(err)
	ac := asynq.NewClientFromRedisClient(rdb)
	var mu sync.Mutex
	d, err := NewDispatcher(b, ac, DispatcherOptions{
		Concurrency:      n,
		RecoveryInterval: -1,
		TaskRetention:    time.Duration(retention) * time.Second,
		TaskOptions:      func(Job) []asynq.Option { return []asynq.Option{asynq.Queue(queue)} },
		OnDispatch: func(c JobInfo, _ time.Duration, err error) {
			mu.Lock()
			fmt.Println("enqueued", c.ID, err)
			mu.Unlock()
			select {} // never settle
		},
	})
	roleMust(err)
	d.Run(context.Background())
	return true
}

// A dispatcher SIGKILLed after its enqueues and before it settled their
// batches: recovery puts the jobs back after the lease, another dispatcher
// dispatches them again, and still every job runs once, with the
// middleware or without it (asynq keeps the completed tasks for
// TaskRetention). Without either, every job runs twice: the test's control.
func TestDispatcherCrashBeforeSettle(t *testing.T) {
	t.Parallel()
	const n = 200
	for _, tc := range []struct {
		name       string
		middleware bool
		retention  int // seconds; -1: none
		runs       int
	}{
		{"retention", false, 0, 1},
		{"middleware", true, -1, 1},
		{"neither (control)", false, -1, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key, q := testKey(t), testQueue(t)
			log := &runsLog{runs: map[string][]JobInfo{}}
			h := WithJob(log.handler())
			var idem *Idempotency
			if tc.middleware {
				idem = newIdem(t, newClient(t), IdempotencyOptions{})
				h = idem.Middleware()(log.handler())
			}
			startAsynq(t, testAddr, q, h, asynq.Config{Concurrency: 20})
			b := newBroker(t, BrokerOptions{Key: key, Lease: time.Second, Backoff: func(int) time.Duration { return 0 }})
			due := redisNow(t, b.rdb).Add(-time.Second)
			jobs := make([]Job, n)
			for i := range jobs {
				jobs[i] = Job{ID: "order-" + strconv.Itoa(i), RunAt: due, Type: "t"}
			}
			must(t, b.Schedule(ctx, jobs...))

			cmd := exec.Command(os.Args[0])
			cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s %s %s %d %d", crashRole, testAddr, key, q, n, tc.retention))
			proc.DieWithParent(cmd)
			out, err := cmd.StdoutPipe()
			must(t, err)
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			must(t, cmd.Start())
			// The child's lines, read apart so that a child that stops
			// short fails the test in time instead of hanging it.
			lines, quit := make(chan string), make(chan struct{})
			t.Cleanup(func() { close(quit) })
			go func() {
				defer close(lines)
				for sc := bufio.NewScanner(out); sc.Scan(); {
					select {
					case lines <- sc.Text():
					case <-quit:
						return
					}
				}
			}()
			fail := func(format string, args ...any) {
				cmd.Process.Kill()
				cmd.Wait()
				t.Fatalf(format, args...)
			}
			enqueued := 0
			stop := time.After(30 * time.Second)
			for enqueued < n {
				var line string
				var ok bool
				select {
				case line, ok = <-lines:
				case <-stop:
				}
				if !ok {
					fail("child enqueued %d of %d in 30s: %s", enqueued, n, stderr.String())
				}
				if f := strings.Fields(line); len(f) == 3 && f[0] == "enqueued" {
					if f[2] != "<nil>" {
						fail("child: %s", line)
					}
					enqueued++
				}
			}
			// Every task runs and completes before the child dies (in
			// seconds; 30 s for a machine under load).
			waitFor(t, 30*time.Second, "every task run", func() bool { return log.total() >= n })
			must(t, cmd.Process.Signal(syscall.SIGKILL))
			cmd.Wait()
			if st, err := b.Stats(ctx); err != nil || st.Inflight != n {
				t.Fatalf("after the kill: stats %+v (%v), want %d in flight", st, err, n)
			}

			d, err := NewDispatcher(b, newAsynqClient(t, testAddr), DispatcherOptions{RecoveryInterval: 20 * time.Millisecond,
				TaskOptions: func(Job) []asynq.Option { return []asynq.Option{asynq.Queue(q)} }})
			must(t, err)
			runDispatcher(t, d)
			waitFor(t, 30*time.Second, "every job dispatched again", func() bool {
				st, err := b.Stats(ctx)
				// At least n claims: on a loaded machine an enqueue can outlast
				// a lease, and its job is claimed again.
				return err == nil && st.Inflight == 0 && st.Scheduled == 0 && d.Stats().Claimed >= n
			})
			want := n * tc.runs
			// At least n: a job claimed again after an enqueue that outlasted
			// its lease is dispatched again, and meets its TaskID or the
			// middleware once more. The runs are counted below.
			if tc.middleware {
				waitFor(t, 30*time.Second, "every re-dispatched task skipped", func() bool { return idem.Stats().Skipped >= n })
			} else {
				// Each re-dispatch met its TaskID or ran, and every run
				// expected came: a conflict may also be a claim again after
				// an enqueue that outlasted its lease, beside runs still to come.
				waitFor(t, 30*time.Second, "every re-dispatch settled", func() bool {
					st := d.Stats()
					return st.Conflicts+int64(log.total()-n) >= n && log.total() >= want
				})
			}
			time.Sleep(100 * time.Millisecond) // a late extra run would show by now
			if got := log.total(); got != want {
				t.Fatalf("%d runs of %d jobs, want %d; dispatcher %+v", got, n, want, d.Stats())
			}
			for i := range n {
				id := "order-" + strconv.Itoa(i)
				if r := log.get(id); len(r) != tc.runs {
					t.Fatalf("%s ran %d times", id, len(r))
				}
			}
			t.Logf("dispatcher after the crash: %+v", d.Stats())
		})
	}
}

// The middleware counts what it did and logs its skips at Info; the
// dispatcher logs jobs without a type once per batch, with the fix.
func TestSkipsAndFailuresVisible(t *testing.T) {
	var buf logbuf.Buffer
	logger := slog.New(slog.NewTextHandler(&buf, nil))
	rdb := newClient(t)
	const key = "order-731"
	idem := newIdem(t, rdb, IdempotencyOptions{Lease: time.Second, Logger: logger,
		Key: func(context.Context, *asynq.Task) (string, error) { return key, nil }})
	task := asynq.NewTask("t", nil)
	run := func(h func(ctx context.Context) error) error {
		return idem.Middleware()(asynq.HandlerFunc(func(ctx context.Context, _ *asynq.Task) error { return h(ctx) })).ProcessTask(ctx, task)
	}
	fail := fmt.Errorf("handler failed")
	if err := run(func(context.Context) error { return fail }); err != fail {
		t.Fatalf("failing handler: %v", err)
	}
	must(t, run(func(context.Context) error { return nil }))
	must(t, run(func(context.Context) error { t.Error("ran a finished key"); return nil }))
	forget(t, rdb, idem, key)
	e, err := idem.Begin(ctx, key) // another run holds the key
	must(t, err)
	wantErr(t, run(func(context.Context) error { t.Error("ran a held key"); return nil }), ErrInProgress)
	must(t, e.Release(ctx))
	err = run(func(ctx context.Context) error { // the record is taken from under the run
		forget(t, rdb, idem, key)
		_, err := idem.Begin(ctx, key)
		return err
	})
	wantErr(t, err, ErrLeaseLost)
	want := IdempotencyStats{Skipped: 1, InProgress: 1, Completed: 1, Released: 1, LeaseLost: 1}
	if got := idem.Stats(); got != want {
		t.Errorf("stats %+v, want %+v", got, want)
	}
	for _, line := range []string{
		"level=INFO msg=\"zclaim: skipped a task whose work already finished\"",
		"level=INFO msg=\"zclaim: task's work is running elsewhere; asynq will try it again\"",
	} {
		if !strings.Contains(buf.String(), line) {
			t.Errorf("log lacks %s:\n%s", line, buf.String())
		}
	}

	// Three members without a type, one batch: one Error line, with the fix,
	// in the broker's logger (the dispatcher has none of its own). With no
	// logger anywhere, nothing is logged, not even to slog.Default().
	old := slog.Default()
	slog.SetDefault(logger)
	defer slog.SetDefault(old)
	for _, quiet := range []bool{true, false} {
		buf.Reset()
		var bl *slog.Logger
		if !quiet {
			bl = logger
		}
		// A lease of the default length: with the harness's 50 ms, a
		// stall of the loaded machine between the claim and the enqueue
		// gives jobs back, and they come again one batch each.
		b := newBroker(t, BrokerOptions{Logger: bl, Lease: DefaultLease})
		for _, id := range []string{"a", "b", "c"} {
			must(t, rdb.ZAdd(ctx, b.Key(), redis.Z{Score: 1, Member: id}).Err())
		}
		d, err := NewDispatcher(b, newAsynqClient(t, testAddr), DispatcherOptions{})
		must(t, err)
		stop := runDispatcher(t, d)
		waitFor(t, 20*time.Second, "the typeless jobs dead", func() bool { return d.Stats().Dead == 3 })
		if quiet {
			stop() // all it logs is logged before Run returns
			if buf.String() != "" {
				t.Errorf("no Logger given, yet logged:\n%s", buf.String())
			}
			continue
		}
		waitFor(t, 20*time.Second, "the Error log", func() bool { return strings.Contains(buf.String(), "level=ERROR") })
		if n := strings.Count(buf.String(), "level=ERROR"); n != 1 || !strings.Contains(buf.String(), "DefaultType") || !strings.Contains(buf.String(), "jobs=3") {
			t.Errorf("%d Error lines, want one naming DefaultType and 3 jobs:\n%s", n, buf.String())
		}
	}
}

// Where the server publishes keyspace events for sorted sets, a plain ZADD
// wakes a dispatcher that would otherwise sleep for its whole MaxWait.
func TestDispatcherWakesOnKeyspaceEvents(t *testing.T) {
	t.Parallel()
	srv := ownRedis(t, "--notify-keyspace-events", "Kz")
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { rdb.Close() })
	b, err := NewBroker(rdb, BrokerOptions{Key: "delay:jobs"})
	must(t, err)
	got := make(chan string, 1)
	d, err := NewDispatcher(b, asynq.NewClientFromRedisClient(rdb), DispatcherOptions{
		MaxWait: time.Hour, DefaultType: "t",
		OnDispatch: func(c JobInfo, _ time.Duration, err error) { got <- c.ID },
	})
	must(t, err)
	runDispatcher(t, d)
	time.Sleep(50 * time.Millisecond) // asleep for the hour
	must(t, rdb.ZAdd(ctx, "delay:jobs", redis.Z{Score: float64(time.Now().Unix() - 1), Member: "order-731"}).Err())
	if id := wait.Recv(t, got, 20*time.Second, "a plain ZADD to wake the dispatcher"); id != "order-731" {
		t.Fatalf("dispatched %q", id)
	}
}

// Recovery gives each job of a pass its own backoff, drawn over the range
// of Backoff: a batch whose leases expired together does not come back at
// one instant. A fixed Backoff stays fixed.
func TestRecoveryJitter(t *testing.T) {
	t.Parallel()
	for _, fixed := range []bool{false, true} {
		opts := BrokerOptions{BatchSize: 200}
		if fixed {
			opts.Backoff = func(int) time.Duration { return 700 * time.Millisecond }
		}
		b := newBroker(t, opts)
		due := redisNow(t, b.rdb).Add(-time.Second)
		jobs := make([]Job, 200)
		for i := range jobs {
			jobs[i] = Job{ID: "j" + strconv.Itoa(i), RunAt: due}
		}
		must(t, b.Schedule(ctx, jobs...))
		cs, err := b.Claim(ctx, 200)
		must(t, err)
		if len(cs) != 200 {
			t.Fatalf("claimed %d", len(cs))
		}
		time.Sleep(60 * time.Millisecond) // past the 50ms lease
		before := redisNow(t, b.rdb)
		r, err := b.Recover(ctx)
		must(t, err)
		after := redisNow(t, b.rdb)
		zs, err := b.rdb.ZRangeWithScores(ctx, b.Key(), 0, -1).Result()
		must(t, err)
		if r.Requeued != 200 || len(zs) != 200 {
			t.Fatalf("requeued %d, %d scheduled", r.Requeued, len(zs))
		}
		distinct := map[float64]bool{}
		lo, hi := before.Add(500*time.Millisecond), after.Add(time.Second+time.Millisecond)
		if fixed {
			lo, hi = before.Add(700*time.Millisecond), after.Add(701*time.Millisecond)
		}
		for _, z := range zs {
			distinct[z.Score] = true
			at := time.UnixMicro(int64(z.Score * 1e6))
			if at.Before(lo) || at.After(hi) {
				t.Fatalf("fixed %v: %s back at %v, want within %v .. %v", fixed, z.Member, at, lo, hi)
			}
		}
		if fixed && len(distinct) != 1 || !fixed && len(distinct) < 150 {
			t.Fatalf("fixed %v: %d distinct times for 200 jobs", fixed, len(distinct))
		}
	}
}

// A dispatched task's header gives back the JobInfo it was made from, for
// any id (spaces and "@" included) and due time; a header that is not one
// reports false.
func TestJobHeader(t *testing.T) {
	t.Parallel()
	rapid.Check(t, func(t *rapid.T) {
		j := JobInfo{
			ID:      rapid.StringN(1, 64, -1).Draw(t, "id"),
			Due:     time.UnixMilli(rapid.Int64Range(-1<<45, 1<<45).Draw(t, "due")),
			Attempt: rapid.IntRange(1, 1000).Draw(t, "attempt"),
		}
		got, ok := JobFromTask(asynq.NewTaskWithHeaders("t", nil, map[string]string{headerJob: j.header()}))
		if !ok || got.ID != j.ID || !got.Due.Equal(j.Due) || got.Attempt != j.Attempt {
			t.Fatalf("header %q gave %+v, %v; want %+v", j.header(), got, ok, j)
		}
	})
	for _, h := range []map[string]string{nil, {headerJob: ""}, {headerJob: "1 1787991500000"}, {headerJob: "1 1787991500000 "},
		{headerJob: "x 1787991500000 order-731"}, {headerJob: "1 soon order-731"}, {"zclaim-id": "order-731"}} {
		if j, ok := JobFromTask(asynq.NewTaskWithHeaders("t", nil, h)); ok {
			t.Errorf("headers %v gave %+v", h, j)
		}
	}
	if _, ok := JobFromTask(nil); ok {
		t.Error("a nil task gave a JobInfo")
	}
}

// An occurrence name reads back into its id and due time, for any id ("@"
// included) and due time in the years 0 to 9999 (readable); other names
// do not read.
func TestParseOccurrence(t *testing.T) {
	t.Parallel()
	rapid.Check(t, func(t *rapid.T) {
		id := rapid.StringN(1, 64, -1).Draw(t, "id")
		due := time.UnixMilli(rapid.Int64Range(-70e12, 260e12).Draw(t, "due"))
		got, gotDue, ok := ParseOccurrence(OccurrenceID(id, due))
		if ok != readable(due) || ok && (got != id || !gotDue.Equal(due)) {
			t.Fatalf("ParseOccurrence(%q) = %q, %v, %v; readable %v", OccurrenceID(id, due), got, gotDue, ok, readable(due))
		}
	})
	for _, name := range []string{"", "order-731", "@2026-08-29T08:18:20.000Z", "order-731@2026-08-29T08:18:20Z",
		"order-731@2026-08-29T08:18:20.000+01:00", "order-731@2026-8-29T08:18:20.000Z", "order-731@10000-01-01T00:00:00.000Z"} {
		if id, due, ok := ParseOccurrence(name); ok {
			t.Errorf("ParseOccurrence(%q) = %q, %v", name, id, due)
		}
	}
}

// A dispatched task carries its job in its TaskID, and in headerJob only
// where the TaskID does not say it all: a later attempt, or a TaskID that
// TaskOptions replaced. The handler reads the same JobInfo either way.
func TestDispatchedTaskHeader(t *testing.T) {
	t.Parallel()
	key, q := testKey(t), testQueue(t)
	log := &runsLog{runs: map[string][]JobInfo{}}
	startAsynq(t, testAddr, q, WithJob(log.handler()), asynq.Config{})
	// A lease that a loaded machine's enqueue does not outlast: an expired
	// one would make the next claim attempt 2.
	b := newBroker(t, BrokerOptions{Key: key, Lease: 5 * time.Second, Backoff: func(int) time.Duration { return 0 }})
	due := redisNow(t, b.rdb).Add(-time.Second).Truncate(time.Millisecond)
	must(t, b.Schedule(ctx, Job{ID: "retried", RunAt: due, Type: "t", Queue: q}))
	cs, err := b.Claim(ctx, 1)
	must(t, err)
	must(t, b.Retry(ctx, cs[0], time.Time{})) // its next claim is attempt 2
	must(t, b.Schedule(ctx, Job{ID: "first", RunAt: due, Type: "t", Queue: q}, Job{ID: "own id", RunAt: due, Type: "t", Queue: q}))
	d, err := NewDispatcher(b, newAsynqClient(t, testAddr), DispatcherOptions{TaskOptions: func(j Job) []asynq.Option {
		if j.ID == "own id" {
			return []asynq.Option{nil, asynq.TaskID("mine-1")}
		}
		return nil
	}})
	must(t, err)
	runDispatcher(t, d)
	waitFor(t, 20*time.Second, "three runs", func() bool {
		log.mu.Lock()
		defer log.mu.Unlock()
		return len(log.runs) == 3
	})
	for _, c := range []struct {
		id, taskID string
		attempt    int
		header     bool
	}{{"first", OccurrenceID("first", due), 1, false}, {"retried", OccurrenceID("retried", due), 2, true}, {"own id", "mine-1", 1, true}} {
		runs := log.get(c.id)
		// An enqueue that failed (a loaded machine: EnqueueTimeout) sends
		// its job back, and the next claim is the next attempt.
		failed := int(d.Stats().Failed)
		if len(runs) != 1 || !runs[0].Due.Equal(due) || runs[0].Attempt < c.attempt || runs[0].Attempt > c.attempt+failed {
			t.Errorf("%s: runs %+v, want one of attempt %d (+%d failed enqueues) due %v", c.id, runs, c.attempt, failed, due)
		}
		info, err := newInspector(t).GetTaskInfo(q, c.taskID)
		if err != nil {
			t.Fatalf("%s: no task %s: %v", c.id, c.taskID, err)
		}
		if _, has := info.Headers[headerJob]; has != c.header {
			t.Errorf("%s: headers %v, want a %s header: %v", c.id, info.Headers, headerJob, c.header)
		}
	}
}

// OccurrenceID's own formatting writes what time.AppendFormat writes with
// its layout, for any instant (outside years 0 to 9999 it is that).
func TestOccurrenceTimeFormat(t *testing.T) {
	t.Parallel()
	rapid.Check(t, func(t *rapid.T) {
		var at time.Time
		if rapid.Bool().Draw(t, "near") {
			at = time.UnixMilli(rapid.Int64Range(-62167219200000, 253402300799999).Draw(t, "ms")) // years 0 to 9999
		} else {
			at = time.Unix(rapid.Int64Range(-1<<40, 1<<40).Draw(t, "s"), rapid.Int64Range(0, 999999999).Draw(t, "ns"))
		}
		at = at.In(time.FixedZone("z", rapid.IntRange(-50400, 50400).Draw(t, "offset")))
		want := at.UTC().AppendFormat([]byte("x@"), occurrenceLayout)
		if got := OccurrenceID("x", at); got != string(want) {
			t.Fatalf("OccurrenceID(%v) = %q, want %q", at, got, want)
		}
	})
}

// ParseOccurrence reads what time.Parse with the layout reads, and only
// the names OccurrenceID makes.
func TestParseOccurrenceLikeTimeParse(t *testing.T) {
	t.Parallel()
	old := func(name string) (string, time.Time, bool) {
		i := strings.LastIndexByte(name, '@')
		if i <= 0 {
			return "", time.Time{}, false
		}
		due, err := time.Parse(occurrenceLayout, name[i+1:])
		if err != nil || OccurrenceID(name[:i], due) != name {
			return "", time.Time{}, false
		}
		return name[:i], time.UnixMilli(due.UnixMilli()), true
	}
	rapid.Check(t, func(t *rapid.T) {
		at := time.UnixMilli(rapid.Int64Range(-62167219200000-1000, 253402300799999+1000).Draw(t, "ms"))
		name := []byte(OccurrenceID("job", at))
		for range rapid.IntRange(0, 3).Draw(t, "edits") { // a few bytes of it changed
			p := rapid.IntRange(0, len(name)-1).Draw(t, "at")
			name[p] = rapid.SampledFrom([]byte("0123456789-:.TZ@x ")).Draw(t, "byte")
		}
		id, due, ok := ParseOccurrence(string(name))
		wid, wdue, wok := old(string(name))
		if ok != wok || id != wid || !due.Equal(wdue) {
			t.Fatalf("ParseOccurrence(%q) = %q %v %v, time.Parse's way %q %v %v", name, id, due, ok, wid, wdue, wok)
		}
	})
}
