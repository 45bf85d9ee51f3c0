package zclaim

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/zclaim/zclaim/internal/redisproc"
)

// Shards get tags of their own that spread evenly over the slot space;
// a job's shard is FNV-1a of its id modulo the count.
func TestShardKeys(t *testing.T) {
	t.Parallel()
	ks, err := shardKeys("zclaim:{orders}", 16, true)
	must(t, err)
	for i, k := range ks {
		if !strings.HasPrefix(k.schedule, "zclaim:{orders/"+strconv.Itoa(i)+".") || k.shard != i {
			t.Fatalf("shard %d: %q", i, k.schedule)
		}
		if s := slot(k.schedule); s < i*1024+256 || s >= i*1024+768 || slot(k.inflight) != s {
			t.Fatalf("shard %d: slot %d", i, s)
		}
	}
	ks, err = shardKeys("delay:jobs", 3, true)
	must(t, err)
	if !strings.HasPrefix(ks[2].schedule, "{delay:jobs/2.") {
		t.Fatalf("untagged key: %q", ks[2].schedule)
	}
	// Documented and stable: FNV-1a 32 of "order-731" is 0x8d44b7cb.
	if got := shardOf("order-731", 16); got != 0x8d44b7cb%16 {
		t.Fatalf("shardOf(order-731, 16) = %d", got)
	}
}

// A sharded schedule on one server behaves as one: every call finds the
// job's shard, Stats and Recover cover them all, listings page through
// them; the count is recorded and another count is refused.
// TestClusterShards runs the same on a 3-master cluster.
func TestShardedSchedule(t *testing.T) {
	t.Parallel()
	shardedSchedule(t, newClient(t), testKey(t), plainKey(t))
}

func shardedSchedule(t *testing.T, rdb redis.UniversalClient, key, plain string) {
	b, err := NewBroker(rdb, BrokerOptions{Key: key, Shards: 4, Lease: 30 * time.Millisecond, Backoff: func(int) time.Duration { return 0 }})
	must(t, err)
	past := time.Now().Add(-time.Second)
	var jobs []Job
	for i := range 200 {
		jobs = append(jobs, Job{ID: "j" + strconv.Itoa(i), RunAt: past, Type: "t"})
	}
	jobs = append(jobs, Job{ID: "later", RunAt: time.Now().Add(time.Hour), Type: "t"})
	must(t, b.Schedule(ctx, jobs...))
	per := map[int]int64{}
	for _, k := range b.shards {
		per[k.shard], _ = b.rdb.ZCard(ctx, k.schedule).Result()
	}
	if per[0]+per[1]+per[2]+per[3] != 201 || per[0] < 20 || per[3] < 20 {
		t.Fatalf("jobs per shard: %v", per)
	}
	st, err := b.Stats(ctx)
	must(t, err)
	if st.Scheduled != 201 || st.Due != 200 || st.OldestDue < 900*time.Millisecond {
		t.Fatalf("stats: %+v", st)
	}
	j, err := b.Job(ctx, "j7")
	must(t, err)
	if j.State != StateScheduled {
		t.Fatalf("j7: %+v", j)
	}
	var listed []string
	for after := ""; ; {
		l, err := b.List(ctx, StateScheduled, ListOptions{After: after, Limit: 30})
		must(t, err)
		for _, j := range l.Jobs {
			listed = append(listed, j.ID)
		}
		if after = l.Next; after == "" {
			break
		}
	}
	seen := map[string]int{}
	for _, id := range listed {
		seen[id]++
	}
	eachOnce(t, seen, 201, "listed")

	// Claims across shards: each job once; some expire and come back.
	claimed := map[string]int{}
	var held []Claim
	for len(claimed) < 200 {
		cs, err := b.Claim(ctx, 64)
		must(t, err)
		if len(cs) == 0 {
			t.Fatalf("claims stopped at %d", len(claimed))
		}
		for _, c := range cs {
			claimed[c.ID]++
			held = append(held, c)
		}
	}
	eachOnce(t, claimed, 200, "claimed")
	lost, err := b.AckMany(ctx, held[:150]...)
	must(t, err)
	if len(lost) != 0 {
		t.Fatalf("lost %d acks", len(lost))
	}
	must(t, b.Kill(ctx, held[150], "test"))
	time.Sleep(40 * time.Millisecond)
	r, err := b.Recover(ctx)
	must(t, err)
	if r.Requeued != 49 {
		t.Fatalf("recovered %+v, want 49 requeued", r)
	}
	if n, err := b.Revive(ctx, held[150].ID); err != nil || n != 1 {
		t.Fatalf("revive: %d %v", n, err)
	}
	if n, err := b.CancelMany(ctx, "later", "j1"); err != nil || n != 1 {
		t.Fatalf("cancel: %d %v", n, err)
	}

	// The count is recorded: another one is refused, and so is a sharded
	// schedule on a set that exists.
	_, err = NewBroker(b.rdb, BrokerOptions{Key: key, Shards: 8})
	wantErr(t, err, ErrShards)
	_, err = NewBroker(b.rdb, BrokerOptions{Key: key, Shards: 1})
	wantErr(t, err, ErrShards)
	// Left zero, Shards is the recorded count.
	again, err := NewBroker(b.rdb, BrokerOptions{Key: key})
	must(t, err)
	if j, err := again.Job(ctx, held[199].ID); len(again.shards) != 4 || err != nil || j.State != StateScheduled || j.Attempt != 2 {
		t.Fatalf("opened with %d shards: %+v %v", len(again.shards), j, err)
	}
	must(t, b.rdb.ZAdd(ctx, plain, redis.Z{Score: 1, Member: "x"}).Err())
	_, err = NewBroker(b.rdb, BrokerOptions{Key: plain, Shards: 2})
	wantErr(t, err, ErrShards)
}

