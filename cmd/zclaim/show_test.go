package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
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
	b, err := zclaim.NewBroker(rdb, zclaim.BrokerOptions{Key: key})
	if err != nil {
		t.Fatal(err)
	}
	ac := asynq.NewClientFromRedisClient(rdb)
	t.Cleanup(func() { ac.Close() })
	d, err := zclaim.NewDispatcher(b, ac, zclaim.DispatcherOptions{TaskOptions: func(j zclaim.Job) []asynq.Option {
		return []asynq.Option{asynq.Queue(queue), asynq.MaxRetry(1)}
	}})
	if err != nil {
		t.Fatal(err)
	}
	dctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); d.Run(dctx) }()
	t.Cleanup(func() { stop(); <-done })
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
