// Package zclaimpg makes a handler's effects in PostgreSQL happen once per
// occurrence: the occurrence's done mark is written in the handler's own
// transaction, beside its writes, so either both commit or neither does.
//
// The idempotency middleware (zclaim.Idempotency) keeps one live run per
// occurrence and skips finished ones, but a worker that dies after its
// transaction committed and before the middleware's Complete reached Redis
// leaves the occurrence unfinished there, and the next run repeats the
// effect. With zclaimpg the database decides: the second run's Complete
// meets the first's done row, returns an error matching
// zclaim.ErrAlreadyDone, the handler rolls back and returns that error, and
// the middleware counts the task as skipped. This holds even when Redis
// lost or rolled back its records.
//
//	zclaimpg.Migrate(ctx, pool) // once at start, from every replica
//
//	mux.HandleFunc("reminder:send", func(ctx context.Context, t *asynq.Task) error {
//		return zclaimpg.InTx(ctx, pool, pgx.TxOptions{}, func(tx pgx.Tx) error {
//			_, err := tx.Exec(ctx, "INSERT INTO reminders (user_id, body) VALUES ($1, $2)", ...)
//			return err
//		})
//	})
//
// The tables are zclaim_done (one row per finished occurrence) and
// zclaim_fence (the largest token seen per resource), found through the
// connection's search_path like the user's own tables, so a service that
// keeps its tables in a schema of its own gets them there too.
package zclaimpg

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/zclaim/zclaim"
)

// ErrNoExecution is returned by Complete, Fence and the InTx helpers when
// the context carries no zclaim.Execution: the handler does not run under
// the idempotency middleware, so there is no occurrence to record.
var ErrNoExecution = errors.New("zclaimpg: no zclaim.Execution in the context (is the handler wrapped " +
	"by Idempotency.Middleware?)")

// migrateLock is the advisory lock Migrate holds while it creates the
// tables, so that replicas starting together do not race on the catalog.
const migrateLock = 0x7a636c61696d // "zclaim"

// schema creates zclaimpg's tables. Every statement is idempotent and none
// drops anything.
var schema = []string{
	`CREATE TABLE IF NOT EXISTS zclaim_done (
		key     text        PRIMARY KEY,
		token   bigint      NOT NULL,
		done_at timestamptz NOT NULL DEFAULT now()
	)`,
	// Rows arrive in done_at order, so a BRIN index finds the old ones for
	// Prune at almost no cost to each Complete (a B-tree would add a third
	// of Complete's work).
	`CREATE INDEX IF NOT EXISTS zclaim_done_done_at ON zclaim_done USING brin (done_at)`,
	`CREATE TABLE IF NOT EXISTS zclaim_fence (
		resource   text        PRIMARY KEY,
		token      bigint      NOT NULL,
		updated_at timestamptz NOT NULL DEFAULT now()
	)`,
}

// Beginner is what Migrate and InTx need of a database: *pgxpool.Pool,
// *pgx.Conn and pgx.Tx (a savepoint) have it.
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Migrate creates zclaimpg's tables and index where they do not exist. It
// is safe to call from every replica at start: calls serialise on an
// advisory lock, and a second call changes nothing.
func Migrate(ctx context.Context, db Beginner) error {
	return pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", int64(migrateLock)); err != nil {
			return fmt.Errorf("zclaimpg: migrate: %w", err)
		}
		for _, stmt := range schema {
			if _, err := tx.Exec(ctx, stmt); err != nil {
				return fmt.Errorf("zclaimpg: migrate: %w", err)
			}
		}
		return nil
	})
}

// MigrateSQL is Migrate for database/sql.
func MigrateSQL(ctx context.Context, db *sql.DB) error {
	return inSQL(ctx, db, nil, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, "SELECT pg_advisory_xact_lock($1)", int64(migrateLock)); err != nil {
			return fmt.Errorf("zclaimpg: migrate: %w", err)
		}
		for _, stmt := range schema {
			if _, err := tx.ExecContext(ctx, stmt); err != nil {
				return fmt.Errorf("zclaimpg: migrate: %w", err)
			}
		}
		return nil
	})
}

// execer is the one call Complete and Fence make, which pgx.Tx and the
// adapter of *sql.Tx both have.
type execer func(ctx context.Context, sql string, args ...any) (rowsAffected int64, err error)

func pgxExec(tx pgx.Tx) execer {
	return func(ctx context.Context, q string, args ...any) (int64, error) {
		tag, err := tx.Exec(ctx, q, args...)
		return tag.RowsAffected(), err
	}
}

