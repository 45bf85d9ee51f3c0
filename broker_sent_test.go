package zclaim

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
)

// Jobs finds a job after a Dispatcher made it an asynq task, in each of
// asynq's states: pending (no server yet), retry (with its error),
// archived, and completed with its run finished in the Runs store; a job
// dispatched again shows its newest task; with History negative it is not
// found.
func TestJobsFindsTaskInAsynq(t *testing.T) {
	t.Parallel()
	key, queue := testKey(t), testQueue(t)
	idem := newIdem(t, newClient(t), IdempotencyOptions{Lease: time.Second})
	b := newBroker(t, BrokerOptions{Key: key, Runs: idem})
	d, err := NewDispatcher(b, newAsynqClient(t, testAddr), DispatcherOptions{
		// Claims held a second: a lapse under load would add a "back on
		// the schedule" to the stories this test reads.
		Lease:       time.Second,
		TaskOptions: func(Job) []asynq.Option { return []asynq.Option{asynq.Queue(queue), asynq.MaxRetry(1)} }})
	must(t, err)
	stop := runDispatcher(t, d)
	now := redisNow(t, b.rdb).Add(-time.Second).Truncate(time.Second) // scores in seconds
	var jobs []Job
	for _, id := range []string{"pending-1", "retry-1", "archived-1", "done-1"} {
		jobs = append(jobs, Job{ID: id, RunAt: now, Type: "t"})
	}
	must(t, b.Schedule(ctx, jobs...))
	waitFor(t, 10*time.Second, "4 enqueued and their claims settled", func() bool {
		for _, j := range jobs {
			js, err := b.Jobs(ctx, j.ID)
			if err != nil || len(js) != 1 || js[0].State != StateEnqueued {
				return false
			}
		}
		return true
	})

	j, err := b.Job(ctx, "pending-1")
	must(t, err)
	if j.State != StateEnqueued || j.TaskState != "pending" || j.Queue != queue ||
		j.TaskID != OccurrenceID("pending-1", now) || j.Enqueued.IsZero() || !j.Due.Equal(now) {
		t.Fatalf("pending-1: %+v", j)
	}

	// A server: retry-1 fails (one retry left), archived-1 fails for good,
	// done-1 succeeds; pending-1 waits (a handler that blocks until the
	// test ends).
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	startAsynq(t, testAddr, queue, idem.Middleware()(asynq.HandlerFunc(func(ctx context.Context, task *asynq.Task) error {
		info, _ := JobFromContext(ctx)
		switch info.ID {
		case "retry-1":
			return errors.New("smtp: 451 try later")
		case "archived-1":
			return fmt.Errorf("bad address: %w", asynq.SkipRetry)
		case "pending-1":
			<-release
		}
		return nil
	})), asynq.Config{RetryDelayFunc: func(int, error, *asynq.Task) time.Duration { return time.Hour }})
	story := func(j JobInfo) string { // the History's steps, as "due enqueued failed"
		var w []string
		for _, e := range j.History {
			w = append(w, e.What)
		}
		return strings.Join(w, " ")
	}
	want := map[string]func(j JobInfo) bool{
		"pending-1": func(j JobInfo) bool { return j.TaskState == "active" && story(j) == "scheduled claimed enqueued" },
		"retry-1": func(j JobInfo) bool {
			return j.TaskState == "retry" && j.Retried == 1 && j.LastError == "smtp: 451 try later" &&
				story(j) == "scheduled claimed enqueued started failed" && j.History[4].Detail == "smtp: 451 try later" &&
				j.History[4].By == thisProcess() && j.History[4].Token == j.History[3].Token && j.History[3].Token > 0
		},
		"archived-1": func(j JobInfo) bool {
			return j.TaskState == "archived" && strings.Contains(j.LastError, "bad address") && story(j) == "scheduled claimed enqueued started failed archived"
		},
		"done-1": func(j JobInfo) bool {
			return j.TaskState == "completed" && j.RunDone && story(j) == "scheduled claimed enqueued started finished"
		},
	}
	last := map[string]string{} // the story each job last had, shown if the test fails
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the stories last read: %q", last)
		}
	})
	for id, ok := range want {
		waitFor(t, 10*time.Second, id+" in its asynq state", func() bool {
			js, err := b.Jobs(ctx, id)
			if err == nil && len(js) >= 1 && js[0].State == StateEnqueued && ok(js[0]) {
				return true
			}
			if len(js) > 0 {
				last[id] = story(js[0])
			}
			return false
		})
	}

	// done-1 scheduled again: its newest task is the one found (a time
	// bucket keeps a job's newest schedule and enqueue), with the story
	// of its own occurrence.
	again := redisNow(t, b.rdb).Add(time.Second).Truncate(time.Second)
	must(t, b.Schedule(ctx, Job{ID: "done-1", RunAt: again, Type: "t"}))
	waitFor(t, 10*time.Second, "done-1's second task", func() bool {
		js, err := b.Jobs(ctx, "done-1")
		if err == nil && len(js) > 0 {
			last["done-1"] = story(js[0])
		}
		return err == nil && len(js) == 1 && js[0].TaskID == OccurrenceID("done-1", again) &&
			story(js[0]) == "scheduled claimed enqueued started finished" &&
			js[0].History[0].Detail == "due "+again.UTC().Format(occurrenceLayout)
	})
	stop()

	off := newBroker(t, BrokerOptions{Key: key, History: -1})
	if _, err := off.Job(ctx, "retry-1"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("History off: %v, want ErrNotFound", err)
	}
}

