// Command chaos runs zclaim as separate OS processes (a producer, several
// dispatchers, several asynq workers with the idempotency middleware) on a
// redis-server with append-only persistence, and meanwhile SIGKILLs a
// dispatcher or worker every second or two (starting a replacement),
// SIGSTOPs a worker past its lease, crashes and restarts Redis, and cuts
// every connection for a moment. Each handler applies a side effect to a
// sink (a second redis-server) that records every attempt with its key and
// fencing token. At the end it waits for recovery and checks the sink
// against the producer's own log: nothing lost, nothing early, no side
// effect accepted twice, nothing left behind.
//
//	go run ./chaos                                   # short form
//	go run ./chaos -jobs 50000 -over 150s -kill-every 1s -stop 100s -fsync always,everysec,failover,rolling -cluster   # make chaos
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/zclaim/zclaim"
	"github.com/zclaim/zclaim/internal/proc"
	"github.com/zclaim/zclaim/internal/redisproc"
	"github.com/zclaim/zclaim/internal/tcpproxy"
)

// roleEnv names the role a child process plays; its flags follow in argsEnv.
const (
	roleEnv = "ZCLAIM_CHAOS_ROLE"
	argsEnv = "ZCLAIM_CHAOS_ARGS"
)

func main() {
	if runRole() {
		return
	}
	cfg := defaultConfig()
	fs := flag.NewFlagSet("chaos", flag.ExitOnError)
	cfg.flags(fs)
	fs.Parse(os.Args[1:])
	ok := run(cfg, os.Stdout)
	if !ok {
		os.Exit(1)
	}
}

// runRole runs this process as a child role if the environment says so.
func runRole() bool {
	role := os.Getenv(roleEnv)
	if role == "" {
		return false
	}
	f := parseRole(strings.Fields(os.Getenv(argsEnv)))
	switch role {
	case "producer":
		producer(f)
	case "dispatcher":
		dispatcher(f)
	case "worker":
		worker(f, false)
	case "plain-worker":
		worker(f, true)
	default:
		fmt.Fprintln(os.Stderr, "chaos: unknown role", role)
		os.Exit(2)
	}
	return true
}

type config struct {
	jobs        int
	over        time.Duration
	fsync       string
	dispatchers int
	workers     int
	killEvery   time.Duration
	stop        time.Duration
	wait        time.Duration
	cluster     bool
}

func defaultConfig() config {
	return config{jobs: 1500, over: 15 * time.Second, fsync: "always", dispatchers: 2, workers: 3,
		killEvery: time.Second, stop: idemLease + brokerLease/2 + time.Second, wait: 4 * time.Minute}
}

func (c *config) flags(fs *flag.FlagSet) {
	fs.IntVar(&c.jobs, "jobs", c.jobs, "jobs the producer schedules")
	fs.DurationVar(&c.over, "over", c.over, "the producer schedules them over this long; the faults run meanwhile")
	fs.StringVar(&c.fsync, "fsync", c.fsync, "variants to run, comma-separated: always, everysec (appendfsync of the crashed and restarted Redis), "+
		"failover (a replica promoted instead, every write waiting for one replica), cluster (as -cluster), "+
		"rolling (every other worker a plain asynq server without the middleware, appendfsync always)")
	fs.BoolVar(&c.cluster, "cluster", c.cluster, "also run on a Redis Cluster of 3 masters and 3 replicas, the schedule in 16 shards, every write "+
		"waiting for one replica: a slot of a busy shard moves to another master, a master fails over to its replica, another is SIGKILLed")
	fs.IntVar(&c.dispatchers, "dispatchers", c.dispatchers, "dispatcher processes")
	fs.IntVar(&c.workers, "workers", c.workers, "asynq worker processes")
	fs.DurationVar(&c.killEvery, "kill-every", c.killEvery, "mean time between SIGKILLs")
	fs.DurationVar(&c.stop, "stop", c.stop, "how long one worker stays SIGSTOPped (past the 2 s middleware lease; past 30 s asynq re-delivers its tasks meanwhile)")
	fs.DurationVar(&c.wait, "wait", c.wait, "how long to wait for recovery at the end (asynq re-delivers a killed worker's task after 30–90 s)")
}

