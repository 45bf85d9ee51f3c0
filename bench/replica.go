package main

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/hibiken/asynq"
	"github.com/zclaim/zclaim"
	"github.com/zclaim/zclaim/internal/redisproc"
)

// Scenario: what BrokerOptions.WaitReplicas costs. A replica of the bench's
// server runs on this machine; claims and dispatch run with no wait and
// with WaitReplicas 1, interleaved, in the same run.
func replicaScenario() {
	primary := newClient(1)
	primary.ConfigSet(context.Background(), "repl-diskless-sync-delay", "0")
	primary.Close()
	replica, err := redisproc.StartReplica(redisAddr)
	if err != nil {
		progress("replicas: skipped: %v", err)
		return
	}
	defer replica.Close()
	n, workers := 50000, 8
	dn := 10000
	if *quick {
		n, dn = 5000, 2000
	}
	var claims, disp [2]samples
	for round := 1; round <= *rounds; round++ {
		for _, w := range slots(round, 2) {
			claims[w] = append(claims[w], waitClaims(w, n, workers))
			disp[w] = append(disp[w], waitDispatch(w, dn))
			progress("replicas round %d/%d, WaitReplicas %d: claims %s/s, dispatch %s/s", round, *rounds, w,
				human(claims[w][len(claims[w])-1]), human(disp[w][len(disp[w])-1]))
		}
	}
	rows := [][]string{}
	for w := range 2 {
		rows = append(rows, []string{strconv.Itoa(w),
			human(claims[w].median()), claims[w].spread(), fmt.Sprintf("%.2f×", claims[w].median()/claims[0].median()),
			human(disp[w].median()), disp[w].spread(), fmt.Sprintf("%.2f×", disp[w].median()/disp[0].median())})
	}
	table("WaitReplicas: claims and dispatch with a replica", []string{"WaitReplicas", "Broker.Claim batch 100, jobs/s", "spread", "ratio",
		"dispatch into asynq, jobs/s", "spread", "ratio"}, rows,
		fmt.Sprintf("One replica of the server on the same machine. Claims: %d workers, %s due jobs. Dispatch: %s due jobs, Concurrency 16. "+
			"With WaitReplicas 1 every write script is followed by WAIT in the same round trip.", workers, human(float64(n)), human(float64(dn))))
}

func waitClaims(wait, n, workers int) float64 {
	admin := newClient(4)
	defer admin.Close()
	key := ns("wait")
	defer dropKeys(admin, key)
	b, err := zclaim.NewBroker(admin, zclaim.BrokerOptions{Key: key})
	if err != nil {
		panic(err)
	}
	jobs := make([]zclaim.Job, n)
	past := time.Now().Add(-time.Second)
	for i := range jobs {
		jobs[i] = zclaim.Job{ID: "j" + strconv.Itoa(i), RunAt: past}
	}
	if err := b.Schedule(context.Background(), jobs...); err != nil {
		panic(err)
	}
	start := time.Now()
	parallel(workers, workers, func(int) {
		c := newClient(1)
		defer c.Close()
		wb, err := zclaim.NewBroker(c, zclaim.BrokerOptions{Key: key, WaitReplicas: wait})
		if err != nil {
			panic(err)
		}
		for {
			cs, err := wb.Claim(context.Background(), 100)
			if err != nil {
				panic(err)
			}
			if len(cs) == 0 {
				return
			}
		}
	})
	return float64(n) / time.Since(start).Seconds()
}

func waitDispatch(wait, n int) float64 {
	admin := newClient(4)
	defer admin.Close()
	key := ns("waitd")
	defer dropKeys(admin, key)
	queue := key
	defer admin.SRem(context.Background(), "asynq:queues", queue)
	b, err := zclaim.NewBroker(admin, zclaim.BrokerOptions{Key: key, WaitReplicas: wait})
	if err != nil {
		panic(err)
	}
	scheduleDue(b, n, queue)
	ac := asynq.NewClient(asynq.RedisClientOpt{Addr: redisAddr, PoolSize: 20})
	defer ac.Close()
	d, _ := zclaim.NewDispatcher(b, ac, zclaim.DispatcherOptions{RecoveryInterval: -1})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	start := time.Now()
	go d.Run(ctx)
	for s := d.Stats(); s.Enqueued+s.Conflicts+s.Dead < int64(n); s = d.Stats() {
		time.Sleep(time.Millisecond)
	}
	return float64(n) / time.Since(start).Seconds()
}
