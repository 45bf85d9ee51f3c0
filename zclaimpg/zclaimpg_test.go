package zclaimpg_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/zclaim/zclaim"
	"github.com/zclaim/zclaim/internal/wait"
	"github.com/zclaim/zclaim/zclaimpg"
)

// pgxHandler inserts an effect row and completes the occurrence in one
// pgx transaction (InTx), or, as the control, commits without Complete.
func pgxHandler(b *bundle, withComplete bool, hold time.Duration) asynq.Handler {
	return asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
		work := func(tx pgx.Tx) error {
			err := insert(ctx, func(ctx context.Context, q string, args ...any) error {
				_, err := tx.Exec(ctx, q, args...)
				return err
			})
			time.Sleep(hold) // widen the window in which runs overlap
			return err
		}
		if !withComplete {
			return pgx.BeginFunc(ctx, b.pool, work)
		}
		return zclaimpg.InTx(ctx, b.pool, pgx.TxOptions{}, work)
	})
}

// sqlHandler is pgxHandler through database/sql.
func sqlHandler(b *bundle, withComplete bool, hold time.Duration) asynq.Handler {
	return asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
		work := func(tx *sql.Tx) error {
			err := insert(ctx, func(ctx context.Context, q string, args ...any) error {
				_, err := tx.ExecContext(ctx, q, args...)
				return err
			})
			time.Sleep(hold)
			return err
		}
		if !withComplete {
			tx, err := b.db.BeginTx(ctx, nil)
			if err != nil {
				return err
			}
			if err := work(tx); err != nil {
				tx.Rollback()
				return err
			}
			return tx.Commit()
		}
		return zclaimpg.InSQLTx(ctx, b.db, nil, work)
	})
}

var paths = []struct {
	name    string
	handler func(b *bundle, withComplete bool, hold time.Duration) asynq.Handler
}{{"pgx", pgxHandler}, {"database-sql", sqlHandler}}

// A redelivery after Redis forgot a finished run begins afresh in Redis,
// but its transaction meets the done row: it rolls back, the task succeeds
// as skipped, and one row stands.
func TestRedeliveryAfterRedisForgot(t *testing.T) {
	t.Parallel()
	for _, p := range paths {
		t.Run(p.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			idem := b.idem(t, "", zclaim.IdempotencyOptions{})
			h := idem.Middleware()(p.handler(b, true, 0))
			must(t, deliver(h, "order-1"))
			b.forget()
			must(t, deliver(h, "order-1"))
			if got := b.effects(t); got["order-1"] != 1 {
				t.Fatalf("effects %v, want order-1 once", got)
			}
			if s := idem.Stats(); s.Completed != 1 || s.Skipped != 1 {
				t.Fatalf("stats %+v, want 1 completed and 1 skipped", s)
			}
			// The skip completed the record again: a third delivery is
			// skipped by Redis alone, before the database.
			must(t, deliver(h, "order-1"))
			if s := idem.Stats(); s.Skipped != 2 {
				t.Fatalf("stats %+v, want 2 skipped", s)
			}
		})
	}
}

