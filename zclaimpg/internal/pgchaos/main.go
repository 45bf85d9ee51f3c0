// Command pgchaos is the fault test of zclaimpg: asynq workers in separate
// OS processes, SIGKILLed one after another, whose handler writes a row to
// PostgreSQL that nothing dedupes (no unique constraint) and, in the
// "complete" mode, calls zclaimpg.Complete in the same transaction. Midway
// Redis is SIGKILLed and restarted from an older RDB snapshot, so it
// forgets the runs finished since. At the end every job must have exactly
// one row; the "control" mode, without Complete, shows how many rows a
// plain handler writes twice. The modes run at the same time.
//
//	go run ./internal/pgchaos                        # short form
//	go run ./internal/pgchaos -jobs 2000 -over 60s   # make chaos
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/zclaim/zclaim"
	"github.com/zclaim/zclaim/internal/pgproc"
	"github.com/zclaim/zclaim/internal/proc"
	"github.com/zclaim/zclaim/internal/redisproc"
	"github.com/zclaim/zclaim/zclaimpg"
)

// roleEnv makes a child process a worker; its settings follow in the
// other variables.
const roleEnv = "ZCLAIM_PGCHAOS_WORKER"

type config struct {
	jobs      int
	over      time.Duration
	killEvery time.Duration
	workers   int
	lease     time.Duration
	modes     []string
	tail      time.Duration
}

func main() {
	if os.Getenv(roleEnv) != "" {
		worker()
		return
	}
	var c config
	var modes string
	flag.IntVar(&c.jobs, "jobs", 300, "jobs, all scheduled at the start")
	flag.DurationVar(&c.over, "over", 10*time.Second, "the jobs come due over this long")
	flag.DurationVar(&c.killEvery, "kill-every", time.Second, "SIGKILL a worker this often")
	flag.IntVar(&c.workers, "workers", 3, "worker processes")
	flag.DurationVar(&c.lease, "lease", 2*time.Second, "the middleware's Lease")
	flag.DurationVar(&c.tail, "tail", 5*time.Minute, "how long to wait after the last due time for every job to run")
	flag.StringVar(&modes, "mode", "complete,control", "complete (zclaimpg.Complete in the handler's transaction), control (without it), or both")
	flag.Parse()
	c.modes = strings.Split(modes, ",")
	pg, err := pgproc.Find()
	if err != nil {
		fmt.Fprintf(os.Stderr, "pgchaos: %s (%v)\n", pgproc.Install, err)
		os.Exit(2)
	}
	defer pg.Close()
	fmt.Printf("%d jobs due over %v, %d workers (Concurrency 10, Lease %v), one SIGKILLed every %v; "+
		"Redis (RDB only) SIGKILLed at 2/3 of the run (once a row was written since its snapshot) and restarted from its snapshot taken at 1/3\n\n",
		c.jobs, c.over, c.workers, c.lease, c.killEvery)
	fmt.Println("| handler | jobs | rows | lost | applied twice | worker kills | runs the database refused (ErrAlreadyDone) | last row after its due time |")
	fmt.Println("|---|---|---|---|---|---|---|---|")
	// The modes run at once, each with a Redis, a schema and workers of
	// its own.
	results, errs := make([]result, len(c.modes)), make([]error, len(c.modes))
	var wg sync.WaitGroup
	for k, m := range c.modes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[k], errs[k] = run(c, pg.URL, m)
		}()
	}
	wg.Wait()
	ok := true
	for k, m := range c.modes {
		r, err := results[k], errs[k]
		if err != nil {
			fmt.Fprintf(os.Stderr, "pgchaos: %s: %v\n", m, err)
			os.Exit(2)
		}
		name := "INSERT + `zclaimpg.Complete` in one transaction"
		if m == "control" {
			name = "INSERT alone (control)"
		}
		fmt.Printf("| %s | %d | %d | %d | %d | %d | %d | %v |\n", name, c.jobs, r.rows, r.lost, r.twice, r.kills, r.dbSkips, r.lastDone.Round(100*time.Millisecond))
		switch m {
		case "complete":
			ok = ok && r.lost == 0 && r.twice == 0
		case "control":
			ok = ok && r.lost == 0 && r.twice > 0 // the control shows the test can fail
		}
	}
	if !ok {
		fmt.Println("\nFAIL: want 0 lost and 0 applied twice with Complete, and duplicates in the control")
		os.Exit(1)
	}
	fmt.Println("\nPASS")
}

type result struct {
	rows, lost, twice, kills, dbSkips int
	lastDone                          time.Duration
}