// result is one variant's figures.
type result struct {
	fsync                                             string
	jobs, kills, stops, restarts, cuts, moves         int
	applied, rerunsAtSink, dupRejected, staleRejected int
	acceptedTwice, lost, early                        int
	recovered, dead, leftScheduled, leftInflight      int64
	archived                                          int
	took                                              time.Duration
	killToRerun                                       []time.Duration // each re-run, from the worker kill before it
	dispatcherKills                                   int
	late                                              []time.Duration // first applications more than a second after their due time
}

func (r result) ok() bool {
	return r.lost == 0 && r.early == 0 && r.acceptedTwice == 0 && r.dead == 0 && r.leftScheduled == 0 && r.leftInflight == 0
}

func run(cfg config, w io.Writer) bool {
	var results []result
	modes := strings.Split(cfg.fsync, ",")
	if cfg.cluster && !slices.Contains(modes, "cluster") {
		modes = append(modes, "cluster")
	}
	for _, mode := range modes {
		r, err := runVariant(cfg, strings.TrimSpace(mode), w)
		if err != nil {
			fmt.Fprintln(os.Stderr, "chaos:", err)
			return false
		}
		results = append(results, r)
	}
	fmt.Fprintf(w, "\n| variant |")
	for _, r := range results {
		fmt.Fprintf(w, " %s |", variantName(r.fsync))
	}
	fmt.Fprintf(w, "\n|---|%s\n", strings.Repeat("---|", len(results)))
	row := func(name string, get func(result) any) {
		fmt.Fprintf(w, "| %s |", name)
		for _, r := range results {
			fmt.Fprintf(w, " %v |", get(r))
		}
		fmt.Fprintln(w)
	}
	row("jobs (producer's log)", func(r result) any { return r.jobs })
	row("SIGKILLs (dispatchers and workers)", func(r result) any { return r.kills })
	row("SIGSTOPs past the lease", func(r result) any { return r.stops })
	row("Redis crashes and restarts (failover: replica promoted, old primary killed; cluster: two failovers)", func(r result) any { return r.restarts })
	row("connection cuts", func(r result) any { return r.cuts })
	row("slot moves (cluster)", func(r result) any { return r.moves })
	row("applied by the sink", func(r result) any { return r.applied })
	row("applied twice (must be 0)", func(r result) any { return r.acceptedTwice })
	row("re-runs that reached the sink", func(r result) any { return r.rerunsAtSink })
	row("… refused: key applied already", func(r result) any { return r.dupRejected })
	row("… refused: stale token", func(r result) any { return r.staleRejected })
	row("lost (must be 0)", func(r result) any { return r.lost })
	row("early starts (must be 0)", func(r result) any { return r.early })
	row("recovered by the broker (expired leases)", func(r result) any { return r.recovered })
	row("dead (must be 0)", func(r result) any { return r.dead })
	row("left scheduled / in flight (must be 0)", func(r result) any { return fmt.Sprintf("%d / %d", r.leftScheduled, r.leftInflight) })
	row("asynq tasks archived", func(r result) any { return r.archived })
	row("re-runs at the sink after a worker kill: time from the kill, p50 / last", func(r result) any { return midLast(r.killToRerun, "–") })
	row("SIGKILLs of dispatchers", func(r result) any { return r.dispatcherKills })
	row("first runs more than 1 s after their due time: how many, p50 / last (a dispatcher killed with claims in hand, a worker with tasks taken)", func(r result) any {
		return fmt.Sprintf("%d, %s", len(r.late), midLast(r.late, "–"))
	})
	row("run time", func(r result) any { return r.took.Round(time.Second) })
	ok := true
	for _, r := range results {
		ok = ok && r.ok()
	}
	fmt.Fprintf(w, "\nchaos: %s\n", map[bool]string{true: "PASS", false: "FAIL"}[ok])
	return ok
}

