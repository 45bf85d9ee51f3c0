package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/zclaim/zclaim"
	"github.com/zclaim/zclaim/internal/redisproc"
)

// clusterScenario: one schedule of 16 shards on a Redis Cluster of 1 master
// and of 3 masters, side by side: claims/s, Redis CPU per job on each
// master, and how many jobs fit a fixed maxmemory per master.
func clusterScenario() {
	jobs, capMB := 200_000, 64
	if *quick {
		jobs, capMB = 20_000, 16
	}
	progress("cluster: 1 master vs 3 masters, 16 shards, %d due jobs; capacity at maxmemory %d MB per master", jobs, capMB)
	var rows [][]string
	for _, masters := range []int{1, 3} {
		cl, err := redisproc.StartCluster(masters, 0, "--maxmemory", strconv.Itoa(capMB)+"mb", "--maxmemory-policy", "noeviction")
		if err != nil {
			fmt.Printf("\n(cluster scenario skipped: %v)\n", err)
			return
		}
		rate, cpu := clusterClaims(cl, jobs)
		held := clusterCapacity(cl)
		cl.Close()
		var cells []string
		for _, c := range cpu {
			cells = append(cells, fmt.Sprintf("%.1f µs", c))
		}
		rows = append(rows, []string{fmt.Sprintf("%d master(s)", masters), human(rate), strings.Join(cells, ", "), human(float64(held))})
	}
	table("Scale-out on Redis Cluster: one schedule of 16 shards",
		[]string{"cluster", "claims/s (8 workers, Claim 100 + AckMany)", "Redis CPU per job, each master", fmt.Sprintf("jobs held at maxmemory %d MB per master (100-byte payloads)", capMB)}, rows,
		"Both clusters run on this 2-core VM beside the client, so three masters add no cores: the claim rate measures the client and the shared cores, while the CPU per job on each master shows the work dividing among them, and capacity grows with the masters' memory.")
}

// clusterClaims loads n due jobs and claims them with 8 workers; it returns
// jobs/s and the Redis CPU per job (µs) on each master.
func clusterClaims(cl *redisproc.Cluster, n int) (float64, []float64) {
	ctx := context.Background()
	cc := cl.Client()
	defer cc.Close()
	b, err := zclaim.NewBroker(cc, zclaim.BrokerOptions{Key: "bench:{cluster}", Shards: 16, Lease: time.Minute})
	if err != nil {
		panic(err)
	}
	due := time.Now().Add(-time.Minute)
	batch := make([]zclaim.Job, 0, 1000)
	for i := 0; i < n; i++ {
		batch = append(batch, zclaim.Job{ID: "job-" + strconv.Itoa(i), RunAt: due})
		if len(batch) == cap(batch) || i == n-1 {
			if err := b.Schedule(ctx, batch...); err != nil {
				panic(err)
			}
			batch = batch[:0]
		}
	}
	masters := cl.Masters()
	cpu0 := make([]time.Duration, len(masters))
	for i, m := range masters {
		c := redis.NewClient(&redis.Options{Addr: m.Addr})
		cpu0[i], _ = cpuMeter(c)
		c.Close()
	}
	var done atomic.Int64
	start := time.Now()
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := cl.Client()
			defer c.Close()
			wb, _ := zclaim.NewBroker(c, zclaim.BrokerOptions{Key: "bench:{cluster}", Shards: 16, Lease: time.Minute})
			for empty := 0; empty < 3; {
				cs, err := wb.Claim(ctx, 100)
				if err != nil {
					panic(err)
				}
				if len(cs) == 0 {
					empty++
					continue
				}
				if _, err := wb.AckMany(ctx, cs...); err != nil {
					panic(err)
				}
				done.Add(int64(len(cs)))
			}
		}()
	}
	wg.Wait()
	took := time.Since(start)
	per := make([]float64, len(masters))
	for i, m := range masters {
		c := redis.NewClient(&redis.Options{Addr: m.Addr})
		cpu, _ := cpuMeter(c)
		c.Close()
		per[i] = float64((cpu - cpu0[i]).Microseconds()) / float64(done.Load())
	}
	return float64(done.Load()) / took.Seconds(), per
}

// clusterCapacity schedules jobs with 100-byte payloads until a master
// refuses them (OOM) and returns how many were held.
func clusterCapacity(cl *redisproc.Cluster) int {
	ctx := context.Background()
	cc := cl.Client()
	defer cc.Close()
	b, err := zclaim.NewBroker(cc, zclaim.BrokerOptions{Key: "bench:{capacity}", Shards: 16})
	if err != nil {
		panic(err)
	}
	payload := []byte(strings.Repeat("p", 100))
	at := time.Now().Add(24 * time.Hour)
	held := 0
	batch := make([]zclaim.Job, 1000)
	for {
		for i := range batch {
			batch[i] = zclaim.Job{ID: "reminder-" + strconv.Itoa(held+i), RunAt: at, Type: "reminder", Payload: payload}
		}
		err := b.Schedule(ctx, batch...)
		var se *zclaim.ScheduleError
		if err != nil {
			if errors.As(err, &se) {
				held += se.Written
			}
			return held
		}
		held += len(batch)
	}
}