func run(c config, pgURL, mode string) (result, error) {
	var r result
	ctx := context.Background()
	rs, err := redisproc.Start()
	if err != nil {
		return r, err
	}
	defer rs.Close()
	schema := pgproc.SchemaName("pgchaos_" + mode)
	admin, err := pgxpool.New(ctx, pgURL)
	if err != nil {
		return r, err
	}
	defer admin.Close()
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		return r, err
	}
	defer admin.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE")
	pool, err := open(pgURL, schema)
	if err != nil {
		return r, err
	}
	defer pool.Close()
	if err := zclaimpg.Migrate(ctx, pool); err != nil {
		return r, err
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE effects (key text NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp());
		CREATE TABLE skips (key text NOT NULL)`); err != nil {
		return r, err
	}

	rdb := redis.NewClient(&redis.Options{Addr: rs.Addr, MaxRetries: 2, DialTimeout: 500 * time.Millisecond})
	defer rdb.Close()
	quiet := slog.New(slog.DiscardHandler)
	broker, err := zclaim.NewBroker(rdb, zclaim.BrokerOptions{Key: "pgchaos:jobs", Lease: 2 * time.Second, Logger: quiet,
		Backoff: func(int) time.Duration { return time.Duration(50+rand.IntN(200)) * time.Millisecond }})
	if err != nil {
		return r, err
	}
	start := time.Now()
	due := make(map[string]time.Time, c.jobs)
	var jobs []zclaim.Job
	for i := range c.jobs {
		id := "job-" + strconv.Itoa(i)
		at := start.Add(time.Second + time.Duration(rand.Int64N(int64(c.over)))).Truncate(time.Millisecond)
		due[id] = at
		jobs = append(jobs, zclaim.Job{ID: id, RunAt: at, Type: "effect", Queue: "pgchaos"})
	}
	if err := broker.Schedule(ctx, jobs...); err != nil {
		return r, err
	}
	dctx, stopDispatch := context.WithCancel(ctx)
	defer stopDispatch()
	var dwg sync.WaitGroup
	dwg.Add(1)
	go func() {
		defer dwg.Done()
		for dctx.Err() == nil { // again after Redis came back
			d, err := zclaim.NewDispatcher(broker, asynq.NewClientFromRedisClient(rdb), zclaim.DispatcherOptions{
				RecoveryInterval: 200 * time.Millisecond, EnqueueTimeout: time.Second, Logger: quiet})
			if err == nil {
				d.Run(dctx)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}()

	env := append(os.Environ(), roleEnv+"=1", "PGCHAOS_REDIS="+rs.Addr, "PGCHAOS_PG="+pgURL,
		"PGCHAOS_SCHEMA="+schema, "PGCHAOS_MODE="+mode, "PGCHAOS_LEASE="+c.lease.String())
	var mu sync.Mutex
	procs := make([]*exec.Cmd, c.workers)
	spawn := func(i int) error {
		cmd := exec.Command(os.Args[0])
		cmd.Env = env
		cmd.Stdout, cmd.Stderr = io.Discard, os.Stderr
		proc.DieWithParent(cmd)
		if err := cmd.Start(); err != nil {
			return err
		}
		procs[i] = cmd
		return nil
	}
	for i := range procs {
		if err := spawn(i); err != nil {
			return r, err
		}
	}
	defer func() {
		mu.Lock()
		defer mu.Unlock()
		for _, p := range procs {
			p.Process.Signal(syscall.SIGKILL)
			p.Wait()
		}
	}()

	end := start.Add(time.Second + c.over)
	saved, rolled := false, false
	var atSave int // rows once Redis saved its snapshot
	written := func() (n int, err error) {
		err = pool.QueryRow(ctx, "SELECT count(*) FROM effects").Scan(&n)
		return n, err
	}
	tick := time.NewTicker(c.killEvery)
	defer tick.Stop()
	// Redis is rolled back only once rows were written since its snapshot,
	// so that the rollback forgets work that finished (on a loaded machine
	// the handlers may lag the due times past the run's 2/3): the loop
	// goes on past the run's end until then, at most c.tail.
	for time.Now().Before(end) || saved && !rolled && time.Now().Before(end.Add(c.tail)) {
		<-tick.C
		mu.Lock()
		i := rand.IntN(len(procs))
		procs[i].Process.Signal(syscall.SIGKILL)
		procs[i].Wait()
		err := spawn(i)
		mu.Unlock()
		if err != nil {
			return r, err
		}
		r.kills++
		el := time.Since(start)
		switch {
		case !saved && el > c.over/3:
			if err := rdb.Save(ctx).Err(); err != nil {
				return r, fmt.Errorf("SAVE: %w", err)
			}
			// A row beyond these committed after the snapshot, and so did
			// its job's finish in Redis, which comes after it.
			if atSave, err = written(); err != nil {
				return r, err
			}
			saved = true
		case saved && !rolled && el > 2*c.over/3:
			if n, err := written(); err != nil {
				return r, err
			} else if n == atSave {
				continue // nothing finished since the snapshot yet
			}
			rs.Kill() // what it did since the SAVE is gone
			if err := rs.Restart(); err != nil {
				return r, fmt.Errorf("restart redis: %w", err)
			}
			rolled = true
		}
	}

	// Wait until every job has a row and nothing is left to run.
	deadline := time.Now().Add(c.tail)
	for {
		var keys int
		if err := pool.QueryRow(ctx, "SELECT count(DISTINCT key) FROM effects").Scan(&keys); err != nil {
			return r, err
		}
		if keys >= c.jobs || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	time.Sleep(c.lease + time.Second) // late duplicates, if any, land now
	stopDispatch()
	dwg.Wait()

	rows, err := pool.Query(ctx, "SELECT key, count(*), max(at) FROM effects GROUP BY key")
	if err != nil {
		return r, err
	}
	defer rows.Close()
	seen := map[string]int{}
	for rows.Next() {
		var k string
		var n int
		var at time.Time
		if err := rows.Scan(&k, &n, &at); err != nil {
			return r, err
		}
		seen[k] = n
		r.rows += n
		if n > 1 {
			r.twice++
		}
		if late := at.Sub(due[k]); late > r.lastDone {
			r.lastDone = late
		}
	}
	for id := range due {
		if seen[id] == 0 {
			r.lost++
		}
	}
	// Runs whose transaction met the done row: their Redis record was gone
	// (the rollback) or never written (a kill before Complete).
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM skips").Scan(&r.dbSkips); err != nil {
		return r, err
	}
	return r, rows.Err()
}

func open(url, schema string) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	cfg.MaxConns = 24
	return pgxpool.NewWithConfig(context.Background(), cfg)
}

// worker is one asynq server process: the quick start's shape, with a
// handler that writes one row to PostgreSQL.
func worker() {
	lease, _ := time.ParseDuration(os.Getenv("PGCHAOS_LEASE"))
	complete := os.Getenv("PGCHAOS_MODE") == "complete"
	pool, err := open(os.Getenv("PGCHAOS_PG"), os.Getenv("PGCHAOS_SCHEMA"))
	if err != nil {
		panic(err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: os.Getenv("PGCHAOS_REDIS"), MaxRetries: 2, DialTimeout: 500 * time.Millisecond})
	idem, err := zclaim.NewIdempotency(rdb, zclaim.IdempotencyOptions{Lease: lease, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		panic(err)
	}
	mux := asynq.NewServeMux()
	mux.Use(idem.Middleware())
	mux.HandleFunc("effect", func(ctx context.Context, t *asynq.Task) error {
		job, _ := zclaim.JobFromContext(ctx)
		write := func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, "INSERT INTO effects (key) VALUES ($1)", job.ID)
			time.Sleep(time.Duration(rand.IntN(30)) * time.Millisecond)
			return err
		}
		var err error
		if complete {
			err = zclaimpg.InTx(ctx, pool, pgx.TxOptions{}, write)
			if errors.Is(err, zclaim.ErrAlreadyDone) {
				pool.Exec(context.WithoutCancel(ctx), "INSERT INTO skips (key) VALUES ($1)", job.ID)
			}
		} else {
			err = pgx.BeginFunc(ctx, pool, write)
		}
		// A SIGKILL here is a crash after the commit, before Complete.
		time.Sleep(time.Duration(rand.IntN(30)) * time.Millisecond)
		return err
	})
	srv := asynq.NewServerFromRedisClient(rdb, asynq.Config{
		Queues: map[string]int{"pgchaos": 1}, Concurrency: 10,
		TaskCheckInterval: 10 * time.Millisecond, DelayedTaskCheckInterval: 200 * time.Millisecond,
		IsFailure: zclaim.IsFailure, RetryDelayFunc: zclaim.RetryDelay,
		ShutdownTimeout: time.Second, LogLevel: asynq.FatalLevel,
	})
	if err := srv.Run(mux); err != nil {
		panic(err)
	}
}