// midLast formats the median and the largest of ds, none where ds is empty.
func midLast(ds []time.Duration, none string) string {
	if len(ds) == 0 {
		return none
	}
	d := slices.Sorted(slices.Values(ds))
	return fmt.Sprintf("%v / %v", d[len(d)/2].Round(100*time.Millisecond), d[len(d)-1].Round(100*time.Millisecond))
}

// child is a role process.
type child struct {
	role    string
	cmd     *exec.Cmd
	done    chan struct{}
	stopped bool // SIGSTOPped: not to be killed meanwhile
}

func runVariant(cfg config, mode string, w io.Writer) (res result, err error) {
	began := time.Now()
	res.fsync = mode
	dir, err := os.MkdirTemp("", "zclaim-chaos-")
	if err != nil {
		return res, err
	}
	defer os.RemoveAll(dir)
	failover, onCluster, rolling := mode == "failover", mode == "cluster", mode == "rolling"
	fsync := mode
	switch {
	case failover || onCluster:
		fsync = "everysec"
	case rolling:
		fsync = "always"
	}
	key, queue := "chaos:{jobs}", "chaos"
	shards := 1
	var cl *redisproc.Cluster
	var main *redisproc.Server
	var direct redis.UniversalClient // the final count's client
	roleExtra := []string{}
	if onCluster {
		// 3 masters, 3 replicas; every write waits for one replica.
		shards = 16
		if cl, err = redisproc.StartCluster(3, 1, "--appendonly", "yes", "--appendfsync", fsync); err != nil {
			return res, err
		}
		defer cl.Close()
		roleExtra = []string{"-cluster", strings.Join(cl.Addrs(), ","), "-wait", "1", "-shards", "16"}
		cc := cl.Client()
		defer cc.Close()
		direct = cc
	} else {
		if main, err = redisproc.Start("--appendonly", "yes", "--appendfsync", fsync, "--repl-diskless-sync-delay", "0"); err != nil {
			return res, err
		}
		defer func() { main.Close() }()
	}
	primary := main
	var replica *redisproc.Server
	if failover {
		replica, err = redisproc.StartReplica(main.Addr, "--appendonly", "yes", "--appendfsync", fsync, "--repl-diskless-sync-delay", "0")
		if err != nil {
			return res, err
		}
		defer func() { replica.Close() }()
		roleExtra = []string{"-wait", "1"}
	}
	sink, err := redisproc.Start()
	if err != nil {
		return res, err
	}
	defer sink.Close()
	target := "127.0.0.1:1" // on a cluster the roles do not use the proxy
	if main != nil {
		target = main.Addr
	}
	px, err := tcpproxy.New(target)
	if err != nil {
		return res, err
	}
	defer px.Close()

	logPath := filepath.Join(dir, "producer.log")
	self, _ := os.Executable()
	var mu sync.Mutex
	var workerKills []time.Time
	var recovered int64
	start := func(role string, extra ...string) *child {
		args := append(append([]string{"-redis", px.Addr, "-sink", sink.Addr, "-key", key, "-queue", queue}, roleExtra...), extra...)
		cmd := exec.Command(self)
		cmd.Env = append(os.Environ(), roleEnv+"="+role, argsEnv+"="+strings.Join(args, " "))
		out, _ := cmd.StdoutPipe()
		cmd.Stderr, _ = os.Create(filepath.Join(dir, role+".err"))
		proc.DieWithParent(cmd)
		if err := cmd.Start(); err != nil {
			panic(err)
		}
		c := &child{role: role, cmd: cmd, done: make(chan struct{})}
		go func() { // dispatchers log recovery passes as JSON
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				var m struct {
					Msg      string `json:"msg"`
					Requeued int64  `json:"requeued"`
					Dead     int64  `json:"dead"`
				}
				if json.Unmarshal(sc.Bytes(), &m) == nil && m.Msg == "zclaim: recovered expired leases" {
					mu.Lock()
					recovered += m.Requeued + m.Dead
					mu.Unlock()
				}
			}
			cmd.Wait()
			close(c.done)
		}()
		return c
	}
	var procs []*child
	for range cfg.dispatchers {
		procs = append(procs, start("dispatcher"))
	}
	for k := range cfg.workers {
		// A rolling deploy: every other worker a plain asynq server
		// without the middleware, on the same queue.
		if rolling && k%2 == 1 {
			procs = append(procs, start("plain-worker"))
			continue
		}
		procs = append(procs, start("worker"))
	}
	defer func() {
		for _, c := range procs {
			c.cmd.Process.Signal(syscall.SIGTERM)
		}
		for _, c := range procs {
			select {
			case <-c.done:
			case <-time.After(3 * time.Second):
				c.cmd.Process.Kill()
			}
		}
	}()
	prod := start("producer", "-log", logPath, "-jobs", strconv.Itoa(cfg.jobs), "-over", cfg.over.String())
	fmt.Fprintf(w, "chaos (%s): %d jobs over %v, %d dispatchers, %d workers\n", variantName(mode), cfg.jobs, cfg.over, cfg.dispatchers, cfg.workers)

	// The faults, while the producer runs. Every loop is bounded.
	t0 := time.Now()
	stopAt, moveAt, restartAt, cutAt := cfg.over*3/10, cfg.over*4/10, cfg.over/2, cfg.over*7/10
	var stopped, moved, restarted, cut bool
	var stopWG sync.WaitGroup
	for time.Since(t0) < cfg.over+2*time.Second {
		time.Sleep(cfg.killEvery/2 + time.Duration(rand.Int64N(int64(cfg.killEvery))))
		el := time.Since(t0)
		switch {
		case !stopped && el > stopAt:
			stopped = true
			var ws []*child
			for _, c := range procs {
				if c.role == "worker" || c.role == "plain-worker" {
					ws = append(ws, c)
				}
			}
			c := ws[rand.IntN(len(ws))]
			c.stopped = true
			c.cmd.Process.Signal(syscall.SIGSTOP)
			res.stops++
			fmt.Fprintf(w, "%6.1fs  SIGSTOP a worker for %v\n", time.Since(t0).Seconds(), cfg.stop)
			stopWG.Add(1)
			time.AfterFunc(cfg.stop, func() {
				defer stopWG.Done()
				c.cmd.Process.Signal(syscall.SIGCONT)
				fmt.Fprintf(w, "%6.1fs  SIGCONT the stopped worker\n", time.Since(t0).Seconds())
			})
		case onCluster && (!moved && el > moveAt || !restarted && el > restartAt || !cut && el > cutAt):
			var what string
			switch {
			case !moved:
				moved, what = true, "a slot of a busy shard moved to another master, key by key"
				res.moves++
				err = moveBusySlot(cl, key)
			case !restarted:
				restarted, what = true, "a master failed over to its replica (CLUSTER FAILOVER)"
				res.restarts++
				err = failOver(cl, queue, false)
			default:
				cut, what = true, "a master SIGKILLed; its replica took over; it came back as a replica"
				res.restarts++
				err = failOver(cl, queue, true)
			}
			if err != nil {
				return res, err
			}
			fmt.Fprintf(w, "%6.1fs  %s\n", time.Since(t0).Seconds(), what)
		case !restarted && el > restartAt && failover:
			// The replica becomes the primary; the old primary dies and
			// comes back as its replica, so that writes can wait for one.
			restarted = true
			rc := redis.NewClient(&redis.Options{Addr: replica.Addr})
			err := rc.ReplicaOf(context.Background(), "NO", "ONE").Err()
			rc.Close()
			if err != nil {
				return res, err
			}
			px.SetTarget(replica.Addr)
			px.SetDown(true)
			main.Kill()
			px.SetDown(false)
			primary = replica
			main.Args = append(main.Args, "--replicaof", "127.0.0.1", strconv.Itoa(replica.Port))
			if err := main.Restart(); err != nil {
				return res, err
			}
			res.restarts++
			fmt.Fprintf(w, "%6.1fs  failover: replica promoted, old primary killed and restarted as its replica\n", time.Since(t0).Seconds())
		case !restarted && el > restartAt:
			restarted = true
			main.Kill()
			time.Sleep(300 * time.Millisecond)
			if err := main.Restart(); err != nil {
				return res, err
			}
			res.restarts++
			fmt.Fprintf(w, "%6.1fs  Redis crashed (SIGKILL) and restarted from its append-only file\n", time.Since(t0).Seconds())
		case !cut && el > cutAt:
			cut = true
			px.SetDown(true)
			time.Sleep(300 * time.Millisecond)
			px.SetDown(false)
			res.cuts++
			fmt.Fprintf(w, "%6.1fs  every connection to Redis cut for 300 ms\n", time.Since(t0).Seconds())
		default:
			i := rand.IntN(len(procs))
			victim := procs[i]
			if victim.stopped {
				continue
			}
			victim.cmd.Process.Kill()
			switch victim.role {
			case "worker", "plain-worker":
				mu.Lock()
				workerKills = append(workerKills, time.Now())
				mu.Unlock()
			case "dispatcher":
				res.dispatcherKills++
			}
			<-victim.done
			procs[i] = start(victim.role)
			res.kills++
		}
	}
	<-prod.done
	stopWG.Wait()
	fmt.Fprintf(w, "%6.1fs  producer done; %d kills; waiting for the last runs (a killed worker's run is taken over "+
		"once its %v lease has run out)\n", time.Since(t0).Seconds(), res.kills, idemLease)

	// Wait until every logged job was applied and the broker is empty.
	ids, dues, err := readLog(logPath)
	if err != nil {
		return res, err
	}
	res.jobs = len(ids)
	if direct == nil {
		c := redis.NewClient(&redis.Options{Addr: primary.Addr})
		defer c.Close()
		direct = c
	}
	sinkc := redis.NewClient(&redis.Options{Addr: sink.Addr})
	defer sinkc.Close()
	b, _ := zclaim.NewBroker(direct, zclaim.BrokerOptions{Key: key, Shards: shards})
	ctx := context.Background()
	deadline := time.Now().Add(cfg.wait)
	for last := time.Now(); ; {
		n, _ := sinkc.HLen(ctx, "sink:applied").Result()
		st, _ := b.Stats(ctx)
		if int(n) >= len(ids) && st.Scheduled == 0 && st.Inflight == 0 {
			break
		}
		if time.Now().After(deadline) {
			fmt.Fprintf(w, "        gave up waiting: %d/%d applied, %+v\n", n, len(ids), st)
			break
		}
		if time.Since(last) > 10*time.Second {
			last = time.Now()
			fmt.Fprintf(w, "%6.1fs  %d/%d applied; scheduled %d, in flight %d\n", time.Since(t0).Seconds(), n, len(ids), st.Scheduled, st.Inflight)
		}
		time.Sleep(200 * time.Millisecond)
	}
	time.Sleep(time.Second) // late re-runs still reach the sink

	applied, _ := sinkc.HGetAll(ctx, "sink:applied").Result()
	attempts, _ := sinkc.HGetAll(ctx, "sink:attempts").Result()
	counters, _ := sinkc.HGetAll(ctx, "sink:counters").Result()
	for i, id := range ids {
		if _, ok := applied[id]; !ok {
			res.lost++
			if res.lost <= 5 {
				fmt.Fprintf(w, "        lost: %s (due %v)\n", id, time.UnixMicro(dues[i]).Format(time.StampMilli))
			}
		}
	}
	res.applied = len(applied)
	for _, a := range attempts {
		if n, _ := strconv.Atoi(a); n > 1 {
			res.rerunsAtSink += n - 1
		}
	}
	// Each re-run, from the worker kill before it: how long a killed
	// worker's run took to come back.
	reruns, _ := sinkc.LRange(ctx, "sink:reruns", 0, -1).Result()
	mu.Lock()
	for _, r := range reruns {
		us, _ := strconv.ParseInt(r, 10, 64)
		at := time.UnixMicro(us)
		var last time.Time
		for _, k := range workerKills {
			if k.Before(at) {
				last = k
			}
		}
		if !last.IsZero() {
			res.killToRerun = append(res.killToRerun, at.Sub(last))
		}
	}
	mu.Unlock()
	lates, _ := sinkc.LRange(ctx, "sink:late", 0, -1).Result()
	for _, l := range lates {
		us, _ := strconv.ParseInt(l, 10, 64)
		res.late = append(res.late, time.Duration(us)*time.Microsecond)
	}
	res.dupRejected, _ = strconv.Atoi(counters["dup"])
	res.staleRejected, _ = strconv.Atoi(counters["stale"])
	res.early, _ = strconv.Atoi(counters["early"])
	// Applications the sink accepted beyond one per key.
	total, _ := strconv.Atoi(counters["applied"])
	res.acceptedTwice = total - len(applied)
	st, _ := b.Stats(ctx)
	res.dead, res.leftScheduled, res.leftInflight = st.Dead, st.Scheduled, st.Inflight
	if qi, err := asynq.NewInspectorFromRedisClient(direct).GetQueueInfo(queue); err == nil {
		res.archived = qi.Archived
	}
	mu.Lock()
	res.recovered = recovered
	mu.Unlock()
	res.took = time.Since(began)
	return res, nil
}