func sqlExec(tx *sql.Tx) execer {
	return func(ctx context.Context, q string, args ...any) (int64, error) {
		res, err := tx.ExecContext(ctx, q, args...)
		if err != nil {
			return 0, err
		}
		return res.RowsAffected()
	}
}

// A plain INSERT (no ON CONFLICT: its speculative insertion costs more):
// one that meets a committed row of the same key fails with a unique
// violation, which complete turns into ErrAlreadyDone; one that meets an
// uncommitted row waits for that transaction, then fails if it committed
// and inserts if it rolled back. So of concurrent runs of one key exactly
// one commits. Either way the transaction is to be rolled back.
const completeSQL = `INSERT INTO zclaim_done (key, token) VALUES ($1, $2)`

func complete(ctx context.Context, exec execer) error {
	e, ok := zclaim.ExecutionFromContext(ctx)
	if !ok {
		return ErrNoExecution
	}
	_, err := exec(ctx, completeSQL, e.Key, e.Token)
	return doneVerdict(e.Key, err)
}

// doneVerdict is what the done row's INSERT error err means for key: nil,
// an error matching zclaim.ErrAlreadyDone, or the database's error.
func doneVerdict(key string, err error) error {
	switch {
	case err == nil:
		return nil
	case isDone(err):
		return alreadyDone(key)
	}
	return fmt.Errorf("zclaimpg: complete %q: %w", key, err)
}

// isDone reports whether err is the unique violation of a done row, from
// pgx or from database/sql over pgx/stdlib or lib/pq (any error that says
// so: its SQLSTATE and the constraint's name).
func isDone(err error) bool {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code == "23505" && pe.ConstraintName == "zclaim_done_pkey"
	}
	var coded interface{ SQLState() string }
	return errors.As(err, &coded) && coded.SQLState() == "23505" && strings.Contains(err.Error(), "zclaim_done_pkey")
}

// Complete records the occurrence of the handler's Execution
// (zclaim.ExecutionFromContext) as done in tx, the transaction that holds
// the handler's writes. Call it before the commit. If another run of that
// key already committed, it returns an error matching zclaim.ErrAlreadyDone:
// roll back and return it from the handler, and the middleware counts the
// task as skipped. If another run of the key holds an uncommitted done row,
// Complete waits for that transaction to end. Without an Execution in ctx it
// returns ErrNoExecution.
//
// After ErrAlreadyDone the transaction is aborted: roll it back. Under
// SERIALIZABLE a row committed after tx began can fail it with a
// serialization error instead; asynq then retries the task, and the retry
// gets ErrAlreadyDone.
func Complete(ctx context.Context, tx pgx.Tx) error { return complete(ctx, pgxExec(tx)) }

// CompleteSQL is Complete for a database/sql transaction (pgx/stdlib,
// lib/pq, and the sqlc, ent or gorm code built on them).
func CompleteSQL(ctx context.Context, tx *sql.Tx) error { return complete(ctx, sqlExec(tx)) }

// A resource keeps the largest token that wrote it; an equal token is the
// same run writing again.
const fenceSQL = `INSERT INTO zclaim_fence (resource, token) VALUES ($1, $2)
	ON CONFLICT (resource) DO UPDATE SET token = EXCLUDED.token, updated_at = now()
	WHERE zclaim_fence.token <= EXCLUDED.token`

func fence(ctx context.Context, exec execer, resource string) error {
	e, ok := zclaim.ExecutionFromContext(ctx)
	if !ok {
		return ErrNoExecution
	}
	n, err := exec(ctx, fenceSQL, resource, e.Token)
	if err != nil {
		return fmt.Errorf("zclaimpg: fence %q: %w", resource, err)
	}
	if n == 0 {
		return fmt.Errorf("zclaimpg: %w: resource %q was written by a run with a larger token than %d (of %q)",
			zclaim.ErrLeaseLost, resource, e.Token, e.Key)
	}
	return nil
}

// Fence guards a write that is not keyed by the occurrence (a row that many
// jobs update): it records the Execution's token for resource in tx and
// refuses, with an error matching zclaim.ErrLeaseLost, a token lower than
// one already recorded there. Tokens grow with the time a run began (see
// zclaim.Execution), so a run that lost its lease to a later run, or began
// before the resource's last writer, is refused. Roll back on the error.
func Fence(ctx context.Context, tx pgx.Tx, resource string) error {
	return fence(ctx, pgxExec(tx), resource)
}

