// Command pgbench measures what zclaimpg costs a handler: the same
// transaction (one INSERT) with and without zclaimpg.Complete, each under
// the idempotency middleware, and the transaction without the middleware,
// alone and between two plain Redis commands (what the middleware costs
// such a handler, and the least a middleware costs it), side by side in
// interleaved rounds; and the size of the done table per finished run.
// make bench appends its tables to bench/RESULTS.md.
//
//	go run ./internal/pgbench
//
// Exit codes: 0 done, 1 a run failed (no PostgreSQL or redis-server to
// be had, a task that failed), 2 bad flags (checked before anything starts).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/zclaim/zclaim"
	"github.com/zclaim/zclaim/internal/pgproc"
	"github.com/zclaim/zclaim/internal/redisproc"
	"github.com/zclaim/zclaim/zclaimpg"
)

func main() {
	rounds := flag.Int("rounds", 21, "interleaved rounds")
	per := flag.Duration("for", time.Second, "each contender's time in a round")
	conc := flag.Int("c", 16, "handlers at once")
	rowsN := flag.Int("rows", 100000, "done rows for the size measurement")
	flag.Parse()
	if err := checkFlags(*rounds, *per, *conc, *rowsN, flag.Args()); err != nil {
		fmt.Fprintln(os.Stderr, "pgbench:", err)
		os.Exit(2)
	}
	if err := run(*rounds, *per, *conc, *rowsN); err != nil {
		fmt.Fprintln(os.Stderr, "pgbench:", err)
		os.Exit(1)
	}
}

// checkFlags refuses, before anything starts, what no run can measure.
func checkFlags(rounds int, per time.Duration, conc, rowsN int, args []string) error {
	switch {
	case len(args) > 0:
		return fmt.Errorf("unexpected arguments %q (flags only; -h lists them)", args)
	case rounds < 1:
		return fmt.Errorf("-rounds must be at least 1, not %d", rounds)
	case per <= 0:
		return fmt.Errorf("-for must be positive, not %v", per)
	case conc < 1:
		return fmt.Errorf("-c must be at least 1, not %d", conc)
	case rowsN < 1:
		return fmt.Errorf("-rows must be at least 1, not %d", rowsN)
	}
	return nil
}