// ownCluster starts a local Redis Cluster for one test.
func ownCluster(t *testing.T, masters, replicas int) *redisproc.Cluster {
	t.Helper()
	c, err := redisproc.StartCluster(masters, replicas)
	if err != nil {
		t.Fatalf("start a Redis Cluster: %v", err)
	}
	t.Cleanup(c.Close)
	return c
}

// clusterRuns runs an asynq server on the cluster whose handler (under
// the middleware) logs each run and its start by Redis TIME.
type clusterRuns struct {
	mu    sync.Mutex
	runs  map[string]int
	early int
}

func (r *clusterRuns) serve(t *testing.T, cc *redis.ClusterClient, queue string, wait int) *Idempotency {
	// A short lease: a run whose record's master fails mid-run is taken
	// over seconds later, not after the default 30 s.
	idem, err := NewIdempotency(cc, IdempotencyOptions{Prefix: "zt:run:{" + queue + "}:", Lease: 2 * time.Second, WaitReplicas: wait})
	must(t, err)
	t.Cleanup(func() { idem.Close() })
	h := idem.Middleware()(asynq.HandlerFunc(func(ctx context.Context, task *asynq.Task) error {
		j, _ := JobFromContext(ctx)
		now, err := cc.Time(ctx).Result()
		if err != nil {
			return err
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		r.runs[j.ID]++
		if now.Before(j.Due) {
			r.early++
		}
		return nil
	}))
	// On the store's AsynqClient: on a cluster a Complete goes in one
	// pipeline with asynq's done (its keys and asynq's are in different slots).
	srv := asynq.NewServerFromRedisClient(idem.AsynqClient(), asynq.Config{Queues: map[string]int{queue: 1}, Concurrency: 20,
		TaskCheckInterval: 10 * time.Millisecond, IsFailure: IsFailure,
		// A run that failed while its record's master failed over comes
		// back in a moment, not after asynq's default 15 s or more.
		RetryDelayFunc: func(n int, err error, t *asynq.Task) time.Duration {
			if errors.Is(err, ErrInProgress) {
				return RetryDelay(n, err, t)
			}
			return 300 * time.Millisecond
		},
		Logger: quietLogger{}, LogLevel: asynq.FatalLevel})
	must(t, srv.Start(h))
	t.Cleanup(srv.Shutdown)
	return idem
}

func (r *clusterRuns) count() (n int, twice int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, k := range r.runs {
		if k > 1 {
			twice++
		}
	}
	return len(r.runs), twice
}

// On a 3-master cluster: 16 shards spread 30,000 jobs over the masters
// within ±20% of equal shares; dispatch into asynq on the same cluster runs
// every job once, none early, while a slot of a busy shard moves to another
// master key by key (clients meet ASK and TRYAGAIN meanwhile).
func TestClusterShards(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("starts a Redis Cluster")
	}
	cl := ownCluster(t, 3, 0)
	cc := cl.Client()
	t.Cleanup(func() { cc.Close() }) // after the asynq servers' shutdowns
	b, err := NewBroker(cc, BrokerOptions{Key: "zt:{spread}", Shards: 16})
	must(t, err)
	var jobs []Job
	for i := range 30000 {
		jobs = append(jobs, Job{ID: "order-" + strconv.Itoa(i), RunAt: time.Now().Add(time.Hour), Type: "t"})
	}
	must(t, b.Schedule(ctx, jobs...))
	perMaster := map[string]int64{}
	for _, k := range b.shards {
		m, err := cl.MasterOf(slot(k.schedule))
		must(t, err)
		n, _ := cc.ZCard(ctx, k.schedule).Result()
		perMaster[m.Addr] += n
	}
	if len(perMaster) != 3 {
		t.Fatalf("jobs on %d masters: %v", len(perMaster), perMaster)
	}
	for m, n := range perMaster {
		if n < 8000 || n > 12000 {
			t.Fatalf("master %s holds %d of 30,000 jobs, beyond ±20%% of 10,000: %v", m, n, perMaster)
		}
	}
	t.Logf("jobs per master: %v", perMaster)
	// Doctor checks each master that holds a shard.
	checks, err := b.Doctor(ctx, DoctorOptions{DefaultType: "t"})
	must(t, err)
	evictions := 0
	for _, c := range checks {
		if c.Check == "eviction" {
			evictions++
			if _, ok := perMaster[strings.TrimSuffix(strings.Fields(c.Result)[0], ":")]; !ok {
				t.Fatalf("eviction check of %q", c.Result)
			}
		}
	}
	if evictions != 3 {
		t.Fatalf("doctor checked %d masters, want 3: %+v", evictions, checks)
	}

	// The sharded broker's calls, as on one server (TestShardedSchedule).
	t.Run("calls", func(t *testing.T) { shardedSchedule(t, cc, "zt:{calls}", "zt:plain") })

	// Dispatch, with a slot move in the middle, into two asynq queues on
	// two masters.
	qs := []string{"zt-cluster"}
	first, err := cl.MasterOf(slot("asynq:{" + qs[0] + "}:pending"))
	must(t, err)
	for i := 0; len(qs) < 2; i++ {
		q := "zt-cluster-" + strconv.Itoa(i)
		if m, err := cl.MasterOf(slot("asynq:{" + q + "}:pending")); err == nil && m != first {
			qs = append(qs, q)
		}
	}
	runs := &clusterRuns{runs: map[string]int{}}
	idems := make([]*Idempotency, len(qs))
	for k, q := range qs {
		idems[k] = runs.serve(t, cc, q, 0)
	}
	d, err := NewBroker(cc, BrokerOptions{Key: "zt:{dispatch}", Shards: 16, Lease: 2 * time.Second})
	must(t, err)
	now, err := cc.Time(ctx).Result()
	must(t, err)
	const n = 3000
	jobs = jobs[:0]
	for i := range n {
		// The first 256 due at one instant: claims of both queues in one
		// enqueue worker's hands.
		due := now.Add(300*time.Millisecond + time.Duration(max(0, i-256))*time.Millisecond/2)
		jobs = append(jobs, Job{ID: "job-" + strconv.Itoa(i), RunAt: due, Type: "t", Queue: qs[i%2]})
	}
	must(t, d.Schedule(ctx, jobs...))
	// Two dispatchers, each enqueuing through an asynq Client of its own.
	other := cl.Client()
	t.Cleanup(func() { other.Close() })
	for _, rdb := range []*redis.ClusterClient{cc, other} {
		opts := DispatcherOptions{RecoveryInterval: 50 * time.Millisecond}
		dsp, err := NewDispatcher(d, asynq.NewClientFromRedisClient(rdb), opts)
		must(t, err)
		runDispatcher(t, dsp)
	}
	busy := d.shards[shardOf("job-2999", 16)]
	time.Sleep(500 * time.Millisecond)
	from, err := cl.MasterOf(slot(busy.schedule))
	must(t, err)
	var to *redisproc.Server
	for _, m := range cl.Masters() {
		if m != from {
			to = m
		}
	}
	start := time.Now()
	must(t, cl.MoveSlot(slot(busy.schedule), to, 1, 20*time.Millisecond))
	t.Logf("moved the slot of %s from %s to %s in %v", busy.schedule, from.Addr, to.Addr, time.Since(start))
	waitProgress(t, 30*time.Second, "jobs run", n, func() int { k, _ := runs.count(); return k }, nil)
	time.Sleep(200 * time.Millisecond)
	got, twice := runs.count()
	if got != n || twice != 0 || runs.early != 0 {
		t.Fatalf("ran %d of %d jobs, %d twice, %d early", got, n, twice, runs.early)
	}
	if m, _ := cl.MasterOf(slot(busy.schedule)); m != to {
		t.Fatal("the slot did not move")
	}
	for k, q := range qs {
		if _, ok := idems[k].viaDone.Load(q); !ok {
			t.Fatalf("no done of queue %s came through its store's AsynqClient", q)
		}
	}
}