// readLog reads the producer's log: one "id due_µs" line per scheduled job.
func readLog(path string) (ids []string, dues map[int]int64, err error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	dues = map[int]int64{}
	seen := map[string]bool{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		id, d, ok := strings.Cut(sc.Text(), " ")
		if !ok || seen[id] {
			continue
		}
		seen[id] = true
		v, _ := strconv.ParseInt(d, 10, 64)
		dues[len(ids)] = v
		ids = append(ids, id)
	}
	return ids, dues, sc.Err()
}

// variantName names a variant in the table.
func variantName(mode string) string {
	switch mode {
	case "failover", "cluster":
		return mode
	case "rolling":
		return "rolling deploy"
	}
	return "appendfsync " + mode
}

// moveBusySlot moves the slot of a shard (every shard is as busy as the
// others: jobs spread by their ids) to another master, one key at a time
// with a pause after each, so that the roles meet ASK and TRYAGAIN
// meanwhile.
func moveBusySlot(cl *redisproc.Cluster, key string) error {
	cc := cl.Client()
	defer cc.Close()
	b, err := zclaim.NewBroker(cc, zclaim.BrokerOptions{Key: key, Shards: 16})
	if err != nil {
		return err
	}
	slot, err := slotOf(cc, b.ShardKey("job-"+strconv.Itoa(rand.IntN(1000))))
	if err != nil {
		return err
	}
	from, err := cl.MasterOf(slot)
	if err != nil {
		return err
	}
	for _, m := range cl.Masters() {
		if m != from {
			return cl.MoveSlot(slot, m, 1, 20*time.Millisecond)
		}
	}
	return fmt.Errorf("no other master")
}

