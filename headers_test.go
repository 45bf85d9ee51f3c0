package zclaim

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
)

// A job's Headers are kept with it (a claim reads them back) and become
// its asynq task's headers; the Enqueue hook sees the task's queue and
// headers, may add to them, and a panic in it leaves the enqueue as it was.
func TestJobHeaders(t *testing.T) {
	t.Parallel()
	key, queue := testKey(t), testQueue(t)
	b := newBroker(t, BrokerOptions{Key: key})
	now := redisNow(t, b.rdb).Add(-time.Second).Truncate(time.Millisecond)
	h := map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "tenant": "é"}
	must(t, b.Schedule(ctx, Job{ID: "h-1", RunAt: now, Type: "t", Headers: h}, Job{ID: "h-2", RunAt: now, Type: "t"},
		Job{ID: "h-3", RunAt: now, Type: "t", Headers: map[string]string{"x": "1"}}))
	seen := map[string]Job{}
	d, err := NewDispatcher(b, newAsynqClient(t, testAddr), DispatcherOptions{
		TaskOptions: func(Job) []asynq.Option { return []asynq.Option{asynq.Queue(queue)} },
		Enqueue: func(_ context.Context, j *Job) func(error) {
			if j.ID == "h-3" {
				panic("hook bug")
			}
			j.Headers["hook"] = "was here"
			seen[j.ID] = *j // one enqueue worker at a time is not promised: read after Run
			return nil
		},
		Concurrency: 1,
	})
	must(t, err)
	stop := runDispatcher(t, d)
	waitFor(t, 10*time.Second, "3 enqueued", func() bool { return d.Stats().Enqueued == 3 })
	stop()
	in := newInspector(t)
	for id, want := range map[string]map[string]string{
		"h-1": {"traceparent": h["traceparent"], "tenant": "é", "hook": "was here"},
		"h-2": {"hook": "was here"},
		"h-3": {"x": "1"},
	} {
		info, err := in.GetTaskInfo(queue, OccurrenceID(id, now))
		must(t, err)
		for k, v := range want {
			if info.Headers[k] != v {
				t.Errorf("%s's task headers %v, want %s=%s", id, info.Headers, k, v)
			}
		}
		if id != "h-3" && seen[id].Queue != queue {
			t.Errorf("the hook saw %s in queue %q, want %q", id, seen[id].Queue, queue)
		}
	}

	for _, bad := range []map[string]string{{"": "x"}, {"zclaim-job": "x"}, {"a\xff": "x"}, {"a": "\xff"},
		{"big": strings.Repeat("x", MaxPayloadLen)}} {
		err := b.Schedule(ctx, Job{ID: "bad", RunAt: now, Type: "t", Headers: bad})
		if !errors.Is(err, ErrInvalidJob) {
			t.Errorf("headers %.40v: %v, want ErrInvalidJob", bad, err)
		}
	}
	if _, err := b.Job(ctx, "bad"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("a refused job was written: %v", err)
	}
}