func run(rounds int, per time.Duration, conc, rowsN int) error {
	ctx := context.Background()
	pg, err := pgproc.Find()
	if err != nil {
		return fmt.Errorf("%s (%v)", pgproc.Install, err)
	}
	defer pg.Close()
	rs, err := redisproc.Start()
	if err != nil {
		return err
	}
	defer rs.Close()
	admin, err := pgxpool.New(ctx, pg.URL)
	if err != nil {
		return err
	}
	defer admin.Close()
	schema := pgproc.SchemaName("pgbench")
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		return err
	}
	defer admin.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE")
	cfg, err := pgxpool.ParseConfig(pg.URL)
	if err != nil {
		return err
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	cfg.MaxConns = int32(conc)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := zclaimpg.Migrate(ctx, pool); err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE reminders (id bigserial PRIMARY KEY, key text NOT NULL, body text NOT NULL,
		created_at timestamptz NOT NULL DEFAULT now()) WITH (autovacuum_enabled = false);
		ALTER TABLE zclaim_done SET (autovacuum_enabled = false)`); err != nil {
		return err
	}
	rdb := redis.NewClient(&redis.Options{Addr: rs.Addr, PoolSize: conc * 2})
	defer rdb.Close()
	var seq atomic.Int64
	nextKey := func() string { return "order-" + strconv.FormatInt(seq.Add(1), 10) + "@2026-12-01T08:00:00.000Z" }
	idem, err := zclaim.NewIdempotency(rdb, zclaim.IdempotencyOptions{Logger: slog.New(slog.DiscardHandler),
		Key: func(context.Context, *asynq.Task) (string, error) { return nextKey(), nil }})
	if err != nil {
		return err
	}
	write := func(ctx context.Context, key string) func(pgx.Tx) error {
		return func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, "INSERT INTO reminders (key, body) VALUES ($1, 'a reminder')", key)
			return err
		}
	}
	runKey := func(ctx context.Context) string {
		e, _ := zclaim.ExecutionFromContext(ctx)
		return e.Key
	}
	contenders := []struct {
		name string
		h    asynq.Handler
	}{
		{"the transaction alone", idem.Middleware()(asynq.HandlerFunc(func(ctx context.Context, _ *asynq.Task) error {
			return pgx.BeginFunc(ctx, pool, write(ctx, runKey(ctx)))
		}))},
		{"the transaction + `zclaimpg.Complete` (`InTx`)", idem.Middleware()(asynq.HandlerFunc(func(ctx context.Context, _ *asynq.Task) error {
			return zclaimpg.InTx(ctx, pool, pgx.TxOptions{}, write(ctx, runKey(ctx)))
		}))},
		{"the transaction alone, without the middleware", asynq.HandlerFunc(func(ctx context.Context, _ *asynq.Task) error {
			return pgx.BeginFunc(ctx, pool, write(ctx, nextKey()))
		})},
		// The least a middleware that records each run's start and finish
		// sends: one plain command before the handler, one after.
		{"the transaction between a plain `SET NX GET` and a plain `SET`, without the middleware",
			asynq.HandlerFunc(func(ctx context.Context, _ *asynq.Task) error {
				key := nextKey()
				if err := rdb.SetArgs(ctx, "floor:"+key, "run", redis.SetArgs{Mode: "NX", Get: true, TTL: time.Minute}).Err(); err != nil && !errors.Is(err, redis.Nil) {
					return err
				}
				if err := pgx.BeginFunc(ctx, pool, write(ctx, key)); err != nil {
					return err
				}
				return rdb.Set(ctx, "floor:"+key, "done", time.Minute).Err()
			})},
	}
	rates := make([][]float64, len(contenders))
	// Per round: Complete's ratio (1 to 0), the middleware's (0 to 2), the
	// floor's (3 to 2).
	var ratios, bare, floor []float64
	for r := range rounds {
		rr := make([]float64, len(contenders))
		// Each round starts with another, so that none always meets the
		// others' autovacuum or checkpoint.
		for k := range contenders {
			i := (r + k) % len(contenders)
			n, failed, err := drive(contenders[i].h, conc, per)
			if failed > 0 {
				return fmt.Errorf("%s: %d of %d tasks failed, the first: %w", contenders[i].name, failed, n+failed, err)
			}
			rr[i] = float64(n) / per.Seconds()
			rates[i] = append(rates[i], rr[i])
		}
		ratios = append(ratios, rr[1]/rr[0])
		bare = append(bare, rr[0]/rr[2])
		floor = append(floor, rr[3]/rr[2])
	}
	var sync string
	pool.QueryRow(ctx, "SHOW synchronous_commit").Scan(&sync)
	fmt.Printf("### zclaimpg: a handler's transaction with and without Complete\n\n")
	fmt.Printf("%d handlers at once, each one transaction with one INSERT into a table with a bigserial primary key, on PostgreSQL at 127.0.0.1 "+
		"(synchronous_commit %s; autovacuum off on both tables, so that no round meets it), under the idempotency middleware (its Begin and Complete on Redis) "+
		"and, in the last two rows, without it (the last between the two plain commands a middleware that records each run's start and finish sends at least); "+
		"called straight, with no asynq server; %d rounds of %v each, each round starting with another; median over rounds.\n\n",
		conc, sync, rounds, per)
	fmt.Println("| handler | transactions/s | ratio |")
	fmt.Println("|---|---|---|")
	for i, c := range contenders {
		ratio := "1.00×"
		switch i {
		case 1:
			ratio = fmt.Sprintf("**%.2f×** the transaction alone (rounds %.2f–%.2f)", median(ratios), slices.Min(ratios), slices.Max(ratios))
		case 2:
			ratio = fmt.Sprintf("the transaction alone under the middleware ran **%.2f×** this (rounds %.2f–%.2f)", median(bare), slices.Min(bare), slices.Max(bare))
		case 3:
			ratio = fmt.Sprintf("**%.2f×** the transaction without the middleware (rounds %.2f–%.2f)", median(floor), slices.Min(floor), slices.Max(floor))
		}
		fmt.Printf("| %s | %.0f | %s |\n", c.name, median(rates[i]), ratio)
	}

	// The done table's size per finished run: keys shaped as occurrence
	// names (a 10-byte id and its due time), as Complete writes them.
	if _, err := pool.Exec(ctx, "TRUNCATE zclaim_done"); err != nil {
		return err
	}
	var before int64
	pool.QueryRow(ctx, "SELECT pg_total_relation_size('zclaim_done')").Scan(&before)
	if _, err := pool.Exec(ctx, `INSERT INTO zclaim_done (key, token)
		SELECT 'order-' || lpad(g::text, 6, '0') || '@2026-12-01T08:00:00.000Z', 1796112000000000 + g
		FROM generate_series(1, $1::int) g`, rowsN); err != nil {
		return err
	}
	var after int64
	pool.QueryRow(ctx, "SELECT pg_total_relation_size('zclaim_done')").Scan(&after)
	fmt.Printf("\n### zclaimpg: the done table per finished run\n\n")
	fmt.Printf("%d rows with 36-byte keys (`order-000042@2026-12-01T08:00:00.000Z`): table and both indexes grew by %.1f MB, **%.0f B per finished run**; "+
		"Prune deletes rows past MaxAge (default 7 days), so the table holds finish rate × MaxAge rows.\n",
		rowsN, float64(after-before)/1e6, float64(after-before)/float64(rowsN))
	return nil
}

// drive runs h from conc goroutines for d and returns how many tasks
// succeeded, how many failed, and the first failure.
func drive(h asynq.Handler, conc int, d time.Duration) (ok, failed int64, first error) {
	var n, bad atomic.Int64
	var once sync.Once
	var wg sync.WaitGroup
	stop := time.Now().Add(d)
	for range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(stop) {
				if err := h.ProcessTask(context.Background(), asynq.NewTask("reminder", nil)); err != nil {
					bad.Add(1)
					once.Do(func() { first = err })
				} else {
					n.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	return n.Load(), bad.Load(), first
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
