package zclaim

import (
	"context"
	"fmt"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
)

// Hot paths for `go test -bench . -run '^$'` and benchstat. Each iteration
// is one job; the schedule is refilled outside the timer.

func BenchmarkClaim100(b *testing.B) {
	br := newBroker(b, BrokerOptions{Lease: time.Minute})
	past := time.Now().Add(-time.Second)
	refill := func() {
		jobs := make([]Job, 10000)
		for i := range jobs {
			jobs[i] = Job{ID: "j" + strconv.Itoa(i), RunAt: past}
		}
		must(b, br.Schedule(ctx, jobs...))
		br.rdb.Del(ctx, br.keys.inflight)
	}
	refill()
	b.ResetTimer()
	for done := 0; done < b.N; {
		cs, err := br.Claim(ctx, 100)
		if err != nil {
			b.Fatal(err)
		}
		done += len(cs)
		if len(cs) == 0 {
			b.StopTimer()
			refill()
			b.StartTimer()
		}
	}
}

func BenchmarkAckMany100(b *testing.B) {
	br := newBroker(b, BrokerOptions{Lease: time.Minute})
	past := time.Now().Add(-time.Second)
	var claims []Claim
	refill := func() {
		jobs := make([]Job, 10000)
		for i := range jobs {
			jobs[i] = Job{ID: "j" + strconv.Itoa(i), RunAt: past}
		}
		must(b, br.Schedule(ctx, jobs...))
		claims = claims[:0]
		for {
			cs, err := br.Claim(ctx, 1000)
			must(b, err)
			if len(cs) == 0 {
				break
			}
			claims = append(claims, cs...)
		}
	}
	refill()
	b.ResetTimer()
	for done := 0; done < b.N; done += 100 {
		if len(claims) < 100 {
			b.StopTimer()
			refill()
			b.StartTimer()
		}
		if _, err := br.AckMany(ctx, claims[:100]...); err != nil {
			b.Fatal(err)
		}
		claims = claims[100:]
	}
}

func BenchmarkBeginComplete(b *testing.B) {
	i := newIdem(b, newClient(b), IdempotencyOptions{Retention: time.Minute})
	b.ResetTimer()
	for n := 0; n < b.N; n++ {
		e, err := i.Begin(ctx, "k"+strconv.Itoa(n))
		if err != nil {
			b.Fatal(err)
		}
		if err := e.Complete(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// A dispatcher's path: claims of n jobs under one lease, each settled as
// one (finish.lua), per job, without due times (a dispatcher without
// hooks) and with them. Jobs carry a type and a queue, as the dispatcher
// needs. 64 is a dispatcher's claim with the defaults; 32 shows what a
// claim's fixed cost weighs per job in a smaller one.
func BenchmarkBatchClaimFinish(b *testing.B) {
	for _, n := range []int{32, 64} {
		for _, mode := range []claimMode{leaseBatchIDs, leaseBatch} {
			b.Run(fmt.Sprintf("%d/%s", n, mode), func(b *testing.B) { benchBatchClaimFinish(b, n, mode) })
		}
	}
}

func benchBatchClaimFinish(b *testing.B, n int, mode claimMode) {
	br := newBroker(b, BrokerOptions{Lease: time.Minute})
	past := time.Now().Add(-time.Second)
	refill := func() {
		jobs := make([]Job, 10000)
		for i := range jobs {
			jobs[i] = Job{ID: "j" + strconv.Itoa(i), RunAt: past, Type: "t", Queue: "q"}
		}
		must(b, br.Schedule(ctx, jobs...))
	}
	refill()
	var buf []Claim // a dispatcher reuses its claims' array
	b.ReportAllocs()
	b.ResetTimer()
	for done := 0; done < b.N; {
		res, err := br.claimInto(ctx, br.shards[0], n, mode, buf, br.opts.Lease, true)
		if err != nil {
			b.Fatal(err)
		}
		if len(res.claims) == 0 {
			b.StopTimer()
			refill()
			b.StartTimer()
			continue
		}
		if _, err := br.finishBatches(ctx, batchEnd{lease: res.lease}); err != nil {
			b.Fatal(err)
		}
		done += len(res.claims)
		buf = res.claims
	}
}

// The middleware's success path around a no-op handler, as asynq calls
// it: Begin, the handler under its lease, Complete. -benchmem shows the
// garbage a task leaves, which sets how often a small process collects.
func BenchmarkMiddleware(b *testing.B) {
	var n atomic.Int64
	i := newIdem(b, newClient(b), IdempotencyOptions{Retention: time.Minute, DisableTakeover: true,
		Key: func(context.Context, *asynq.Task) (string, error) { return "k" + strconv.FormatInt(n.Add(1), 10), nil }})
	h := i.Middleware()(asynq.HandlerFunc(func(context.Context, *asynq.Task) error { return nil }))
	t := asynq.NewTask("t", nil)
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		if err := h.ProcessTask(ctx, t); err != nil {
			b.Fatal(err)
		}
	}
}