// 30 keys, 4 deliveries each (two at once, then two at once), while a
// goroutine keeps deleting the run records (for 40 passes) and the whole store is flushed
// between the pairs: with Complete each effect happens exactly once; the
// control without it applies effects again (so the test can fail).
func TestEffectsOnceWhileRedisForgets(t *testing.T) {
	t.Parallel()
	for _, p := range paths {
		for _, withComplete := range []bool{true, false} {
			name := p.name + "/complete"
			if !withComplete {
				name = p.name + "/control"
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				b := setup(t)
				idem := b.idem(t, "", zclaim.IdempotencyOptions{})
				h := idem.Middleware()(p.handler(b, withComplete, 3*time.Millisecond))
				stop := make(chan struct{})
				var deleterDone sync.WaitGroup
				deleterDone.Add(1)
				// The deleter makes a bounded number of passes, so that
				// every delivery gets through in the end, as asynq's
				// retries do.
				go func() {
					defer deleterDone.Done()
					for range 40 {
						select {
						case <-stop:
							return
						default:
						}
						b.forget()
						time.Sleep(5 * time.Millisecond)
					}
				}()
				const keys = 30
				var (
					mu     sync.Mutex
					failed error
				)
				pair := func() {
					var wg sync.WaitGroup
					for k := range keys {
						for range 2 {
							wg.Add(1)
							go func() {
								defer wg.Done()
								if err := deliver(h, fmt.Sprintf("job-%d", k)); err != nil {
									mu.Lock()
									failed = err
									mu.Unlock()
								}
							}()
						}
					}
					wg.Wait()
				}
				pair()
				b.forget() // the flush: every record of the store is gone
				pair()
				close(stop)
				deleterDone.Wait()
				if failed != nil {
					t.Fatalf("a delivery failed: %v", failed)
				}
				got := b.effects(t)
				total := 0
				for _, n := range got {
					total += n
				}
				if len(got) != keys {
					t.Fatalf("%d keys have effects, want %d", len(got), keys)
				}
				if withComplete && total != keys {
					t.Fatalf("%d effects for %d keys, want each once: %v", total, keys, got)
				}
				// After the flush every key ran again in the control.
				if !withComplete && total < 2*keys {
					t.Fatalf("control: %d effects for %d keys, want at least %d", total, keys, 2*keys)
				}
			})
		}
	}
}

// Concurrent runs of one key that all got past Redis (each store has a
// prefix of its own): exactly one commits, the others wait on its row and
// get ErrAlreadyDone, never a unique violation.
func TestConcurrentRunsOneCommits(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const n = 8
	start := make(chan struct{})
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		idem := b.idem(t, fmt.Sprintf("%d:", r), zclaim.IdempotencyOptions{})
		h := idem.Middleware()(asynq.HandlerFunc(func(ctx context.Context, _ *asynq.Task) error {
			errs[r] = zclaimpg.InTx(ctx, b.pool, pgx.TxOptions{}, func(tx pgx.Tx) error {
				<-start
				_, err := tx.Exec(ctx, "INSERT INTO effects (key) VALUES ('k')")
				return err
			})
			return errs[r]
		}))
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := deliver(h, "k"); err != nil {
				t.Errorf("delivery %d: %v", r, err)
			}
		}()
	}
	close(start)
	wg.Wait()
	commits := 0
	for r, err := range errs {
		switch {
		case err == nil:
			commits++
		case !errors.Is(err, zclaim.ErrAlreadyDone):
			t.Fatalf("run %d: %v, want nil or ErrAlreadyDone", r, err)
		}
	}
	if got := b.effects(t)["k"]; commits != 1 || got != 1 {
		t.Fatalf("%d commits, %d rows; want 1 and 1", commits, got)
	}
}

