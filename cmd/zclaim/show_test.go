package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/zclaim/zclaim"
	"github.com/zclaim/zclaim/internal/redisproc"
	"github.com/zclaim/zclaim/internal/wait"
)

// zclaim show (the built binary) finds a job a Dispatcher enqueued,
// wherever asynq has it: pending, in retry with its error, archived, and
// completed; exit 0 for each, with its queue and task, and its history.
func TestShowFindsJobInAsynq(t *testing.T) {
	t.Parallel()
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { rdb.Close() })
	key := ownKey(t)
	queue := fmt.Sprint("cli-show-", time.Now().UnixNano())
	b := dispatching(t, rdb, key, asynq.Queue(queue), asynq.MaxRetry(1))
	due := time.Now().Add(-time.Second).Truncate(time.Second)
	var jobs []zclaim.Job
	for _, id := range []string{"order-pending", "order-retry", "order-archived", "order-done"} {
		jobs = append(jobs, zclaim.Job{ID: id, RunAt: due, Type: "order:send"})
	}
	if err := b.Schedule(ctx, jobs...); err != nil {
		t.Fatal(err)
	}
	wait.Until(t, 10*time.Second, "the jobs enqueued and their claims settled", func() bool {
		for _, j := range jobs {
			js, err := b.Jobs(ctx, j.ID)
			if err != nil || len(js) != 1 || js[0].State != zclaim.StateEnqueued {
				return false
			}
		}
		return true
	})
	out, errOut, code := runCLI(t, srv, "show", "order-pending", "--key", key)
	want(t, "show order-pending", code, exitOK, out, errOut)
	for _, w := range []string{`(?m)^state +enqueued$`, `(?m)^asynq state +pending$`, `(?m)^queue +` + queue + `$`,
		`(?m)^asynq task +order-pending@` + due.UTC().Format("2006-01-02T15:04:05") + `.000Z$`} {
		if !regexp.MustCompile(w).MatchString(out) {
			t.Fatalf("show order-pending: no %s in\n%s", w, out)
		}
	}

	srvA := asynq.NewServerFromRedisClient(rdb, asynq.Config{Queues: map[string]int{queue: 1}, Concurrency: 4,
		TaskCheckInterval: 10 * time.Millisecond, Logger: redisproc.QuietAsynq{}, LogLevel: asynq.FatalLevel,
		RetryDelayFunc: func(int, error, *asynq.Task) time.Duration { return time.Hour }})
	block := make(chan struct{})
	idem, err := zclaim.NewIdempotency(rdb, zclaim.IdempotencyOptions{Prefix: key + ":run:"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { idem.Close() })
	if err := srvA.Start(idem.Middleware()(asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
		j, _ := zclaim.JobFromTask(t)
		switch j.ID {
		case "order-retry":
			return errors.New("smtp: 451 try later")
		case "order-archived":
			return fmt.Errorf("no such address: %w", asynq.SkipRetry)
		case "order-pending":
			<-block
		}
		return nil
	}))); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { close(block); srvA.Shutdown() })
	for id, state := range map[string]string{"order-retry": "retry", "order-archived": "archived",
		"order-done": "completed", "order-pending": "active"} {
		wait.Until(t, 10*time.Second, id+" "+state, func() bool {
			out, _, code := runCLI(t, srv, "show", id, "--key", key, "--json")
			var r struct{ Jobs []zclaim.JobInfo }
			return code == exitOK && json.Unmarshal([]byte(out), &r) == nil && len(r.Jobs) == 1 &&
				r.Jobs[0].State == zclaim.StateEnqueued && r.Jobs[0].TaskState == state
		})
	}
	// The stories, as the scripts of each step wrote them: the
	// schedule's, then the run's (its start, with its token and process).
	run := `token \d+ on [^ ]+:\d+`
	for id, lines := range map[string][]string{
		"order-retry": {`(?m)^asynq state +retry$`, `(?m)^retried +1$`, `(?m)^last error +smtp: 451 try later$`,
			`(?m)^history +\S+ \S+  scheduled: due \S+$`, `(?m)^ +\S+ \S+  claimed: by a dispatcher$`,
			`(?m)^ +\S+ \S+  enqueued: task order-retry@\S+ in queue ` + queue + `$`,
			`(?m)^ +\S+ \S+  started: ` + run + `$`, `(?m)^ +\S+ \S+  failed: smtp: 451 try later$`},
		"order-done": {`(?m)^history +\S+ \S+  scheduled: due \S+\n +\S+ \S+  claimed: by a dispatcher\n` +
			` +\S+ \S+  enqueued: task order-done@\S+ in queue \S+\n +\S+ \S+  started: ` + run +
			`\n +\S+ \S+  finished: ` + run + `$`},
	} {
		out, errOut, code = runCLI(t, srv, "show", id, "--key", key, "--runs", key+":run:")
		want(t, "show "+id, code, exitOK, out, errOut)
		for _, w := range lines {
			if !regexp.MustCompile(w).MatchString(out) {
				t.Fatalf("show %s: no %s in\n%s", id, w, out)
			}
		}
	}
}

// takeoverWorker is the role of a worker process that TestShowTakenOver
// SIGKILLs: the middleware around a handler that marks its start and
// never returns.
const takeoverWorker = "ZCLAIM_TEST_TAKEOVER_WORKER"

