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
	"reflect"
	"slices"
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

// ErrNilTx is returned for a nil transaction, and ErrNilDB for a nil
// database or pool: nothing is written.
var (
	ErrNilTx = errors.New("zclaimpg: nil transaction")
	ErrNilDB = errors.New("zclaimpg: nil database")
)

// ErrTxDone is matched by the error of Complete, Fence and the InTx
// helpers' calls on a transaction that was already committed or rolled
// back: the handler's writes committed without the occurrence's done
// row, so they repeat on every retry. It matches zclaim.ErrMisuse, which
// the middleware logs at Error.
var ErrTxDone = fmt.Errorf("%w: the transaction was already committed or rolled back: call Complete inside the "+
	"transaction that holds the handler's writes, before its commit; writes committed without it repeat on "+
	"every retry", zclaim.ErrMisuse)

// isNil reports whether v is nil, or a nil pointer in an interface.
func isNil(v any) bool {
	if v == nil {
		return true
	}
	r := reflect.ValueOf(v)
	switch r.Kind() {
	case reflect.Pointer, reflect.Interface, reflect.Map, reflect.Func, reflect.Slice, reflect.Chan:
		return r.IsNil()
	}
	return false
}

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
// advisory lock, and a second call changes nothing. Where the tables
// exist it creates nothing, so a role that may use them but not create
// them (an admin made them) passes; it then checks that the role may
// write them. It says what is missing when they do not exist and the role
// cannot create them.
func Migrate(ctx context.Context, db Beginner) error {
	if isNil(db) {
		return ErrNilDB
	}
	return pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		return migrate(ctx, func(q string, args ...any) (pgx.Row, error) { return tx.QueryRow(ctx, q, args...), nil },
			func(q string, args ...any) error { _, err := tx.Exec(ctx, q, args...); return err })
	})
}

// MigrateSQL is Migrate for database/sql.
func MigrateSQL(ctx context.Context, db *sql.DB) error {
	if db == nil {
		return ErrNilDB
	}
	return inSQL(ctx, db, nil, func(tx *sql.Tx) error {
		return migrate(ctx, func(q string, args ...any) (pgx.Row, error) { return tx.QueryRowContext(ctx, q, args...), nil },
			func(q string, args ...any) error { _, err := tx.ExecContext(ctx, q, args...); return err })
	})
}

// tablesSQL tells which of zclaimpg's relations exist on the search_path
// and whether the role may do with its tables what Complete, Fence and
// Prune do.
const tablesSQL = `WITH r AS (SELECT to_regclass('zclaim_done') AS done, to_regclass('zclaim_fence') AS fence)
	SELECT done IS NOT NULL, to_regclass('zclaim_done_done_at') IS NOT NULL, fence IS NOT NULL,
		done IS NULL OR (has_table_privilege(done, 'SELECT') AND has_table_privilege(done, 'INSERT')
			AND has_table_privilege(done, 'DELETE')),
		fence IS NULL OR (has_table_privilege(fence, 'SELECT') AND has_table_privilege(fence, 'INSERT')
			AND has_table_privilege(fence, 'UPDATE'))
	FROM r`

func migrate(ctx context.Context, query func(q string, args ...any) (pgx.Row, error), exec func(q string, args ...any) error) error {
	check := func() (missing []string, err error) {
		var done, index, fence, doneOK, fenceOK bool
		row, _ := query(tablesSQL)
		if err := row.Scan(&done, &index, &fence, &doneOK, &fenceOK); err != nil {
			return nil, fmt.Errorf("zclaimpg: migrate: %w", err)
		}
		switch {
		case !doneOK:
			return nil, errors.New("zclaimpg: migrate: this role may not write zclaim_done: grant it SELECT, " +
				"INSERT, DELETE on zclaim_done")
		case !fenceOK:
			return nil, errors.New("zclaimpg: migrate: this role may not write zclaim_fence: grant it SELECT, " +
				"INSERT, UPDATE on zclaim_fence")
		}
		for name, ok := range map[string]bool{"table zclaim_done": done, "index zclaim_done_done_at": index,
			"table zclaim_fence": fence} {
			if !ok {
				missing = append(missing, name)
			}
		}
		slices.Sort(missing)
		return missing, nil
	}
	missing, err := check()
	if err != nil || len(missing) == 0 {
		return err
	}
	if err := exec("SELECT pg_advisory_xact_lock($1)", int64(migrateLock)); err != nil {
		return fmt.Errorf("zclaimpg: migrate: %w", err)
	}
	for _, stmt := range schema {
		if err := exec(stmt); err != nil {
			return fmt.Errorf("zclaimpg: migrate: %s missing, and creating it failed (run Migrate once as a role "+
				"that may create them, or the statements of zclaimpg.Schema): %w", strings.Join(missing, ", "), err)
		}
	}
	return nil
}

// Schema returns the statements Migrate runs where the tables are
// missing, for an admin who creates them ahead of a role that may only
// use them.
func Schema() []string { return slices.Clone(schema) }

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

// A plain INSERT of the done row, with no ON CONFLICT: one that meets a
// committed row of the same key fails with a unique violation, which
// complete turns into ErrAlreadyDone; one that meets an uncommitted row
// waits for that transaction, then fails if it committed and inserts if
// it rolled back. So of concurrent runs of one key exactly one commits.
// Either way the transaction is to be rolled back. The row is inserted
// only where this transaction (or the savepoint it is in) has not just
// inserted it: the setting zclaim.done, local to the transaction, holds
// the token and key of the last row inserted, so a second Complete of the
// run in the same transaction is a no-op. (One setting for every key: a
// setting of its own per key would stay in the session's table of
// settings for the life of the connection.)
const completeSQL = `INSERT INTO zclaim_done (key, token) SELECT $1::text, $2::bigint
	WHERE (CASE WHEN current_setting('zclaim.done', true) IS DISTINCT FROM $2::text || ' ' || $1::text
		THEN set_config('zclaim.done', $2::text || ' ' || $1::text, true) END) IS NOT NULL`

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
	case errors.Is(err, pgx.ErrTxClosed) || errors.Is(err, sql.ErrTxDone):
		return fmt.Errorf("zclaimpg: complete %q: %w", key, ErrTxDone)
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
//
// A second Complete of the same run in the same transaction (or one
// inside InTx's fn, which completes already) is a no-op. On a transaction
// already committed or rolled back it returns an error matching
// ErrTxDone; on a nil one ErrNilTx.
func Complete(ctx context.Context, tx pgx.Tx) error {
	if isNil(tx) {
		return ErrNilTx
	}
	return complete(ctx, pgxExec(tx))
}

// CompleteSQL is Complete for a database/sql transaction (pgx/stdlib,
// lib/pq, and the sqlc, ent or gorm code built on them).
func CompleteSQL(ctx context.Context, tx *sql.Tx) error {
	if tx == nil {
		return ErrNilTx
	}
	return complete(ctx, sqlExec(tx))
}

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
	if errors.Is(err, pgx.ErrTxClosed) || errors.Is(err, sql.ErrTxDone) {
		return fmt.Errorf("zclaimpg: fence %q: %w", resource, ErrTxDone)
	}
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
	if isNil(tx) {
		return ErrNilTx
	}
	return fence(ctx, pgxExec(tx), resource)
}

// FenceSQL is Fence for a database/sql transaction.
func FenceSQL(ctx context.Context, tx *sql.Tx, resource string) error {
	if tx == nil {
		return ErrNilTx
	}
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
	if isNil(db) {
		return ErrNilDB
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
	if db == nil {
		return ErrNilDB
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
	if isNil(q) {
		return false, ErrNilDB
	}
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