// A resource written by a later run refuses an earlier run's write with
// ErrLeaseLost; the same run may write it again; and the refused
// transaction leaves nothing.
func TestFenceRefusesStaleToken(t *testing.T) {
	t.Parallel()
	for _, p := range []string{"pgx", "database-sql"} {
		t.Run(p, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			_, err := b.pool.Exec(ctx, "CREATE TABLE accounts (id text PRIMARY KEY, balance int NOT NULL); INSERT INTO accounts VALUES ('acct-1', 0)")
			must(t, err)
			credit := func(ctx context.Context) error {
				if p == "pgx" {
					return pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
						if err := zclaimpg.Fence(ctx, tx, "acct-1"); err != nil {
							return err
						}
						_, err := tx.Exec(ctx, "UPDATE accounts SET balance = balance + 1 WHERE id = 'acct-1'")
						return err
					})
				}
				tx, err := b.db.BeginTx(ctx, nil)
				if err != nil {
					return err
				}
				defer tx.Rollback()
				if err := zclaimpg.FenceSQL(ctx, tx, "acct-1"); err != nil {
					return err
				}
				if _, err := tx.ExecContext(ctx, "UPDATE accounts SET balance = balance + 1 WHERE id = 'acct-1'"); err != nil {
					return err
				}
				return tx.Commit()
			}
			// The stale run began first (smaller token) and writes last. Both
			// leases are long: a loaded machine that held back a renewal of
			// the harness's 1 s would cancel a handler (ErrLeaseLost) before
			// the fence is asked.
			long := zclaim.IdempotencyOptions{Lease: 10 * time.Second}
			began, write, wrote := make(chan struct{}), make(chan struct{}), make(chan error, 1)
			stale := b.idem(t, "a:", long).Middleware()(
				asynq.HandlerFunc(func(ctx context.Context, _ *asynq.Task) error {
					close(began)
					<-write
					err := credit(ctx)
					wrote <- err
					return err
				}))
			go stale.ProcessTask(ctx, asynq.NewTask("effect", []byte("job-a"))) // once: its error is the point
			wait.Recv(t, began, 30*time.Second, "the stale run's handler to start")
			time.Sleep(2 * time.Millisecond) // tokens are Redis TIME in µs: the next is larger
			var again error
			fresh := b.idem(t, "b:", long).Middleware()(
				asynq.HandlerFunc(func(ctx context.Context, _ *asynq.Task) error {
					if err := credit(ctx); err != nil {
						return err
					}
					again = credit(ctx) // the same token again
					return nil
				}))
			must(t, deliver(fresh, "job-b"))
			must(t, again)
			close(write)
			if err := wait.Recv(t, wrote, 30*time.Second, "the stale run's write"); !errors.Is(err, zclaim.ErrLeaseLost) {
				t.Fatalf("stale write: %v, want ErrLeaseLost", err)
			}
			var bal int
			must(t, b.pool.QueryRow(ctx, "SELECT balance FROM accounts").Scan(&bal))
			if bal != 2 {
				t.Fatalf("balance %d, want 2 (the fresh run's two credits only)", bal)
			}
		})
	}
}

// Outside the middleware there is no occurrence: a clear error, nothing
// written.
func TestNoExecution(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ran := false
	err := zclaimpg.InTx(ctx, b.pool, pgx.TxOptions{}, func(pgx.Tx) error { ran = true; return nil })
	if !errors.Is(err, zclaimpg.ErrNoExecution) || ran {
		t.Fatalf("InTx: %v (ran %v), want ErrNoExecution without running", err, ran)
	}
	err = zclaimpg.InSQLTx(ctx, b.db, nil, func(*sql.Tx) error { ran = true; return nil })
	if !errors.Is(err, zclaimpg.ErrNoExecution) || ran {
		t.Fatalf("InSQLTx: %v (ran %v), want ErrNoExecution without running", err, ran)
	}
	must(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		if err := zclaimpg.Complete(ctx, tx); !errors.Is(err, zclaimpg.ErrNoExecution) {
			t.Errorf("Complete: %v", err)
		}
		if err := zclaimpg.Fence(ctx, tx, "r"); !errors.Is(err, zclaimpg.ErrNoExecution) {
			t.Errorf("Fence: %v", err)
		}
		return nil
	}))
	var n int
	must(t, b.pool.QueryRow(ctx, "SELECT count(*) FROM zclaim_done").Scan(&n))
	if n != 0 {
		t.Fatalf("%d done rows, want 0", n)
	}
}

// Migrate from many replicas at once, and again: no error, nothing changes.
func TestMigrateConcurrentAndAgain(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, err := b.pool.Exec(ctx, "INSERT INTO zclaim_done (key, token) VALUES ('kept', 1)")
	must(t, err)
	var wg sync.WaitGroup
	errs := make(chan error, 10)
	for range 5 {
		wg.Add(2)
		go func() { defer wg.Done(); errs <- zclaimpg.Migrate(ctx, b.pool) }()
		go func() { defer wg.Done(); errs <- zclaimpg.MigrateSQL(ctx, b.db) }()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		must(t, err)
	}
	ok, err := zclaimpg.Done(ctx, b.pool, "kept")
	if err != nil || !ok {
		t.Fatalf("Done(kept) = %v, %v after Migrate again; want true", ok, err)
	}
}