func runTakeoverWorker() {
	rdb := redis.NewClient(&redis.Options{Addr: os.Getenv("ZCLAIM_TEST_ADDR")})
	key, queue := os.Getenv("ZCLAIM_TEST_KEY"), os.Getenv("ZCLAIM_TEST_QUEUE")
	idem, err := zclaim.NewIdempotency(rdb, zclaim.IdempotencyOptions{Prefix: key + ":run:", Lease: time.Second,
		TakeoverQueues: []string{queue}})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	srv := asynq.NewServerFromRedisClient(idem.AsynqClient(), asynq.Config{Queues: map[string]int{queue: 1},
		TaskCheckInterval: 10 * time.Millisecond, LogLevel: asynq.FatalLevel})
	err = srv.Run(idem.Middleware()(asynq.HandlerFunc(func(ctx context.Context, _ *asynq.Task) error {
		rdb.Set(ctx, key+":started", "1", time.Minute)
		select {}
	})))
	fmt.Fprintln(os.Stderr, err)
	os.Exit(2)
}

// zclaim show (the built binary) tells the story of a job whose worker was
// SIGKILLed mid-handler: the dead run's start, the takeover by a live
// process (from that run's token, after how long silent), the run it
// started and its finish.
func TestShowTakenOver(t *testing.T) {
	t.Parallel()
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { rdb.Close() })
	key := ownKey(t)
	queue := fmt.Sprint("cli-taken-", time.Now().UnixNano())
	worker := exec.Command(os.Args[0], "-test.run=^$")
	worker.Env = append(os.Environ(), takeoverWorker+"=1", "ZCLAIM_TEST_ADDR="+srv.Addr, "ZCLAIM_TEST_KEY="+key,
		"ZCLAIM_TEST_QUEUE="+queue)
	worker.Stderr = os.Stderr
	if err := worker.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { worker.Process.Kill(); worker.Wait() })
	b := dispatching(t, rdb, key, asynq.Queue(queue))
	if err := b.Schedule(ctx, zclaim.Job{ID: "order-taken", RunAt: time.Now().Add(-time.Second), Type: "work"}); err != nil {
		t.Fatal(err)
	}
	wait.Until(t, 15*time.Second, "the worker to start the handler", func() bool {
		return rdb.Exists(ctx, key+":started").Val() == 1
	})
	if err := worker.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	worker.Wait()
	// A live process: its takeover puts the task back, and its server runs it.
	idem, err := zclaim.NewIdempotency(rdb, zclaim.IdempotencyOptions{Prefix: key + ":run:", Lease: time.Second,
		TakeoverQueues: []string{queue}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { idem.Close() })
	live := asynq.NewServerFromRedisClient(idem.AsynqClient(), asynq.Config{Queues: map[string]int{queue: 1},
		TaskCheckInterval: 10 * time.Millisecond, Logger: redisproc.QuietAsynq{}, LogLevel: asynq.FatalLevel})
	if err := live.Start(idem.Middleware()(asynq.HandlerFunc(func(context.Context, *asynq.Task) error { return nil }))); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(live.Shutdown)
	var out, errOut string
	var code int
	wait.Until(t, 15*time.Second, "the job's run taken over and finished", func() bool {
		out, errOut, code = runCLI(t, srv, "show", "order-taken", "--key", key, "--runs", key+":run:")
		return code == exitOK && strings.Contains(out, "  finished: ")
	})
	run := `token (\d+) on [^ ]+:\d+`
	story := regexp.MustCompile(`(?m)^history +\S+ \S+  scheduled: due \S+\n +\S+ \S+  claimed: by a dispatcher\n` +
		` +\S+ \S+  enqueued: task order-taken@\S+ in queue \S+\n +\S+ \S+  started: token (\d+)\n` +
		` +\S+ \S+  taken over: by [^ ]+:\d+, from token (\d+), silent (\S+)\n` +
		` +\S+ \S+  started: ` + run + `\n +\S+ \S+  finished: ` + run + `$`)
	m := story.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("show order-taken: no story of its takeover in\n%s%s", out, errOut)
	}
	if silent, err := time.ParseDuration(m[3]); m[1] != m[2] || m[4] != m[5] || m[4] == m[1] || err != nil || silent < time.Second {
		t.Fatalf("show order-taken: the takeover names token %s, silent %s, after a run of token %s; the run after it %s, "+
			"finished %s:\n%s", m[2], m[3], m[1], m[4], m[5], out)
	}
}

// dispatching gives t a schedule at key whose Dispatcher enqueues each job
// as a task with opts until t ends.
func dispatching(t *testing.T, rdb *redis.Client, key string, opts ...asynq.Option) *zclaim.Broker {
	b, err := zclaim.NewBroker(rdb, zclaim.BrokerOptions{Key: key})
	if err != nil {
		t.Fatal(err)
	}
	ac := asynq.NewClientFromRedisClient(rdb)
	t.Cleanup(func() { ac.Close() })
	d, err := zclaim.NewDispatcher(b, ac, zclaim.DispatcherOptions{TaskOptions: func(zclaim.Job) []asynq.Option {
		return opts
	}})
	if err != nil {
		t.Fatal(err)
	}
	dctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); d.Run(dctx) }()
	t.Cleanup(func() { stop(); <-done })
	return b
}
