package zclaim

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/zclaim/zclaim/internal/proc"
)

// stuckRole makes the test binary a dispatcher whose enqueues never land
// (runStuckRole, called from TestMain): "<addr> <key> <queue> <n> <lease>".
const stuckRole = "ZCLAIM_TEST_STUCK_DISPATCHER"

// runStuckRole runs this process as a dispatcher of the Broker's defaults
// (a 30 s Lease) with DispatcherOptions.Lease as given, whose TaskOptions
// prints "claimed <id>" and then blocks: each job is claimed and in hand,
// and its enqueue never made, until the process is killed.
func runStuckRole() bool {
	cfg := os.Getenv(stuckRole)
	if cfg == "" {
		return false
	}
	var addr, key, queue, lease string
	var n int
	_, err := fmt.Sscan(cfg, &addr, &key, &queue, &n, &lease)
	roleMust(err)
	d, err := time.ParseDuration(lease)
	roleMust(err)
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	b, err := NewBroker(rdb, BrokerOptions{Key: key})
	roleMust(err)
	var mu sync.Mutex
	disp, err := NewDispatcher(b, asynq.NewClientFromRedisClient(rdb), DispatcherOptions{
		Concurrency: n, Lease: d, RecoveryInterval: -1,
		TaskOptions: func(j Job) []asynq.Option {
			mu.Lock()
			fmt.Println("claimed", j.ID)
			mu.Unlock()
			select {}
		},
	})
	roleMust(err)
	disp.Run(context.Background())
	return true
}

// A dispatcher SIGKILLed between its claims and their enqueues: the
// claims' lease is the dispatcher's (1 s here; the Broker's 30 s Lease
// does not hold them), and recovery puts them back due at once (no
// backoff), so a live dispatcher of default options has each job running
// in asynq within the dispatcher's Lease + RecoveryInterval of the kill
// (plus a second for a loaded machine), each once, whatever the Broker's
// Backoff.
func TestDispatcherKilledBeforeEnqueue(t *testing.T) {
	t.Parallel()
	const n, lease = 20, time.Second
	key, q := testKey(t), testQueue(t)
	// A backoff of a minute: the jobs of a dispatcher's lease come back
	// without it.
	b := newBroker(t, BrokerOptions{Key: key, Backoff: func(int) time.Duration { return time.Minute }})
	due := redisNow(t, b.rdb).Add(-time.Second)
	jobs := make([]Job, n)
	for i := range jobs {
		jobs[i] = Job{ID: "order-" + strconv.Itoa(i), RunAt: due, Type: "t"}
	}
	must(t, b.Schedule(ctx, jobs...))

	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s %s %s %d %s", stuckRole, testAddr, key, q, n, lease))
	proc.DieWithParent(cmd)
	out, err := cmd.StdoutPipe()
	must(t, err)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	must(t, cmd.Start())
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	claimed := make(chan struct{}, n)
	go func() {
		for sc := bufio.NewScanner(out); sc.Scan(); {
			if strings.HasPrefix(sc.Text(), "claimed ") {
				claimed <- struct{}{}
			}
		}
	}()
	stop := time.After(30 * time.Second)
	for range n {
		select {
		case <-claimed:
		case <-stop:
			t.Fatalf("the child did not claim %d jobs in 30s: %s", n, stderr.String())
		}
	}
	must(t, cmd.Process.Kill())
	killed := time.Now()
	cmd.Wait()

	var mu sync.Mutex
	started := map[string][]time.Duration{}
	h := WithJob(asynq.HandlerFunc(func(ctx context.Context, _ *asynq.Task) error {
		j, _ := JobFromContext(ctx)
		mu.Lock()
		started[j.ID] = append(started[j.ID], time.Since(killed))
		mu.Unlock()
		return nil
	}))
	startAsynq(t, testAddr, q, h, asynq.Config{Concurrency: n, TaskCheckInterval: 10 * time.Millisecond})
	d, err := NewDispatcher(b, newAsynqClient(t, testAddr), DispatcherOptions{
		TaskOptions: func(Job) []asynq.Option { return []asynq.Option{asynq.Queue(q)} }})
	must(t, err)
	runDispatcher(t, d)
	bound := lease + DefaultRecoveryInterval
	waitFor(t, 30*time.Second, "every job to run", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(started) == n
	})
	time.Sleep(200 * time.Millisecond) // a second run, if any, would show now
	mu.Lock()
	defer mu.Unlock()
	var last time.Duration
	for id, at := range started {
		if len(at) != 1 {
			t.Fatalf("%s ran %d times, want once", id, len(at))
		}
		last = max(last, at[0])
	}
	t.Logf("every job running %v after the kill (dispatcher Lease %v, bound %v)", last.Round(time.Millisecond), lease, bound)
	if last > bound+time.Second {
		t.Fatalf("the last job ran %v after the kill; want within the dispatcher's Lease + RecoveryInterval (%v), "+
			"and a second for a loaded machine", last, bound)
	}
}