// A handler that sees Execution.Resumed knows an earlier run of its key
// began and did not complete.
func TestResumedAfterDeadRun(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// A run that began and whose worker died: Begin, then silence.
	dead := b.idem(t, "", zclaim.IdempotencyOptions{Lease: 30 * time.Millisecond})
	if _, err := dead.Begin(ctx, "job-r"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(40 * time.Millisecond)
	// The live process: a lease that a loaded machine cannot lose.
	idem := b.idem(t, "", zclaim.IdempotencyOptions{Lease: 5 * time.Second})
	var resumed []bool
	h := idem.Middleware()(asynq.HandlerFunc(func(ctx context.Context, _ *asynq.Task) error {
		e, _ := zclaim.ExecutionFromContext(ctx)
		resumed = append(resumed, e.Resumed)
		return zclaimpg.InTx(ctx, b.pool, pgx.TxOptions{}, func(pgx.Tx) error { return nil })
	}))
	must(t, deliver(h, "job-r"))
	must(t, deliver(h, "job-fresh"))
	if len(resumed) != 2 || !resumed[0] || resumed[1] {
		t.Fatalf("Resumed %v, want [true false]", resumed)
	}
}

// Prune deletes rows past MaxAge in batches and keeps the rest.
func TestPrune(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, err := b.pool.Exec(ctx, `INSERT INTO zclaim_done (key, token, done_at)
		SELECT 'old-' || g, g, now() - interval '2 hours' FROM generate_series(1, 2500) g`)
	must(t, err)
	_, err = b.pool.Exec(ctx, `INSERT INTO zclaim_done (key, token) SELECT 'new-' || g, g FROM generate_series(1, 10) g`)
	must(t, err)
	n, err := zclaimpg.Prune(ctx, b.pool, zclaimpg.PruneOptions{MaxAge: time.Hour, Batch: 1000})
	must(t, err)
	var left int
	must(t, b.pool.QueryRow(ctx, "SELECT count(*) FROM zclaim_done").Scan(&left))
	if n != 2500 || left != 10 {
		t.Fatalf("pruned %d, %d left; want 2500 and 10", n, left)
	}
	if _, err := zclaimpg.Prune(ctx, b.pool, zclaimpg.PruneOptions{Batch: -1}); err == nil {
		t.Fatal("Prune with Batch -1: no error")
	}
	// A loop prunes until its context ends.
	_, err = b.pool.Exec(ctx, `INSERT INTO zclaim_done (key, token, done_at) VALUES ('old-again', 1, now() - interval '2 hours')`)
	must(t, err)
	lctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	must(t, zclaimpg.PruneLoop(lctx, b.pool, zclaimpg.PruneOptions{MaxAge: time.Hour, Interval: 10 * time.Millisecond}))
	if ok, _ := zclaimpg.Done(ctx, b.pool, "old-again"); ok {
		t.Fatal("PruneLoop left an old row")
	}
}

// However fn uses the transaction (an Exec first, a query first, a batch,
// nothing at all, or swallowing the error of its first Exec), a duplicate
// run gets ErrAlreadyDone and none of its writes stands. A run that the
// middleware cancels because a loaded machine held its lease's renewal
// back (ErrLeaseLost) rolls back and is delivered again.
func TestInTxShapes(t *testing.T) {
	t.Parallel()
	write := func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, "INSERT INTO effects (key) VALUES ($1)", "w")
		return err
	}
	shapes := map[string]func(ctx context.Context, tx pgx.Tx) error{
		"exec first": write,
		"query first": func(ctx context.Context, tx pgx.Tx) error {
			var one int
			if err := tx.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil {
				return err
			}
			return write(ctx, tx)
		},
		"batch": func(ctx context.Context, tx pgx.Tx) error {
			b := &pgx.Batch{}
			b.Queue("INSERT INTO effects (key) VALUES ($1)", "w")
			return tx.SendBatch(ctx, b).Close()
		},
		"exec without arguments": func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, "INSERT INTO effects (key) VALUES ('w'); INSERT INTO effects (key) VALUES ('w2')")
			return err
		},
		"nothing": func(context.Context, pgx.Tx) error { return nil },
		"swallows the error": func(ctx context.Context, tx pgx.Tx) error {
			write(ctx, tx)
			return nil
		},
	}
	for name, fn := range shapes {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			idem := b.idem(t, "", zclaim.IdempotencyOptions{})
			var errs []error
			lost := 0
			h := idem.Middleware()(asynq.HandlerFunc(func(ctx context.Context, _ *asynq.Task) error {
				err := zclaimpg.InTx(ctx, b.pool, pgx.TxOptions{}, func(tx pgx.Tx) error { return fn(ctx, tx) })
				if err != nil && errors.Is(context.Cause(ctx), zclaim.ErrLeaseLost) {
					lost++
					return err
				}
				errs = append(errs, err)
				return err
			}))
			must(t, deliver(h, "k"))
			b.forget()
			must(t, deliver(h, "k"))
			if len(errs) != 2 || errs[0] != nil || !errors.Is(errs[1], zclaim.ErrAlreadyDone) {
				t.Fatalf("InTx: %v (and %d runs cancelled for a lost lease), want nil then ErrAlreadyDone", errs, lost)
			}
			rows := b.effects(t)
			if name == "nothing" && len(rows) != 0 || name != "nothing" && rows["w"] != 1 {
				t.Fatalf("effects %v", rows)
			}
			ok, err := zclaimpg.Done(ctx, b.pool, "k")
			if err != nil || !ok {
				t.Fatalf("done row: %v %v", ok, err)
			}
		})
	}
}