// On 3 masters with a replica each and WaitReplicas 1: a master fails over
// to its replica (CLUSTER FAILOVER), then another is SIGKILLed, its replica
// takes over, and it comes back as a replica; every job still runs, none
// early.
func TestClusterFailover(t *testing.T) {
	// Not parallel: under the load of the parallel tests, a call that the
	// failovers cut can leave a task in asynq's hands until its own
	// recovery (minutes); alone, the test takes 8–14 s.
	if testing.Short() {
		t.Skip("starts a Redis Cluster")
	}
	cl := ownCluster(t, 3, 1)
	cc := cl.Client()
	t.Cleanup(func() { cc.Close() }) // after the asynq servers' shutdowns
	q := "zt-failover"
	runs := &clusterRuns{runs: map[string]int{}}
	idem := runs.serve(t, cc, q, 1)
	b, err := NewBroker(cc, BrokerOptions{Key: "zt:{failover}", Shards: 16, Lease: time.Second, WaitReplicas: 1, WaitTimeout: 500 * time.Millisecond})
	must(t, err)
	now, err := cc.Time(ctx).Result()
	must(t, err)
	const n = 2000
	var jobs []Job
	for i := range n {
		jobs = append(jobs, Job{ID: "job-" + strconv.Itoa(i), RunAt: now.Add(300*time.Millisecond + time.Duration(i)*2*time.Millisecond), Type: "t", Queue: q})
	}
	must(t, b.Schedule(ctx, jobs...))
	dsp, err := NewDispatcher(b, asynq.NewClientFromRedisClient(cc), DispatcherOptions{RecoveryInterval: 100 * time.Millisecond})
	must(t, err)
	runDispatcher(t, dsp)

	// asynq's own writes wait for no replica: keep its queue's master alive.
	asynqMaster, err := cl.MasterOf(slot("asynq:{" + q + "}:pending"))
	must(t, err)
	var victims []*redisproc.Server
	for _, m := range cl.Masters() {
		if m != asynqMaster {
			victims = append(victims, m)
		}
	}
	time.Sleep(800 * time.Millisecond)
	r, err := cl.ReplicaOf(victims[0])
	must(t, err)
	rc := redis.NewClient(&redis.Options{Addr: r.Addr})
	must(t, rc.Do(ctx, "CLUSTER", "FAILOVER").Err())
	rc.Close()
	must(t, cl.WaitOK(10*time.Second))
	t.Logf("%s failed over to %s", victims[0].Addr, r.Addr)
	time.Sleep(500 * time.Millisecond)
	victims[1].Kill()
	t.Logf("%s SIGKILLed", victims[1].Addr)
	// Its replica takes over; with no replica of its own, the new master
	// refuses the writes that wait for one (ErrNotReplicated), until the
	// old master comes back as its replica.
	must(t, cl.WaitOK(15*time.Second))
	must(t, victims[1].Restart())
	must(t, cl.WaitOK(15*time.Second))
	t.Logf("%s back, as a replica", victims[1].Addr)
	start := time.Now()
	for deadline := start.Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if k, _ := runs.count(); k == n {
			break
		}
		if time.Now().After(deadline) {
			k, _ := runs.count()
			st, err := b.Stats(ctx)
			qi, qerr := asynq.NewInspectorFromRedisClient(cc).GetQueueInfo(q)
			active, _, rerr := idem.Runs(ctx, "", 20)
			t.Fatalf("ran %d of %d jobs in 30 s; stats %+v (%v); dispatcher %+v; asynq queue %+v (%v); active runs %+v (%v); takeovers %d",
				k, n, st, err, dsp.Stats(), qi, qerr, active, rerr, idem.Stats().Takeovers)
		}
	}
	got, twice := runs.count()
	t.Logf("ran %d of %d jobs, %d twice, %d early; dispatcher %+v", got, n, twice, runs.early, dsp.Stats())
	if runs.early != 0 {
		t.Fatalf("%d early starts", runs.early)
	}
}

// Schedule on shards: chunks of MaxBatchSize per shard, a round of them per
// pipeline; a job given twice in one call is written once, as its last.
func TestShardedScheduleChunks(t *testing.T) {
	t.Parallel()
	b := newBroker(t, BrokerOptions{Shards: 3})
	var jobs []Job
	for i := range 5000 {
		jobs = append(jobs, Job{ID: "j" + strconv.Itoa(i%4000), RunAt: time.Now().Add(time.Duration(i) * time.Second), Type: "t"})
	}
	must(t, b.Schedule(ctx, jobs...))
	st, err := b.Stats(ctx)
	must(t, err)
	if st.Scheduled != 4000 {
		t.Fatalf("%d scheduled, want 4000", st.Scheduled)
	}
	j, err := b.Job(ctx, "j17")
	must(t, err)
	if !j.RunAt.After(time.Now().Add(4000 * time.Second)) {
		t.Fatalf("j17 is due %v: not its last entry in the call", j.RunAt)
	}
}
