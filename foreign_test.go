package zclaim

import (
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
)

// foreignBatch adds five valid members and an empty one at position pos of
// their order (as a foreign producer's ZADD can), all due.
func foreignBatch(t *testing.T, b *Broker, pos int) []string {
	t.Helper()
	var ids []string
	zs := []redis.Z{{Score: float64(pos) - 0.5, Member: ""}}
	for i := range 5 {
		id := "valid-" + strconv.Itoa(i)
		ids = append(ids, id)
		zs = append(zs, redis.Z{Score: float64(i), Member: id})
	}
	must(t, b.rdb.ZAdd(ctx, b.Key(), zs...).Err())
	return ids
}

// wantForeignDead checks that the empty member is the one job in the dead
// set, with a reason that names it.
func wantForeignDead(t *testing.T, b *Broker) {
	t.Helper()
	dead, err := listDead(b, 10)
	must(t, err)
	if len(dead) != 1 || dead[0].ID != "" || !strings.Contains(dead[0].Reason, "empty job id") {
		t.Fatalf("dead set %+v, want the empty member alone, its reason naming it", dead)
	}
}

// An empty member at every position of a batch: with enqueues failing, the
// five valid jobs go back with backoff; with enqueues succeeding, they
// become tasks; after a dispatcher died holding the batch, recovery puts
// them back. In every case the empty member goes to the dead set alone.
func TestEmptyMemberLosesNothing(t *testing.T) {
	t.Parallel()
	for pos := range 6 {
		t.Run("position "+strconv.Itoa(pos), func(t *testing.T) {
			t.Parallel()
			t.Run("enqueues fail", func(t *testing.T) {
				t.Parallel()
				b := newBroker(t, BrokerOptions{Lease: time.Second, Backoff: func(int) time.Duration { return time.Hour }})
				ids := foreignBatch(t, b, pos)
				px := newProxy(t, testAddr)
				px.SetDown(true)
				ac := asynq.NewClientFromRedisClient(redis.NewClient(&redis.Options{Addr: px.Addr, MaxRetries: -1,
					DialTimeout: 20 * time.Millisecond}))
				// EnqueueTimeout also bounds the settle that gives the jobs back,
				// which a loaded run can keep past 100 ms; the enqueues fail at
				// once (the proxy closes each connection it accepts).
				d, err := NewDispatcher(b, ac, DispatcherOptions{DefaultType: "x", RecoveryInterval: -1,
					EnqueueTimeout: time.Second})
				must(t, err)
				stop := runDispatcher(t, d)
				waitFor(t, 10*time.Second, "five failed enqueues and one death", func() bool {
					s := d.Stats()
					return s.Failed >= 5 && s.Dead == 1
				})
				stop()
				for _, id := range ids {
					j, err := b.Job(ctx, id)
					if err != nil || j.State != StateScheduled || j.Attempt != 2 {
						t.Fatalf("%s: %+v %v; want scheduled again for attempt 2", id, j, err)
					}
				}
				wantForeignDead(t, b)
			})
			t.Run("enqueues succeed", func(t *testing.T) {
				t.Parallel()
				b := newBroker(t, BrokerOptions{Lease: time.Second})
				ids := foreignBatch(t, b, pos)
				q := testQueue(t)
				d, err := NewDispatcher(b, newAsynqClient(t, testAddr), DispatcherOptions{DefaultType: "x", RecoveryInterval: -1,
					TaskOptions: func(Job) []asynq.Option { return []asynq.Option{asynq.Queue(q)} }})
				must(t, err)
				stop := runDispatcher(t, d)
				waitFor(t, 10*time.Second, "five enqueues and one death", func() bool {
					s := d.Stats()
					return s.Enqueued == 5 && s.Dead == 1
				})
				stop()
				in := newInspector(t)
				for _, id := range ids {
					tasks, err := in.ListPendingTasks(q)
					must(t, err)
					found := false
					for _, ti := range tasks {
						found = found || strings.HasPrefix(ti.ID, id+"@")
					}
					if !found {
						t.Fatalf("%s is not an asynq task", id)
					}
				}
				wantForeignDead(t, b)
			})
			t.Run("dispatcher died", func(t *testing.T) {
				t.Parallel()
				b := newBroker(t, BrokerOptions{Lease: 20 * time.Millisecond, Backoff: func(int) time.Duration { return time.Hour }})
				ids := foreignBatch(t, b, pos)
				res, err := b.claim(ctx, b.shards[0], 10, leaseBatch) // and then it died
				must(t, err)
				if len(res.claims) != 6 {
					t.Fatalf("claimed %d, want 6", len(res.claims))
				}
				time.Sleep(30 * time.Millisecond)
				r, err := b.Recover(ctx)
				must(t, err)
				if r.Requeued != 5 || r.Dead != 1 {
					t.Fatalf("recovered %+v, want 5 back and the empty member dead", r)
				}
				for _, id := range ids {
					if j, err := b.Job(ctx, id); err != nil || j.State != StateScheduled {
						t.Fatalf("%s: %+v %v", id, j, err)
					}
				}
				wantForeignDead(t, b)
			})
		})
	}
}

