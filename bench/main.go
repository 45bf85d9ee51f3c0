// Command bench measures zclaim against the naive ZRANGEBYSCORE+ZREM
// poller, bare Lua claims and asynq's own scheduling, side by side in one
// run, and prints one markdown table per scenario. Progress goes to stderr.
//
//	go run ./bench                    # starts its own redis-server (from PATH)
//	go run ./bench -redis host:port   # or uses yours (only keys of its own; never flushed)
//	go run ./bench -quick             # smaller numbers, for a smoke test
//	go run ./bench -only claim,lag    # some scenarios: claim, lag, zadd, throughput, middleware, inside, e2e, memory, replicas, scale, recovery, takeover, idle, periodic, cluster, instructions
//	go run ./bench -only middleware -cpuprofile mw.pprof   # and look with go tool pprof (-memprofile: allocations)
//
// Exit codes: 0 done, 2 bad flags (an unknown scenario, -rounds below 1,
// a profile that cannot be written) or no redis-server to start, 3 a
// Redis named by -redis that cannot be reached or is older than 7. The
// flags are checked before anything starts.
package main

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/zclaim/zclaim/internal/redisinfo"
	"github.com/zclaim/zclaim/internal/redisproc"
)

var (
	addrFlag = flag.String("redis", "", "Redis address (default: start redis-server on a free port)")
	quick    = flag.Bool("quick", false, "smaller numbers: a smoke test, not a measurement")
	rounds   = flag.Int("rounds", 3, "rounds per contender (interleaved), for median and spread (default: 3, and 9 or one a contender, whichever is more, for throughput, middleware, inside and e2e)")
	only     = flag.String("only", "", "comma-separated scenarios to run (claim, lag, zadd, throughput, middleware, inside, e2e, memory, replicas, scale, recovery, takeover, idle, periodic, cluster, instructions)")
	cpuProf  = flag.String("cpuprofile", "", "write a CPU profile of this process (all scenarios run) to this file")
	memProf  = flag.String("memprofile", "", "write an allocation profile of this process (all scenarios run) to this file")
)

var redisAddr string

// shortRounds is the rounds of the short, noisy scenarios (dispatch
// throughput, middleware, inside, e2e) of n contenders: 9, or n where n is
// more, so that each contender takes each place of a round (slots), unless
// -rounds says (or -quick).
func shortRounds(n int) int {
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "rounds" })
	if *quick || set {
		return *rounds
	}
	return max(*rounds, 9, n)
}

// scenarios are what -only names, in the order they run.
var scenarios = []struct {
	name string
	run  func()
}{
	{"claim", claimScenario},
	{"lag", lagScenario},
	{"zadd", zaddScenario},
	{"throughput", dispatchThroughput},
	{"middleware", middlewareScenario},
	{"inside", insideScenario},
	{"e2e", e2eScenario},
	{"memory", memoryScenario},
	{"replicas", replicaScenario},
	{"scale", scaleScenario},
	{"recovery", recoveryScenario},
	{"takeover", takeoverScenario},
	{"idle", idleScenario},
	{"periodic", periodicScenario},
	{"cluster", clusterScenario},
	{"instructions", instructionsScenario},
}

func main() {
	if os.Getenv(workerEnv) != "" {
		takeoverWorker()
		return
	}
	flag.Parse()
	redis.SetLogger(redisproc.QuietRedis{})
	os.Exit(run())
}

