package zclaimpg_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/hibiken/asynq"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/zclaim/zclaim"
	"github.com/zclaim/zclaim/internal/logbuf"
	"github.com/zclaim/zclaim/internal/pgproc"
	"github.com/zclaim/zclaim/zclaimpg"
)

// Complete twice in one transaction, and Complete inside InTx's function
// (which completes already), pgx and database/sql alike: the effect
// commits once and the task counts as completed, not skipped. The done
// row of a savepoint rolled back goes with it, and a Complete after it
// writes it again.
func TestCompleteTwiceInTx(t *testing.T) {
	t.Parallel()
	handlers := map[string]func(b *bundle) asynq.HandlerFunc{
		"pgx Complete twice": func(b *bundle) asynq.HandlerFunc {
			return func(ctx context.Context, _ *asynq.Task) error {
				return pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
					if err := insert(ctx, func(ctx context.Context, q string, a ...any) error { _, err := tx.Exec(ctx, q, a...); return err }); err != nil {
						return err
					}
					if err := zclaimpg.Complete(ctx, tx); err != nil {
						return err
					}
					return zclaimpg.Complete(ctx, tx)
				})
			}
		},
		"pgx Complete inside InTx": func(b *bundle) asynq.HandlerFunc {
			return func(ctx context.Context, _ *asynq.Task) error {
				return zclaimpg.InTx(ctx, b.pool, pgx.TxOptions{}, func(tx pgx.Tx) error {
					if err := zclaimpg.Complete(ctx, tx); err != nil { // before the effect: the done row is pending
						return err
					}
					if err := insert(ctx, func(ctx context.Context, q string, a ...any) error { _, err := tx.Exec(ctx, q, a...); return err }); err != nil {
						return err
					}
					return zclaimpg.Complete(ctx, tx)
				})
			}
		},
		"pgx savepoint rolled back": func(b *bundle) asynq.HandlerFunc {
			return func(ctx context.Context, _ *asynq.Task) error {
				return pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
					sp, err := tx.Begin(ctx)
					if err != nil {
						return err
					}
					if err := zclaimpg.Complete(ctx, sp); err != nil {
						return err
					}
					if err := sp.Rollback(ctx); err != nil {
						return err
					}
					if err := insert(ctx, func(ctx context.Context, q string, a ...any) error { _, err := tx.Exec(ctx, q, a...); return err }); err != nil {
						return err
					}
					return zclaimpg.Complete(ctx, tx)
				})
			}
		},
		"database/sql CompleteSQL twice": func(b *bundle) asynq.HandlerFunc {
			return func(ctx context.Context, _ *asynq.Task) error {
				tx, err := b.db.BeginTx(ctx, nil)
				if err != nil {
					return err
				}
				defer tx.Rollback()
				if err := zclaimpg.CompleteSQL(ctx, tx); err != nil {
					return err
				}
				if err := insert(ctx, func(ctx context.Context, q string, a ...any) error {
					_, err := tx.ExecContext(ctx, q, a...)
					return err
				}); err != nil {
					return err
				}
				if err := zclaimpg.CompleteSQL(ctx, tx); err != nil {
					return err
				}
				return tx.Commit()
			}
		},
		"database/sql CompleteSQL inside InSQLTx": func(b *bundle) asynq.HandlerFunc {
			return func(ctx context.Context, _ *asynq.Task) error {
				return zclaimpg.InSQLTx(ctx, b.db, nil, func(tx *sql.Tx) error {
					if err := insert(ctx, func(ctx context.Context, q string, a ...any) error {
						_, err := tx.ExecContext(ctx, q, a...)
						return err
					}); err != nil {
						return err
					}
					return zclaimpg.CompleteSQL(ctx, tx)
				})
			}
		},
	}
	for name, mk := range handlers {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			idem := b.idem(t, "", zclaim.IdempotencyOptions{})
			h := idem.Middleware()(mk(b))
			must(t, h.ProcessTask(ctx, asynq.NewTask("effect", []byte("order-1"))))
			if got := b.effects(t); got["order-1"] != 1 {
				t.Fatalf("effects %v, want order-1 once", got)
			}
			if s := idem.Stats(); s.Completed != 1 || s.Skipped != 0 {
				t.Fatalf("stats %+v, want 1 completed, 0 skipped", s)
			}
			if ok, err := zclaimpg.Done(ctx, b.pool, "order-1"); err != nil || !ok {
				t.Fatalf("Done: %v %v", ok, err)
			}
			// Another run of the key still meets the done row.
			b.forget()
			must(t, h.ProcessTask(ctx, asynq.NewTask("effect", []byte("order-1"))))
			if got := b.effects(t); got["order-1"] != 1 {
				t.Fatalf("after a second run: effects %v, want order-1 once", got)
			}
			if s := idem.Stats(); s.Skipped != 1 {
				t.Fatalf("stats %+v, want the second run skipped", s)
			}
		})
	}
}