// FenceSQL is Fence for a database/sql transaction.
func FenceSQL(ctx context.Context, tx *sql.Tx, resource string) error {
	return fence(ctx, sqlExec(tx), resource)
}

// TxBeginner is what InTx needs of a database: *pgxpool.Pool and *pgx.Conn
// have it.
type TxBeginner interface {
	BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error)
}

// InTx runs fn in a transaction of db in which the handler's occurrence is
// recorded as done, and commits. The done row goes before anything fn does,
// in the same round trip as fn's first Exec with arguments (or on its own
// before any other call): a run whose occurrence another run committed
// stops there, with an error matching zclaim.ErrAlreadyDone, before any of
// fn's writes is made (return it from the handler, and the task succeeds as
// skipped); a run that meets another's uncommitted row waits for that
// transaction to end. Any error of fn rolls the transaction back, done row
// included, and so does a panic of fn before it goes on. opts are those of
// db.BeginTx.
func InTx(ctx context.Context, db TxBeginner, opts pgx.TxOptions, fn func(pgx.Tx) error) error {
	e, ok := zclaim.ExecutionFromContext(ctx)
	if !ok {
		return ErrNoExecution
	}
	tx, err := db.BeginTx(ctx, opts)
	if err != nil {
		return fmt.Errorf("zclaimpg: begin: %w", err)
	}
	// Rolled back on an error, and on a panic of fn (its connection goes
	// back to the pool, and no lock of the done row outlives the run);
	// after the commit, a no-op.
	defer tx.Rollback(context.WithoutCancel(ctx))
	dt := &doneTx{Tx: tx, ctx: ctx, e: e, pending: true}
	err = fn(dt)
	if err == nil {
		err = dt.flush(ctx) // fn made no call that carried it
	}
	if dt.err != nil {
		err = dt.err // the done row's verdict, even if fn let it pass
	}
	if err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("zclaimpg: commit: %w", err)
	}
	return nil
}

// doneTx is the transaction InTx hands to fn. Its done row waits for fn's
// first call: an Exec with arguments carries it in one batch (one round
// trip for both); any other call writes it on its own first.
type doneTx struct {
	pgx.Tx
	ctx     context.Context // the handler's
	e       *zclaim.Execution
	pending bool  // the done row is not written yet
	err     error // the done row's error, once written
}

func (t *doneTx) verdict(err error) error { return doneVerdict(t.e.Key, err) }

// flush writes the done row if it is still pending.
func (t *doneTx) flush(ctx context.Context) error {
	if t.pending {
		t.pending = false
		_, err := t.Tx.Exec(ctx, completeSQL, t.e.Key, t.e.Token)
		t.err = t.verdict(err)
	}
	return t.err
}

// batchable reports whether an Exec of args can share a batch: it has
// arguments (pgx runs one without them as a simple query, which may hold
// several statements) and no query option first.
func batchable(args []any) bool {
	if len(args) == 0 {
		return false
	}
	switch args[0].(type) {
	case pgx.QueryExecMode, pgx.QueryRewriter, pgx.QueryResultFormats, pgx.QueryResultFormatsByOID:
		return false
	}
	return true
}

func (t *doneTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if !t.pending || !batchable(args) {
		if err := t.flush(ctx); err != nil {
			return pgconn.CommandTag{}, err
		}
		return t.Tx.Exec(ctx, sql, args...)
	}
	t.pending = false
	b := &pgx.Batch{}
	b.Queue(completeSQL, t.e.Key, t.e.Token)
	b.Queue(sql, args...)
	br := t.Tx.SendBatch(ctx, b)
	if _, err := br.Exec(); err != nil {
		t.err = t.verdict(err)
		br.Close()
		return pgconn.CommandTag{}, t.err
	}
	tag, err := br.Exec()
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return tag, err
}

func (t *doneTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if err := t.flush(ctx); err != nil {
		return nil, err
	}
	return t.Tx.Query(ctx, sql, args...)
}

func (t *doneTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if err := t.flush(ctx); err != nil {
		return errRow{err}
	}
	return t.Tx.QueryRow(ctx, sql, args...)
}

func (t *doneTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if t.pending && b != nil {
		// The done row goes first in the caller's batch.
		t.pending = false
		nb := &pgx.Batch{QueuedQueries: append([]*pgx.QueuedQuery{{SQL: completeSQL,
			Arguments: []any{t.e.Key, t.e.Token}}}, b.QueuedQueries...)}
		br := t.Tx.SendBatch(ctx, nb)
		if _, err := br.Exec(); err != nil {
			t.err = t.verdict(err)
			return failedBatch{br, t.err}
		}
		return br
	}
	return t.Tx.SendBatch(ctx, b)
}