// A duplicate run stops at fn's first call on the transaction, whichever
// it is: that call returns ErrAlreadyDone, before it sends anything of
// fn's (the done row goes first). The first run's call goes through.
func TestInTxStopsAtFirstCall(t *testing.T) {
	t.Parallel()
	calls := map[string]func(ctx context.Context, tx pgx.Tx) error{
		"Exec": func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, "INSERT INTO effects (key) VALUES ($1)", "w")
			return err
		},
		"Query": func(ctx context.Context, tx pgx.Tx) error {
			rows, err := tx.Query(ctx, "SELECT 1")
			if err != nil {
				return err
			}
			rows.Close()
			return rows.Err()
		},
		"QueryRow": func(ctx context.Context, tx pgx.Tx) error {
			var one int
			return tx.QueryRow(ctx, "SELECT 1").Scan(&one)
		},
		"SendBatch": func(ctx context.Context, tx pgx.Tx) error {
			b := &pgx.Batch{}
			b.Queue("INSERT INTO effects (key) VALUES ($1)", "w")
			br := tx.SendBatch(ctx, b)
			_, err := br.Exec()
			if cerr := br.Close(); err == nil {
				err = cerr
			}
			return err
		},
		"CopyFrom": func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.CopyFrom(ctx, pgx.Identifier{"effects"}, []string{"key"}, pgx.CopyFromRows([][]any{{"w"}}))
			return err
		},
		"Prepare": func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Prepare(ctx, "ins", "INSERT INTO effects (key) VALUES ($1)")
			return err
		},
		"Begin (a savepoint)": func(ctx context.Context, tx pgx.Tx) error {
			sp, err := tx.Begin(ctx)
			if err != nil {
				return err
			}
			return sp.Commit(ctx)
		},
	}
	for name, call := range calls {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			idem := b.idem(t, "", zclaim.IdempotencyOptions{})
			var first []error
			h := idem.Middleware()(asynq.HandlerFunc(func(ctx context.Context, _ *asynq.Task) error {
				return zclaimpg.InTx(ctx, b.pool, pgx.TxOptions{}, func(tx pgx.Tx) error {
					err := call(ctx, tx)
					// A run cancelled for a lease a loaded machine held
					// back is delivered again (as in TestInTxShapes).
					if !errors.Is(context.Cause(ctx), zclaim.ErrLeaseLost) {
						first = append(first, err)
					}
					return err
				})
			}))
			must(t, deliver(h, "k"))
			b.forget()
			err := deliver(h, "k")
			if len(first) != 2 || first[0] != nil || !errors.Is(first[1], zclaim.ErrAlreadyDone) || err != nil {
				t.Fatalf("%s's error in the first run, then in the duplicate: %v; the duplicate's task: %v; "+
					"want nil, then ErrAlreadyDone (the task skipped)", name, first, err)
			}
		})
	}
}