// run checks the flags, then runs the scenarios asked for; it returns the
// exit code (see the top of this file).
func run() int {
	if *quick && *rounds == 3 {
		*rounds = 1
	}
	if *rounds < 1 {
		fmt.Fprintf(os.Stderr, "bench: -rounds must be at least 1, not %d\n", *rounds)
		return 2
	}
	var names []string
	for _, s := range scenarios {
		names = append(names, s.name)
	}
	var want []string
	if *only != "" {
		want = strings.Split(*only, ",")
		for _, w := range want {
			if !slices.Contains(names, w) {
				fmt.Fprintf(os.Stderr, "bench: -only: no scenario %q (scenarios: %s)\n", w, strings.Join(names, ", "))
				return 2
			}
		}
	}
	if flag.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "bench: unexpected arguments %q (flags only; -h lists them)\n", flag.Args())
		return 2
	}
	if *cpuProf != "" {
		f, err := os.Create(*cpuProf)
		if err == nil {
			err = pprof.StartCPUProfile(f)
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "bench: -cpuprofile: %v\n", err)
			return 2
		}
		defer func() { pprof.StopCPUProfile(); f.Close() }()
	}
	if *memProf != "" {
		f, err := os.Create(*memProf)
		if err != nil {
			fmt.Fprintf(os.Stderr, "bench: -memprofile: %v\n", err)
			return 2
		}
		defer func() {
			if err := pprof.Lookup("allocs").WriteTo(f, 0); err != nil {
				fmt.Fprintf(os.Stderr, "bench: -memprofile: %v\n", err)
			}
			f.Close()
		}()
	}

	redisAddr = *addrFlag
	if redisAddr == "" {
		srv, err := redisproc.Start()
		if err != nil {
			fmt.Fprintf(os.Stderr, "bench: %v (install redis-server, or pass -redis host:port)\n", err)
			return 2
		}
		defer srv.Close()
		redisAddr = srv.Addr
	}
	version, err := serverVersion(redisAddr)
	if err != nil {
		fmt.Fprintf(os.Stderr, "bench: Redis at %s: %v\n", redisAddr, err)
		return 3
	}
	where := "on loopback"
	if host, _, _ := net.SplitHostPort(redisAddr); host != "localhost" && !net.ParseIP(host).IsLoopback() {
		where = "at " + redisAddr
	}
	fmt.Printf("# zclaim benchmarks\n\n%s, %d CPUs, %s, %s %s; %d round(s) per contender (%d, or one a contender where there are more, for throughput, middleware, inside and e2e)%s.\n",
		time.Now().UTC().Format("2006-01-02"), runtime.NumCPU(), runtime.Version(), version, where,
		*rounds, shortRounds(0), map[bool]string{true: " (-quick: smoke test, not a measurement)", false: ""}[*quick])
	fmt.Printf("Command: `go run ./bench%s`\n", strings.Join(append([]string{""}, os.Args[1:]...), " "))

	for _, s := range scenarios {
		if want == nil || slices.Contains(want, s.name) {
			s.run()
		}
	}
	return 0
}

// serverVersion asks the Redis at addr for its name and version ("Redis
// 7.0.15", "Valkey 8.1.1"; one try, within two seconds): an error for one
// that cannot be reached or is older than 7 (Valkey's redis_version is the
// Redis it is compatible with).
func serverVersion(addr string) (string, error) {
	rdb := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialerRetries: 1, DialTimeout: 2 * time.Second,
		ReadTimeout: 2 * time.Second, WriteTimeout: 2 * time.Second})
	defer rdb.Close()
	info, err := rdb.Info(context.Background(), "server").Result()
	if err != nil {
		return "", err
	}
	v := infoField(info, "redis_version")
	major, _, _ := strings.Cut(v, ".")
	if n, err := strconv.Atoi(major); err != nil || n < 7 {
		return "", fmt.Errorf("version %q: the benchmarks need Redis 7 or later", v)
	}
	name, own := redisinfo.Server(info)
	return name + " " + own, nil
}

var infoField = redisinfo.Field

func progress(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "bench: "+format+"\n", args...)
}

func newClient(pool int) *redis.Client {
	return redis.NewClient(&redis.Options{Addr: redisAddr, PoolSize: pool})
}

// autopipelinedAsynq returns an asynq client on an autopipelined client
// of its own (pool connections), whose enqueues of one moment share round
// trips; closeRedis closes that client.
func autopipelinedAsynq(pool int) (c *asynq.Client, closeRedis func()) {
	rdb := newClient(pool)
	ap, err := rdb.AutoPipeline()
	if err != nil {
		panic(err)
	}
	return asynq.NewClientFromRedisClient(ap), func() { rdb.Close() }
}

// ns returns a hash-tagged key prefix of this run's own.
func ns(name string) string {
	return fmt.Sprintf("bench:{%s:%d}", name, time.Now().UnixNano())
}

// dropKeys deletes the keys holding prefix's hash tag.
func dropKeys(rdb *redis.Client, prefix string) {
	ctx := context.Background()
	tag := prefix[strings.IndexByte(prefix, '{'):]
	tag = tag[:strings.IndexByte(tag, '}')+1]
	for cursor := uint64(0); ; {
		keys, next, err := rdb.Scan(ctx, cursor, "*"+tag+"*", 1000).Result()
		if err != nil {
			panic(err)
		}
		if len(keys) > 0 {
			rdb.Del(ctx, keys...) // a page at a time; not UNLINK: memory figures must not see a lazy free
		}
		if cursor = next; cursor == 0 {
			return
		}
	}
}

// parallel calls f(i) for i in [0, n) on workers goroutines.
func parallel(n, workers int, f func(i int)) {
	var next atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := int(next.Add(1) - 1); i < n; i = int(next.Add(1) - 1) {
				f(i)
			}
		}()
	}
	wg.Wait()
}

// slots gives the order in which a round's n contenders run: round r
// (from 1) starts at contender (r-1) mod n and goes round, so that over n
// rounds each contender runs once in each place of the round. A place
// has a bias of its own on a shared VM (a round's later places have run
// faster than its first), which a fixed order would put into every
// ratio; taking turns spreads it over the rounds, where the median and
// the middle half of the per-round ratios show it.
func slots(round, n int) []int {
	order := make([]int, n)
	for k := range order {
		order[k] = (round - 1 + k) % n
	}
	return order
}