// failedBatch is the results of a batch whose done row failed: each of
// the caller's queries, and Close, returns the done row's verdict, where
// pgx would return the database's error (Close reads what is left).
type failedBatch struct {
	pgx.BatchResults
	err error
}

func (b failedBatch) Exec() (pgconn.CommandTag, error) { return pgconn.CommandTag{}, b.err }

func (b failedBatch) Query() (pgx.Rows, error) {
	rows, _ := b.BatchResults.Query() // closed, with the database's error
	return rows, b.err
}

func (b failedBatch) QueryRow() pgx.Row { return errRow{b.err} }

func (b failedBatch) Close() error {
	b.BatchResults.Close()
	return b.err
}

func (t *doneTx) CopyFrom(ctx context.Context, table pgx.Identifier, cols []string,
	src pgx.CopyFromSource) (int64, error) {
	if err := t.flush(ctx); err != nil {
		return 0, err
	}
	return t.Tx.CopyFrom(ctx, table, cols, src)
}

func (t *doneTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	if err := t.flush(ctx); err != nil {
		return nil, err
	}
	return t.Tx.Prepare(ctx, name, sql)
}

func (t *doneTx) Begin(ctx context.Context) (pgx.Tx, error) {
	if err := t.flush(ctx); err != nil {
		return nil, err
	}
	return t.Tx.Begin(ctx)
}

func (t *doneTx) LargeObjects() pgx.LargeObjects {
	t.flush(t.ctx)
	return t.Tx.LargeObjects()
}

func (t *doneTx) Conn() *pgx.Conn {
	t.flush(t.ctx) // what is done on the connection comes after the done row
	return t.Tx.Conn()
}

// Commit and Rollback are InTx's.
func (t *doneTx) Commit(context.Context) error {
	return errors.New("zclaimpg: InTx commits the transaction itself when fn returns nil")
}

func (t *doneTx) Rollback(context.Context) error {
	return errors.New("zclaimpg: InTx rolls the transaction back itself when fn returns an error")
}

// errRow is a pgx.Row that fails with err.
type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

func alreadyDone(key string) error {
	return fmt.Errorf("zclaimpg: %w: another run of %q committed (roll back and return this error)",
		zclaim.ErrAlreadyDone, key)
}

// InSQLTx is InTx for database/sql: db.BeginTx(ctx, opts), CompleteSQL
// (first, so that a run whose occurrence is done does not run fn), fn,
// commit; rolled back on an error or a panic of fn.
func InSQLTx(ctx context.Context, db *sql.DB, opts *sql.TxOptions, fn func(*sql.Tx) error) error {
	if _, ok := zclaim.ExecutionFromContext(ctx); !ok {
		return ErrNoExecution
	}
	return inSQL(ctx, db, opts, func(tx *sql.Tx) error {
		if err := CompleteSQL(ctx, tx); err != nil {
			return err
		}
		return fn(tx)
	})
}

func inSQL(ctx context.Context, db *sql.DB, opts *sql.TxOptions, fn func(*sql.Tx) error) error {
	tx, err := db.BeginTx(ctx, opts)
	if err != nil {
		return fmt.Errorf("zclaimpg: begin: %w", err)
	}
	defer tx.Rollback() // as InTx's: on an error or a panic of fn; after the commit, a no-op
	if err := fn(tx); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("zclaimpg: commit: %w", err)
	}
	return nil
}

// Done reports whether key's occurrence is recorded as done in the
// database: for tools, and for a handler that wants to look before it
// starts work that cannot be rolled back.
func Done(ctx context.Context, q interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}, key string) (bool, error) {
	var one int
	err := q.QueryRow(ctx, "SELECT 1 FROM zclaim_done WHERE key = $1", key).Scan(&one)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("zclaimpg: done %q: %w", key, err)
	}
	return true, nil
}

// isUndefinedTable reports whether err is PostgreSQL's "relation does not
// exist", which Prune meets before Migrate ran.
func isUndefinedTable(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "42P01"
}

// DefaultMaxAge is how long Prune keeps a done row when PruneOptions.MaxAge
// is zero: a week, well past zclaim.DefaultRunRetention (a day), so that the
// database still knows an occurrence after Redis forgot it.
const DefaultMaxAge = 7 * 24 * time.Hour