// A dispatch whose task asynq already has (a TaskID conflict: the task a
// dispatcher enqueued before its claim lapsed) is enqueued in the story
// with the queue TaskOptions name, and Jobs finds the task there.
func TestJobsFindsConflictedTask(t *testing.T) {
	t.Parallel()
	key, queue := testKey(t), testQueue(t)
	b := newBroker(t, BrokerOptions{Key: key})
	now := redisNow(t, b.rdb).Add(-time.Second).Truncate(time.Second)
	_, err := newAsynqClient(t, testAddr).Enqueue(asynq.NewTask("t", nil),
		asynq.TaskID(OccurrenceID("c-1", now)), asynq.Queue(queue))
	must(t, err)
	d, err := NewDispatcher(b, newAsynqClient(t, testAddr), DispatcherOptions{
		TaskOptions: func(Job) []asynq.Option { return []asynq.Option{asynq.Queue(queue)} }})
	must(t, err)
	runDispatcher(t, d)
	must(t, b.Schedule(ctx, Job{ID: "c-1", RunAt: now, Type: "t"}))
	var j JobInfo
	waitFor(t, 10*time.Second, "c-1 settled as a conflict", func() bool {
		j, err = b.Job(ctx, "c-1")
		return err == nil && j.State == StateEnqueued && d.Stats().Conflicts == 1
	})
	if j.Queue != queue || j.TaskState != "pending" || j.TaskID != OccurrenceID("c-1", now) {
		t.Fatalf("c-1: queue %q, task %q in state %q; want %q, pending", j.Queue, j.TaskID, j.TaskState, queue)
	}
}

// The schedule's scripts write each step of a job's occurrence: Schedule
// its "scheduled", recovery a lease that ran out ("back on the schedule",
// then "dead" after the last attempt), each with its reason; the dead
// entry tells the story.
func TestScheduleHistory(t *testing.T) {
	t.Parallel()
	b := newBroker(t, BrokerOptions{Key: testKey(t), Lease: 20 * time.Millisecond, MaxAttempts: 2,
		Backoff: func(int) time.Duration { return 0 }})
	due := redisNow(t, b.rdb).Add(-time.Second).Truncate(time.Millisecond)
	must(t, b.Schedule(ctx, Job{ID: "h-1", RunAt: due, Type: "t"}))
	for attempt := 1; attempt <= 2; attempt++ {
		cs, err := b.Claim(ctx, 1)
		must(t, err)
		if len(cs) != 1 {
			t.Fatalf("attempt %d: %d claims", attempt, len(cs))
		}
		time.Sleep(30 * time.Millisecond) // its lease runs out
		_, err = b.Recover(ctx)
		must(t, err)
	}
	j, err := b.Job(ctx, "h-1")
	must(t, err)
	if got := whats(j.History); j.State != StateDead || got != "scheduled back on the schedule dead" {
		t.Fatalf("h-1: %v, history %q: %+v", j.State, got, j.History)
	}
	if h := j.History; h[0].Detail != "due "+due.UTC().Format(occurrenceLayout) || h[1].Detail != "lease expired" ||
		h[2].Detail != "lease expired" || h[2].At.Before(h[1].At) || h[1].At.Before(h[0].At) {
		t.Fatalf("h-1's history: %+v", h)
	}
	// Scheduled again: a new occurrence, whose story starts over (a time
	// bucket keeps a job's newest "scheduled": the dead one's goes).
	again := due.Add(time.Hour)
	must(t, b.Schedule(ctx, Job{ID: "h-1", RunAt: again, Type: "t"}))
	js, err := b.Jobs(ctx, "h-1")
	must(t, err)
	if len(js) != 2 || js[0].State != StateScheduled || whats(js[0].History) != "scheduled" ||
		whats(js[1].History) != "back on the schedule dead" {
		t.Fatalf("h-1 scheduled again: %+v", js)
	}
}
