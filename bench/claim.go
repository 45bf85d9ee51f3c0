package main

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/zclaim/zclaim"
)

// Scenario 1: claim throughput. W workers, each on its own connection, take
// N due jobs off one sorted set until it is empty.

var (
	oneLua = redis.NewScript(`
local t = redis.call('TIME')
local m = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', tonumber(t[1]) + tonumber(t[2]) / 1e6, 'LIMIT', 0, 1)
if m[1] == nil then return false end
redis.call('ZREM', KEYS[1], m[1])
return m[1]`)
	bareLua = redis.NewScript(`
local t = redis.call('TIME')
local m = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', tonumber(t[1]) + tonumber(t[2]) / 1e6, 'LIMIT', 0, tonumber(ARGV[1]))
if #m == 0 then return m end
redis.call('ZREM', KEYS[1], unpack(m))
return m`)
	// The deadline is formatted once: Redis formats every Lua number a
	// script gives it (%.17g), and a number per member would be about 30%
	// of this script's instructions (callgrind), as Broker.Claim avoids.
	inflightLua = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
local m = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[1]))
if #m == 0 then return m end
redis.call('ZREM', KEYS[1], unpack(m))
local z, dl = {}, string.format('%.6f', now + 30)
for i, id in ipairs(m) do z[2 * i - 1] = dl; z[2 * i] = id end
redis.call('ZADD', KEYS[2], unpack(z))
return m`)
)

type claimer struct {
	name string
	// take claims some jobs on c; it returns the ids it took (for the
	// naive poller: the ids it will run; nil once the set is empty) and
	// the round trips it made.
	setup func(c *redis.Client, key string) (take func(ctx context.Context) ([]string, int, error))
	// load writes the n due jobs; nil: loadDue (ids only, as a plain ZADD).
	load func(rdb *redis.Client, key string, n int)
}

func claimers() []claimer {
	naive := func(checked bool) func(*redis.Client, string) func(context.Context) ([]string, int, error) {
		return func(c *redis.Client, key string) func(context.Context) ([]string, int, error) {
			return func(ctx context.Context) ([]string, int, error) {
				now := strconv.FormatFloat(float64(time.Now().UnixMicro())/1e6, 'f', 6, 64)
				ids, err := c.ZRangeByScore(ctx, key, &redis.ZRangeBy{Min: "-inf", Max: now, Count: 10}).Result()
				if err != nil || len(ids) == 0 {
					return nil, 1, err
				}
				got := []string{} // not nil: the set was not empty
				for _, id := range ids {
					n, err := c.ZRem(ctx, key, id).Result()
					if err != nil {
						return got, 1 + len(ids), err
					}
					if n == 1 || !checked {
						got = append(got, id)
					}
				}
				return got, 1 + len(ids), nil
			}
		}
	}
	script := func(s *redis.Script, batch int, withInflight bool) func(*redis.Client, string) func(context.Context) ([]string, int, error) {
		return func(c *redis.Client, key string) func(context.Context) ([]string, int, error) {
			s.Load(context.Background(), c)
			keys := []string{key}
			if withInflight {
				keys = append(keys, key+":inflight")
			}
			return func(ctx context.Context) ([]string, int, error) {
				v, err := s.Run(ctx, c, keys, batch).Result()
				if err == redis.Nil {
					return nil, 1, nil
				}
				if err != nil {
					return nil, 1, err
				}
				switch v := v.(type) {
				case string:
					return []string{v}, 1, nil
				case []any:
					if len(v) == 0 {
						return nil, 1, nil
					}
					ids := make([]string, len(v))
					for i, x := range v {
						ids[i] = x.(string)
					}
					return ids, 1, nil
				}
				return nil, 1, fmt.Errorf("unexpected reply %T", v)
			}
		}
	}
	broker := func(batch int) func(*redis.Client, string) func(context.Context) ([]string, int, error) {
		return func(c *redis.Client, key string) func(context.Context) ([]string, int, error) {
			b, err := zclaim.NewBroker(c, zclaim.BrokerOptions{Key: key})
			if err != nil {
				panic(err)
			}
			return func(ctx context.Context) ([]string, int, error) {
				cs, err := b.Claim(ctx, batch)
				if len(cs) == 0 {
					return nil, 1, err
				}
				ids := make([]string, len(cs))
				for i, c := range cs {
					ids[i] = c.ID
				}
				return ids, 1, err
			}
		}
	}
	return []claimer{
		{name: "naive ZRANGEBYSCORE + ZREM", setup: naive(false)},
		{name: "naive, ZREM result checked", setup: naive(true)},
		{name: "Lua, one job per call", setup: script(oneLua, 1, false)},
		{name: "Lua batch 100, bare (ZRANGEBYSCORE + ZREM)", setup: script(bareLua, 100, false)},
		{name: "Lua batch 100, + in-flight ZADD", setup: script(inflightLua, 100, true)},
		{name: "Broker.Claim batch 10", setup: broker(10)},
		{name: "Broker.Claim batch 100", setup: broker(100)},
		{name: "Broker.Claim batch 1000", setup: broker(1000)},
		{name: "Broker.Claim batch 100, typed jobs", setup: broker(100), load: loadTyped},
	}
}

// loadTyped writes n due jobs as Broker.Schedule does for a producer that
// names a task type and a 64-byte payload: a member and a record each.
func loadTyped(rdb *redis.Client, key string, n int) {
	b, err := zclaim.NewBroker(rdb, zclaim.BrokerOptions{Key: key})
	if err != nil {
		panic(err)
	}
	due := time.Now().Add(-time.Minute)
	payload := []byte(`{"order":731,"customer":"c-5519","template":"reminder-2","lang":"en"}`)[:64]
	for i := 0; i < n; i += zclaim.MaxBatchSize {
		jobs := make([]zclaim.Job, 0, zclaim.MaxBatchSize)
		for j := i; j < min(i+zclaim.MaxBatchSize, n); j++ {
			jobs = append(jobs, zclaim.Job{ID: "job-" + strconv.Itoa(j), RunAt: due, Type: "email:reminder",
				Payload: payload})
		}
		if err := b.Schedule(context.Background(), jobs...); err != nil {
			panic(err)
		}
	}
}

type claimRun struct {
	rate     float64
	dupJobs  int     // jobs taken more than once
	trips    float64 // round trips per job
	lostJobs int
}

func loadDue(rdb *redis.Client, key string, n int) {
	ctx := context.Background()
	due := float64(time.Now().Add(-time.Minute).Unix())
	for i := 0; i < n; i += 10000 {
		zs := make([]redis.Z, 0, 10000)
		for j := i; j < min(i+10000, n); j++ {
			zs = append(zs, redis.Z{Score: due, Member: "job-" + strconv.Itoa(j)})
		}
		if err := rdb.ZAdd(ctx, key, zs...).Err(); err != nil {
			panic(err)
		}
	}
}

func runClaimer(cl claimer, workers, n int) claimRun {
	admin := newClient(4)
	defer admin.Close()
	key := ns("claim")
	defer dropKeys(admin, key)
	if cl.load != nil {
		cl.load(admin, key, n)
	} else {
		loadDue(admin, key, n)
	}
	// Every worker's connection is dialled before the start, and all start
	// together: pollers that begin in lockstep collide the most.
	takes := make([]func(context.Context) ([]string, int, error), workers)
	for i := range takes {
		c := newClient(1)
		defer c.Close()
		c.Ping(context.Background())
		takes[i] = cl.setup(c, key)
	}
	go0 := make(chan struct{})
	var mu sync.Mutex
	counts := make(map[string]int, n)
	var trips atomic.Int64
	var wg sync.WaitGroup
	for _, take := range takes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-go0
			local := make([]string, 0, 1024)
			for {
				ids, rt, err := take(context.Background())
				trips.Add(int64(rt))
				if err != nil {
					progress("%s: %v", cl.name, err)
					return
				}
				if ids == nil { // the set is empty
					break
				}
				local = append(local, ids...)
			}
			mu.Lock()
			for _, id := range local {
				counts[id]++
			}
			mu.Unlock()
		}()
	}
	time.Sleep(10 * time.Millisecond)
	start := time.Now()
	close(go0)
	wg.Wait()
	el := time.Since(start)
	r := claimRun{rate: float64(n) / el.Seconds(), trips: float64(trips.Load()) / float64(n)}
	for _, k := range counts {
		if k > 1 {
			r.dupJobs++
		}
	}
	r.lostJobs = n - len(counts)
	return r
}

func claimScenario() {
	n, workers := 200000, 8
	if *quick {
		n = 5000
	}
	cls := claimers()
	res := make([][]claimRun, len(cls))
	for round := 1; round <= *rounds; round++ {
		for _, i := range slots(round, len(cls)) {
			cl := cls[i]
			r := runClaimer(cl, workers, n)
			progress("claim round %d/%d: %-45s %9s jobs/s", round, *rounds, cl.name, human(r.rate))
			res[i] = append(res[i], r)
		}
	}
	rates := make([]samples, len(cls))
	for i := range cls {
		for _, r := range res[i] {
			rates[i] = append(rates[i], r.rate)
		}
	}
	checked, bareInflight := rates[1], rates[4]
	var rows [][]string
	for i, cl := range cls {
		s := rates[i]
		last := res[i][len(res[i])-1]
		dup := fmt.Sprintf("%d (%.0f%%)", last.dupJobs, 100*float64(last.dupJobs)/float64(n))
		if last.lostJobs > 0 {
			dup += fmt.Sprintf(", %d lost", last.lostJobs)
		}
		rows = append(rows, []string{cl.name, human(s.median()), s.spread(), dup,
			fmt.Sprintf("%.2f", last.trips), fmt.Sprintf("%.1f×", paired(s, checked).median()), fmt.Sprintf("%.2f×", paired(s, bareInflight).median())})
	}
	table(fmt.Sprintf("1. Claim throughput: %d workers, %s due jobs", workers, human(float64(n))),
		[]string{"contender", "jobs/s (median)", "spread", "taken more than once", "round trips / job", "vs checked naive", "vs bare + in-flight"},
		rows,
		"Targets: `Broker.Claim` batch 100 ≥ 20× the checked naive poller and ≥ 0.5× the bare batch-100 script that moves ids into an in-flight ZSet (its deadline formatted once a call, as Broker.Claim formats its own). "+
			"Broker.Claim also issues a fencing token per job (one counter update per batch), reads payload records (HMGET, when the schedule holds any), keeps the call's claims under one lease that settles them one by one, and returns the next due time. "+
			"Every contender but the last takes jobs written as ids only (a plain ZADD); the last takes jobs written by Schedule "+
			"with a task type and a 64-byte payload, whose records move with their claims. "+
			"A ratio is the median over the rounds of the two contenders' rates in one round; the contenders of a round run one after the other, "+turns(*rounds, len(cls))+".")
}
