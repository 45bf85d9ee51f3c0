package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/zclaim/zclaim"
	"github.com/zclaim/zclaim/internal/proc"
)

// Scenario: what BrokerOptions.WaitReplicas costs. A replica of the bench's
// server runs on this machine; claims and dispatch run with no wait and
// with WaitReplicas 1, interleaved, in the same run.
func replicaScenario() {
	stop, err := startReplica(redisAddr)
	if err != nil {
		progress("replicas: skipped: %v", err)
		return
	}
	defer stop()
	n, workers := 50000, 8
	dn := 10000
	if *quick {
		n, dn = 5000, 2000
	}
	var claims, disp [2]samples
	for round := 1; round <= *rounds; round++ {
		for w := range 2 {
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

// startReplica runs a redis-server that replicates addr and waits for its link.
func startReplica(addr string) (stop func(), err error) {
	host, port, _ := net.SplitHostPort(addr)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	rport := l.Addr().(*net.TCPAddr).Port
	l.Close()
	dir, _ := os.MkdirTemp("", "zclaim-bench-replica-")
	cmd := exec.Command("redis-server", "--port", strconv.Itoa(rport), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", dir, "--loglevel", "warning", "--replicaof", host, port)
	proc.DieWithParent(cmd)
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	stop = func() { cmd.Process.Kill(); cmd.Wait(); os.RemoveAll(dir) }
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:" + strconv.Itoa(rport)})
	defer c.Close()
	primary := redis.NewClient(&redis.Options{Addr: addr})
	defer primary.Close()
	primary.ConfigSet(context.Background(), "repl-diskless-sync-delay", "0")
	for i := 0; ; i++ {
		info, _ := c.Info(context.Background(), "replication").Result()
		if infoField(info, "master_link_status") == "up" {
			return stop, nil
		}
		if i > 1000 {
			stop()
			return nil, fmt.Errorf("the replica did not link up")
		}
		time.Sleep(10 * time.Millisecond)
	}
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