// Complete on a transaction the handler already committed returns an
// error naming the misuse (ErrTxDone, matching zclaim.ErrMisuse), which the
// middleware logs at Error; the effect committed without its done row.
func TestCompleteAfterCommit(t *testing.T) {
	t.Parallel()
	for _, p := range []string{"pgx", "database/sql"} {
		t.Run(p, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			var logs logbuf.Buffer
			idem := b.idem(t, "", zclaim.IdempotencyOptions{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
			h := idem.Middleware()(asynq.HandlerFunc(func(ctx context.Context, _ *asynq.Task) error {
				if p == "pgx" {
					tx, err := b.pool.Begin(ctx)
					must(t, err)
					must(t, insert(ctx, func(ctx context.Context, q string, a ...any) error { _, err := tx.Exec(ctx, q, a...); return err }))
					must(t, tx.Commit(ctx))
					return zclaimpg.Complete(ctx, tx)
				}
				tx, err := b.db.BeginTx(ctx, nil)
				must(t, err)
				must(t, insert(ctx, func(ctx context.Context, q string, a ...any) error {
					_, err := tx.ExecContext(ctx, q, a...)
					return err
				}))
				must(t, tx.Commit())
				return zclaimpg.CompleteSQL(ctx, tx)
			}))
			err := h.ProcessTask(ctx, asynq.NewTask("effect", []byte("order-1")))
			if !errors.Is(err, zclaimpg.ErrTxDone) || !errors.Is(err, zclaim.ErrMisuse) ||
				!strings.Contains(err.Error(), "before its commit") {
				t.Fatalf("Complete after the commit: %v, want ErrTxDone", err)
			}
			if l := logs.String(); !strings.Contains(l, "level=ERROR") || !strings.Contains(l, "misused") {
				t.Fatalf("the middleware logged:\n%s", l)
			}
			if ok, _ := zclaimpg.Done(ctx, b.pool, "order-1"); ok {
				t.Fatal("a done row after a Complete on a committed transaction")
			}
		})
	}
}

// A nil transaction, database or pool gets ErrNilTx or ErrNilDB and
// writes nothing; nothing panics.
func TestNilArguments(t *testing.T) {
	t.Parallel()
	b := setup(t)
	idem := b.idem(t, "", zclaim.IdempotencyOptions{})
	var nilPool *pgxpool.Pool
	var nilDB *sql.DB
	var nilTx *sql.Tx
	h := idem.Middleware()(asynq.HandlerFunc(func(ctx context.Context, _ *asynq.Task) error {
		for name, c := range map[string]struct {
			err  error
			want error
		}{
			"Complete(nil)":     {zclaimpg.Complete(ctx, nil), zclaimpg.ErrNilTx},
			"CompleteSQL(nil)":  {zclaimpg.CompleteSQL(ctx, nilTx), zclaimpg.ErrNilTx},
			"Fence(nil)":        {zclaimpg.Fence(ctx, nil, "r"), zclaimpg.ErrNilTx},
			"FenceSQL(nil)":     {zclaimpg.FenceSQL(ctx, nilTx, "r"), zclaimpg.ErrNilTx},
			"InTx(nil)":         {zclaimpg.InTx(ctx, nil, pgx.TxOptions{}, func(pgx.Tx) error { return nil }), zclaimpg.ErrNilDB},
			"InTx(nil pool)":    {zclaimpg.InTx(ctx, nilPool, pgx.TxOptions{}, func(pgx.Tx) error { return nil }), zclaimpg.ErrNilDB},
			"InSQLTx(nil)":      {zclaimpg.InSQLTx(ctx, nilDB, nil, func(*sql.Tx) error { return nil }), zclaimpg.ErrNilDB},
			"Migrate(nil)":      {zclaimpg.Migrate(ctx, nil), zclaimpg.ErrNilDB},
			"Migrate(nil pool)": {zclaimpg.Migrate(ctx, nilPool), zclaimpg.ErrNilDB},
			"MigrateSQL(nil)":   {zclaimpg.MigrateSQL(ctx, nilDB), zclaimpg.ErrNilDB},
			"Prune(nil pool)":   {func() error { _, err := zclaimpg.Prune(ctx, nilPool, zclaimpg.PruneOptions{}); return err }(), zclaimpg.ErrNilDB},
			"PruneLoop(nil)":    {zclaimpg.PruneLoop(ctx, nil, zclaimpg.PruneOptions{}), zclaimpg.ErrNilDB},
			"Done(nil pool)":    {func() error { _, err := zclaimpg.Done(ctx, nilPool, "k"); return err }(), zclaimpg.ErrNilDB},
		} {
			if !errors.Is(c.err, c.want) {
				t.Errorf("%s: %v, want %v", name, c.err, c.want)
			}
		}
		return nil
	}))
	must(t, h.ProcessTask(ctx, asynq.NewTask("effect", []byte("order-1"))))
	if ok, _ := zclaimpg.Done(ctx, b.pool, "order-1"); ok {
		t.Fatal("a done row after nil arguments")
	}
}

// Migrate as a role that may use the tables but not create them, where
// an admin made them: it succeeds and creates nothing. Where they are
// missing it says which and how to make them; where the role may not
// write them it says what to grant.
func TestMigrateLeastPrivilege(t *testing.T) {
	t.Parallel()
	b := setup(t) // the admin's Migrate made the tables in b.schema
	role := b.schema + "_dml"
	empty := b.schema + "_empty"
	for _, q := range []string{
		"CREATE ROLE " + role + " LOGIN",
		"GRANT USAGE ON SCHEMA " + b.schema + " TO " + role,
		"GRANT SELECT, INSERT, DELETE ON " + b.schema + ".zclaim_done TO " + role,
		"GRANT SELECT, INSERT, UPDATE ON " + b.schema + ".zclaim_fence TO " + role,
		"CREATE SCHEMA " + empty,
		"GRANT USAGE ON SCHEMA " + empty + " TO " + role,
	} {
		_, err := admin.Exec(ctx, q)
		must(t, err)
	}
	t.Cleanup(func() {
		c := context.Background()
		admin.Exec(c, "DROP SCHEMA "+empty+" CASCADE")
		admin.Exec(c, "DROP OWNED BY "+role)
		admin.Exec(c, "DROP ROLE "+role)
	})
	pool := func(schema string) *pgxpool.Pool {
		cfg, err := pgxpool.ParseConfig(pgURL)
		must(t, err)
		cfg.ConnConfig.User = role
		cfg.ConnConfig.RuntimeParams["search_path"] = schema
		p, err := pgxpool.NewWithConfig(ctx, cfg)
		must(t, err)
		t.Cleanup(p.Close)
		return p
	}
	dml := pool(b.schema)
	must(t, zclaimpg.Migrate(ctx, dml))
	if err := zclaimpg.Migrate(ctx, pool(empty)); err == nil || !strings.Contains(err.Error(),
		"index zclaim_done_done_at, table zclaim_done, table zclaim_fence missing") ||
		!strings.Contains(err.Error(), "zclaimpg.Schema") || !strings.Contains(err.Error(), "permission denied") {
		t.Fatalf("Migrate as the role on an empty schema: %v", err)
	}
	var n int
	must(t, admin.QueryRow(ctx, "SELECT count(*) FROM pg_tables WHERE schemaname = $1", empty).Scan(&n))
	if n != 0 {
		t.Fatalf("%d tables in the empty schema", n)
	}
	_, err := admin.Exec(ctx, "REVOKE INSERT ON "+b.schema+".zclaim_fence FROM "+role)
	must(t, err)
	if err := zclaimpg.Migrate(ctx, dml); err == nil || !strings.Contains(err.Error(), "grant it SELECT, INSERT, UPDATE on zclaim_fence") {
		t.Fatalf("Migrate as a role that may not write zclaim_fence: %v", err)
	}
	// Schema's statements, as an admin would run them, are what Migrate makes.
	for _, q := range zclaimpg.Schema() {
		_, err := admin.Exec(ctx, fmt.Sprintf("SET search_path = %s; %s", empty, q))
		must(t, err)
	}
	for _, q := range []string{"GRANT SELECT, INSERT, DELETE ON " + empty + ".zclaim_done TO " + role,
		"GRANT SELECT, INSERT, UPDATE ON " + empty + ".zclaim_fence TO " + role} {
		_, err := admin.Exec(ctx, q)
		must(t, err)
	}
	must(t, zclaimpg.Migrate(ctx, pool(empty)))
	_ = pgproc.Install
}