// Schedule refuses what could never become an asynq task, and writes
// nothing.
func TestScheduleRefusesUnfit(t *testing.T) {
	t.Parallel()
	b := newBroker(t, BrokerOptions{})
	for _, j := range []Job{
		{ID: "caf\xe9", RunAt: time.Now()},
		{ID: " \t", RunAt: time.Now()},
		{ID: "ok", Type: "t\xff", RunAt: time.Now()},
		{ID: "ok", Type: " ", RunAt: time.Now()},
		{ID: "ok", Queue: "q\xff", RunAt: time.Now()},
		{ID: "ok", Queue: " ", RunAt: time.Now()},
	} {
		err := b.Schedule(ctx, Job{ID: "fine", RunAt: time.Now()}, j)
		wantErr(t, err, ErrInvalidJob)
		wantErr(t, err, ErrUnfitForAsynq)
	}
	if n, _ := b.rdb.ZCard(ctx, b.Key()).Result(); n != 0 {
		t.Fatalf("%d jobs written", n)
	}
}

// A password changed under a running Broker and store: every call says
// WRONGPASS (the pipelined reads too), never an empty reply.
func TestWrongPassword(t *testing.T) {
	t.Parallel()
	s := ownRedis(t)
	rdb := redis.NewClient(&redis.Options{Addr: s.Addr, Password: "old", PoolSize: 1, MaxRetries: -1})
	t.Cleanup(func() { rdb.Close() })
	admin := redis.NewClient(&redis.Options{Addr: s.Addr})
	t.Cleanup(func() { admin.Close() })
	must(t, admin.ConfigSet(ctx, "requirepass", "old").Err())
	b, err := NewBroker(rdb, BrokerOptions{Key: "zt:{wrongpass}", AllowEviction: true})
	must(t, err)
	idem, err := NewIdempotency(rdb, IdempotencyOptions{AllowEviction: true, DisableTakeover: true})
	must(t, err)
	must(t, b.Schedule(ctx, Job{ID: "a", RunAt: time.Now()}))
	must(t, admin.Do(ctx, "CONFIG", "SET", "requirepass", "new").Err())
	must(t, admin.Do(ctx, "CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes").Err()) // the pool dials again
	checks := map[string]error{}
	_, checks["Stats"] = b.Stats(ctx)
	_, checks["Claim"] = b.Claim(ctx, 1)
	checks["Schedule"] = b.Schedule(ctx, Job{ID: "b", RunAt: time.Now()})
	_, checks["Job"] = b.Job(ctx, "a")
	_, checks["List"] = b.List(ctx, StateScheduled, ListOptions{})
	_, checks["Recover"] = b.Recover(ctx)
	_, checks["Begin"] = idem.Begin(ctx, "k")
	for call, err := range checks {
		if err == nil || !strings.Contains(err.Error(), "WRONGPASS") {
			t.Errorf("%s after the password changed: %v, want WRONGPASS", call, err)
		}
	}
}

// A member that another producer wrote with an id of the prefix zclaim
// keeps for periodic ticks ("periodic:..."), with no definition behind it,
// is that producer's job: it runs once, as any foreign member does, and is
// not dropped as the tick of a deleted definition. A definition's own tick
// beside it still runs as a tick.
func TestForeignMemberOfReservedPrefix(t *testing.T) {
	t.Parallel()
	key, q, log := handledSetup(t)
	// A lease a loaded machine's enqueue does not outlast: a claim whose
	// lease ran out goes back to the schedule for a while.
	b := newBroker(t, BrokerOptions{Key: key, Lease: 2 * time.Second})
	must(t, b.SetPeriodic(ctx, Periodic{Name: "report", Spec: "@every 1s", Type: "work", Queue: q}))
	due := time.Now().Add(-time.Second)
	must(t, b.rdb.ZAdd(ctx, key, redis.Z{Score: float64(due.Unix()), Member: "periodic:legacy-report"}).Err())
	d, err := NewDispatcher(b, newAsynqClient(t, testAddr), DispatcherOptions{DefaultType: "work",
		TaskOptions: func(Job) []asynq.Option { return []asynq.Option{asynq.Queue(q)} }})
	must(t, err)
	runDispatcher(t, d)
	waitFor(t, 20*time.Second, "the foreign member and the definition's first tick to run, the member to leave the schedule",
		func() bool {
			log.mu.Lock()
			ran := log.runs["periodic:legacy-report"] == 1 && log.runs["periodic:report"] >= 1
			log.mu.Unlock()
			return ran && errors.Is(b.rdb.ZScore(ctx, key, "periodic:legacy-report").Err(), redis.Nil)
		})
	st, err := b.Stats(ctx)
	must(t, err)
	if st.Dead != 0 {
		t.Fatalf("stats %+v: want nothing dead", st)
	}
	time.Sleep(200 * time.Millisecond)
	log.mu.Lock()
	defer log.mu.Unlock()
	if n := log.runs["periodic:legacy-report"]; n != 1 {
		t.Fatalf("the foreign member ran %d times", n)
	}
}
