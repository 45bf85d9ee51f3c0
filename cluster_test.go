package zclaim

import (
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// On a real Redis Cluster (one node holding every slot), every script runs:
// Redis itself refuses a script that touches keys of another slot than its
// first key's, so this shows the derived keys share the schedule's slot,
// for a hash-tagged key and for an adopted key without a tag.
func TestRedisCluster(t *testing.T) {
	t.Parallel()
	_, cc := oneNodeCluster(t)

	for _, key := range []string{"delay:jobs", "zclaim:{orders}"} {
		t.Run(key, func(t *testing.T) {
			b, err := NewBroker(cc, BrokerOptions{Key: key, Lease: 30 * time.Millisecond, MaxAttempts: 2,
				Backoff: func(int) time.Duration { return 0 }})
			must(t, err)
			past := time.Now().Add(-time.Second)
			must(t, b.Schedule(ctx, Job{ID: "a", RunAt: past, Type: "t", Payload: []byte("p")},
				Job{ID: "b", RunAt: past}, Job{ID: "c", RunAt: past}, Job{ID: "d", RunAt: time.Now().Add(time.Hour)}))
			cs, err := b.Claim(ctx, 10)
			must(t, err)
			if len(cs) != 3 {
				t.Fatalf("claimed %d", len(cs))
			}
			_, err = b.Extend(ctx, cs[0], time.Minute)
			must(t, err)
			must(t, b.Retry(ctx, cs[1], past))
			must(t, b.Kill(ctx, cs[2], "test"))
			lost, err := b.AckMany(ctx, cs[0])
			must(t, err)
			if len(lost) != 0 {
				t.Fatalf("lost %v", lost)
			}
			again, err := b.Claim(ctx, 10)
			must(t, err)
			if len(again) != 1 {
				t.Fatalf("re-claimed %d", len(again))
			}
			time.Sleep(40 * time.Millisecond)
			r, err := b.Recover(ctx)
			must(t, err)
			if r.Dead != 1 {
				t.Fatalf("recovered %+v", r)
			}
			ok, err := b.Cancel(ctx, "d")
			if err != nil || !ok {
				t.Fatalf("cancel: %v %v", ok, err)
			}
			st, err := b.Stats(ctx)
			must(t, err)
			if st.Dead != 2 || st.Scheduled != 0 || st.Inflight != 0 {
				t.Fatalf("stats %+v", st)
			}
			dead, err := listDead(b, 10)
			must(t, err)
			if len(dead) != 2 {
				t.Fatalf("dead %+v", dead)
			}

			// The dispatcher's batch claims: claim, settle, recover.
			must(t, b.Schedule(ctx, Job{ID: "e", RunAt: past, Type: "t", Payload: []byte("p")}, Job{ID: "f", RunAt: past}))
			res, err := b.claim(ctx, b.shards[0], 10, leaseBatch)
			must(t, err)
			if len(res.claims) != 2 {
				t.Fatalf("batch claimed %d", len(res.claims))
			}
			lostBatches, err := b.finishBatches(ctx, batchEnd{lease: res.lease, retry: map[int]time.Duration{1: 0}})
			if err != nil || len(lostBatches) != 0 {
				t.Fatalf("finish: %v %v", lostBatches, err)
			}
			res, err = b.claim(ctx, b.shards[0], 10, leaseBatch)
			must(t, err)
			time.Sleep(40 * time.Millisecond)
			r, err = b.Recover(ctx)
			must(t, err)
			if len(res.claims) != 1 || r.Dead != 1 {
				t.Fatalf("batch re-claimed %d, recovered %+v", len(res.claims), r)
			}

			// The run records and their buckets of finished records: with
			// the prefix's hash tag, or (delay:jobs:run:) in each key's slot.
			i, err := NewIdempotency(cc, IdempotencyOptions{Prefix: key + ":run:"})
			must(t, err)
			for _, k := range []string{"a", "b{x}c", "order-731@2026-12-01T08:00:00.000Z", "{", "}{"} {
				e, err := i.Begin(ctx, k)
				must(t, err)
				must(t, e.Extend(ctx))
				must(t, e.Complete(ctx))
				_, err = i.Begin(ctx, k)
				wantErr(t, err, ErrAlreadyDone)
				e, err = i.Begin(ctx, k+"-released")
				must(t, err)
				must(t, e.Release(ctx))
			}
		})
	}
}

// oneNodeCluster starts a Redis Cluster of one node that holds every slot,
// and returns the node and a cluster client of it, closed when the test
// ends. A script that touches keys of two slots is refused there as on
// any cluster.
func oneNodeCluster(t *testing.T) (*redisServer, *redis.ClusterClient) {
	t.Helper()
	srv := ownRedis(t, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf")
	admin := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer admin.Close()
	must(t, admin.Do(ctx, "CLUSTER", "ADDSLOTSRANGE", 0, 16383).Err())
	waitFor(t, 10*time.Second, "the cluster to be ok", func() bool {
		info, _ := admin.ClusterInfo(ctx).Result()
		return strings.Contains(info, "cluster_state:ok")
	})
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{srv.Addr}})
	t.Cleanup(func() { cc.Close() })
	return srv, cc
}