// A panic in fn rolls the transaction back, done row included, and gives
// its connection back before it goes on (the middleware releases the run
// and passes the panic to asynq). The next delivery of the task then runs
// and commits; behind a leaked transaction it would wait for the
// uncommitted done row until its context ended.
func TestPanicRollsBack(t *testing.T) {
	t.Parallel()
	for _, path := range []string{"pgx", "database-sql"} {
		t.Run(path, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			idem := b.idem(t, "", zclaim.IdempotencyOptions{})
			// The transactions' own connections: a leaked one is ended
			// here rather than left to hang the test's cleanup.
			pgxDB := &lastTx{Pool: b.pool}
			cfg, err := pgx.ParseConfig(pgURL)
			must(t, err)
			cfg.RuntimeParams["search_path"] = b.schema
			cfg.RuntimeParams["application_name"] = b.schema
			sqlDB := stdlib.OpenDB(*cfg)
			t.Cleanup(func() { sqlDB.Close() })
			var panics atomic.Bool
			panics.Store(true)
			work := func(exec func(q string, args ...any) error) error {
				if err := exec("INSERT INTO effects (key) VALUES ($1)", "w"); err != nil {
					return err
				}
				if panics.Load() {
					panic("zclaimpg test: the handler panicked")
				}
				return nil
			}
			h := idem.Middleware()(asynq.HandlerFunc(func(ctx context.Context, _ *asynq.Task) error {
				// A context that outlives the handler: database/sql rolls
				// back a transaction whose context ends, which the
				// middleware's does when the handler returns.
				ctx = context.WithoutCancel(ctx)
				if path == "pgx" {
					return zclaimpg.InTx(ctx, pgxDB, pgx.TxOptions{}, func(tx pgx.Tx) error {
						return work(func(q string, args ...any) error { _, err := tx.Exec(ctx, q, args...); return err })
					})
				}
				return zclaimpg.InSQLTx(ctx, sqlDB, nil, func(tx *sql.Tx) error {
					return work(func(q string, args ...any) error { _, err := tx.ExecContext(ctx, q, args...); return err })
				})
			}))
			func() {
				defer func() {
					if recover() == nil {
						t.Fatal("the panic did not go on to asynq")
					}
				}()
				h.ProcessTask(ctx, asynq.NewTask("effect", []byte("k")))
			}()
			if n, m := b.pool.Stat().AcquiredConns(), sqlDB.Stats().InUse; n != 0 || m != 0 {
				if pgxDB.tx != nil {
					pgxDB.tx.Rollback(ctx)
				}
				admin.Exec(ctx, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1", b.schema)
				t.Fatalf("after the panic: %d connections of the pool acquired, %d of database/sql in use; want 0", n, m)
			}
			panics.Store(false)
			dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			if err := h.ProcessTask(dctx, asynq.NewTask("effect", []byte("k"))); err != nil {
				t.Fatalf("the next delivery: %v", err)
			}
			if rows := b.effects(t); rows["w"] != 1 {
				t.Fatalf("effects %v, want one of the run that committed", rows)
			}
		})
	}
}

// lastTx is a pool that keeps the last transaction it began.
type lastTx struct {
	*pgxpool.Pool
	tx pgx.Tx
}

func (l *lastTx) BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error) {
	tx, err := l.Pool.BeginTx(ctx, opts)
	l.tx = tx
	return tx, err
}
