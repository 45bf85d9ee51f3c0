package zclaimpg

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// PruneOptions configure Prune and PruneLoop. The zero value is valid.
type PruneOptions struct {
	// MaxAge is how long a done row is kept. It must outlast every window
	// in which a duplicate of an occurrence can arrive, so it should be at
	// least the middleware's Retention. Default: DefaultMaxAge (7 days).
	MaxAge time.Duration
	// Batch is how many rows one DELETE removes at most, so that no
	// statement holds locks or writes WAL for long. Default: 1000.
	Batch int
	// Interval is how often PruneLoop runs Prune. Default: 1 minute.
	Interval time.Duration
	// Logger receives PruneLoop's errors. Default: none (quiet).
	Logger *slog.Logger
}

func (o *PruneOptions) defaults() error {
	if o.MaxAge == 0 {
		o.MaxAge = DefaultMaxAge
	}
	if o.Batch == 0 {
		o.Batch = 1000
	}
	if o.Interval == 0 {
		o.Interval = time.Minute
	}
	switch {
	case o.MaxAge < 0:
		return fmt.Errorf("zclaimpg: PruneOptions.MaxAge must not be negative, not %v", o.MaxAge)
	case o.Batch < 1 || o.Batch > 100000:
		return fmt.Errorf("zclaimpg: PruneOptions.Batch must be from 1 to 100000, not %d", o.Batch)
	case o.Interval < time.Millisecond:
		return fmt.Errorf("zclaimpg: PruneOptions.Interval must be at least 1ms, not %v", o.Interval)
	}
	return nil
}

// Execer is what Prune needs of a database: *pgxpool.Pool and *pgx.Conn
// have it.
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// pruneSQL deletes one batch of done rows older than $1 milliseconds,
// found through the BRIN index on done_at, each batch its own statement (and so its own
// transaction outside an explicit one).
const pruneSQL = `DELETE FROM zclaim_done WHERE ctid = ANY (ARRAY(
	SELECT ctid FROM zclaim_done WHERE done_at < now() - $1 * interval '1 millisecond' LIMIT $2))`

// Prune deletes done rows older than MaxAge, in batches of Batch, until
// none is left or ctx ends, and returns how many it deleted. Before
// Migrate ran there is nothing to prune: it returns 0 and no error.
func Prune(ctx context.Context, db Execer, opts PruneOptions) (int64, error) {
	if isNil(db) {
		return 0, ErrNilDB
	}
	if err := opts.defaults(); err != nil {
		return 0, err
	}
	var total int64
	for {
		tag, err := db.Exec(ctx, pruneSQL, opts.MaxAge.Milliseconds(), opts.Batch)
		if err != nil {
			if isUndefinedTable(err) {
				return total, nil
			}
			return total, fmt.Errorf("zclaimpg: prune: %w", err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < int64(opts.Batch) {
			return total, nil
		}
	}
}

// PruneLoop runs Prune every Interval until ctx ends, and returns nil then.
// Errors are logged and the next round tries again. Run it in one process
// or many: concurrent rounds delete disjoint rows or wait on each other.
func PruneLoop(ctx context.Context, db Execer, opts PruneOptions) error {
	if isNil(db) {
		return ErrNilDB
	}
	if err := opts.defaults(); err != nil {
		return err
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	t := time.NewTicker(opts.Interval)
	defer t.Stop()
	for {
		if n, err := Prune(ctx, db, opts); err != nil && ctx.Err() == nil {
			log.Warn("zclaimpg: prune failed; trying again next round", "error", err.Error())
		} else if n > 0 {
			log.Debug("zclaimpg: pruned done rows", "rows", n)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}