// turns says in a table's notes how its rounds ordered their n
// contenders (slots).
func turns(rounds, n int) string {
	const s = "each round starting one place further down the list"
	if rounds >= n {
		return s + ", so that each takes each place in the round in turn"
	}
	return fmt.Sprintf("%s, so that each takes %d of the %d places in the round", s, rounds, n)
}

// cpuMeter reads the CPU time spent so far by Redis (INFO cpu) and by this
// process (getrusage): on a machine where both share the cores, CPU per
// job is what throughput ratios come down to.
func cpuMeter(rdb *redis.Client) (redisCPU, selfCPU time.Duration) {
	s, _ := rdb.Info(context.Background(), "cpu").Result()
	for _, f := range []string{"used_cpu_sys", "used_cpu_user"} {
		v, _ := strconv.ParseFloat(infoField(s, f), 64)
		redisCPU += time.Duration(v * float64(time.Second))
	}
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return redisCPU, time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// samples summarises repeated measurements.
type samples []float64

func (s samples) median() float64 {
	if len(s) == 0 {
		return 0
	}
	c := slices.Clone(s)
	slices.Sort(c)
	return c[len(c)/2]
}

func (s samples) spread() string {
	if len(s) < 2 {
		return "–"
	}
	return fmt.Sprintf("%s–%s", human(slices.Min(s)), human(slices.Max(s)))
}

// middleHalf gives the middle half of s, its first to its third quartile
// (by rank), or "–" for fewer than 4 samples: how far one round's figure
// strays from round to round.
func (s samples) middleHalf() string {
	if len(s) < 4 {
		return "–"
	}
	c := slices.Clone(s)
	slices.Sort(c)
	return fmt.Sprintf("%.2f–%.2f", c[len(c)/4], c[len(c)-1-len(c)/4])
}

// paired returns a[i]/b[i] for each round i: the ratio of two contenders
// measured in the same round.
func paired(a, b samples) samples {
	r := make(samples, min(len(a), len(b)))
	for i := range r {
		r[i] = a[i] / b[i]
	}
	return r
}

// cpuRounds holds a contender's CPU a task, Redis' and this process',
// one entry a round (-rounds is at least 1).
type cpuRounds [][2]time.Duration

// cell gives the round of median total CPU a task, as cpuCell does.
func (c cpuRounds) cell() string {
	s := slices.Clone(c)
	slices.SortFunc(s, func(a, b [2]time.Duration) int { return cmp.Compare(a[0]+a[1], b[0]+b[1]) })
	return cpuCell(s[len(s)/2])
}

// over gives the median over the rounds of c's total CPU a task less
// base's in the same round.
func (c cpuRounds) over(base cpuRounds) string {
	d := make(samples, min(len(c), len(base)))
	for i := range d {
		d[i] = float64(c[i][0] + c[i][1] - base[i][0] - base[i][1])
	}
	return fmt.Sprintf("%+.1f µs", d.median()/float64(time.Microsecond))
}

// human prints a rate or count compactly.
func human(v float64) string {
	switch {
	case v >= 1e6:
		return fmt.Sprintf("%.2fM", v/1e6)
	case v >= 1e4:
		return fmt.Sprintf("%.0fk", v/1e3)
	case v >= 1e3:
		return fmt.Sprintf("%.1fk", v/1e3)
	case v >= 10:
		return fmt.Sprintf("%.0f", v)
	}
	return fmt.Sprintf("%.2f", v)
}

// durs holds latencies.
type durs []time.Duration

func (d durs) pct(p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	c := slices.Clone(d)
	slices.Sort(c)
	i := int(float64(len(c)-1) * p)
	return c[i]
}

func ms(d time.Duration) string {
	switch {
	case d >= 10*time.Second:
		return fmt.Sprintf("%.1f s", d.Seconds())
	case d >= time.Second:
		return fmt.Sprintf("%.2f s", d.Seconds())
	case d >= 10*time.Millisecond:
		return fmt.Sprintf("%.0f ms", float64(d)/1e6)
	}
	return fmt.Sprintf("%.2f ms", float64(d)/1e6)
}

func table(title string, header []string, rows [][]string, notes ...string) {
	fmt.Printf("\n## %s\n\n| %s |\n|%s\n", title, strings.Join(header, " | "), strings.Repeat("---|", len(header)))
	for _, r := range rows {
		fmt.Printf("| %s |\n", strings.Join(r, " | "))
	}
	for _, n := range notes {
		fmt.Printf("\n%s\n", n)
	}
}