func slotOf(cc *redis.ClusterClient, key string) (int, error) {
	n, err := cc.ClusterKeySlot(context.Background(), key).Result()
	return int(n), err
}

// failOver fails a master over to its replica: with CLUSTER FAILOVER, or
// by SIGKILL (the replica takes over after the node timeout, and the old
// master comes back as its replica). It spares the master of asynq's
// queue, whose writes wait for no replica.
func failOver(cl *redisproc.Cluster, queue string, kill bool) error {
	cc := cl.Client()
	slot, err := slotOf(cc, "asynq:{"+queue+"}:pending")
	cc.Close()
	if err != nil {
		return err
	}
	asynqMaster, err := cl.MasterOf(slot)
	if err != nil {
		return err
	}
	var victim *redisproc.Server
	for _, m := range cl.Masters() {
		if m != asynqMaster {
			victim = m
			break
		}
	}
	if victim == nil {
		return fmt.Errorf("no master to fail over")
	}
	r, err := cl.ReplicaOf(victim)
	if err != nil {
		return err
	}
	if !kill {
		rc := redis.NewClient(&redis.Options{Addr: r.Addr})
		defer rc.Close()
		if err := rc.Do(context.Background(), "CLUSTER", "FAILOVER").Err(); err != nil {
			return err
		}
		return cl.WaitOK(15 * time.Second)
	}
	victim.Kill()
	if err := cl.WaitOK(15 * time.Second); err != nil {
		return err
	}
	if err := victim.Restart(); err != nil {
		return err
	}
	return cl.WaitOK(15 * time.Second)
}
