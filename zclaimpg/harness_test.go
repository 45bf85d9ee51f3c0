package zclaimpg_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/redis/go-redis/v9"
	"github.com/zclaim/zclaim"
	"github.com/zclaim/zclaim/internal/pgproc"
	"github.com/zclaim/zclaim/internal/redisproc"
	"github.com/zclaim/zclaim/zclaimpg"
)

// The tests talk to a real Redis (their own redis-server, from PATH) and a
// real PostgreSQL (pgproc.Find: ZCLAIM_TEST_POSTGRES, else 127.0.0.1:5432,
// else one started from initdb). Each test works in a schema of its own,
// which it drops, and under a Redis prefix of its own.
var (
	redisAddr string
	pgURL     string
	admin     *pgxpool.Pool
)

var ctx = context.Background()

func TestMain(m *testing.M) {
	redis.SetLogger(redisproc.QuietRedis{}) // the tests delete records under running handlers on purpose
	rs, err := redisproc.Start()
	if err != nil {
		fmt.Fprintf(os.Stderr, "zclaimpg tests need a Redis 7 server: %v (apt-get install redis-server)\n", err)
		os.Exit(2)
	}
	redisAddr = rs.Addr
	pg, err := pgproc.Find()
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s (%v)\n", pgproc.Install, err)
		rs.Close()
		os.Exit(2)
	}
	pgURL = pg.URL
	admin, err = connect(pgURL, 30*time.Second)
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s (%v)\n", pgproc.Install, err)
		pg.Close()
		rs.Close()
		os.Exit(2)
	}
	code := m.Run()
	admin.Close()
	pg.Close()
	rs.Close()
	os.Exit(code)
}

// connect opens a pool and waits until the server takes logins.
func connect(url string, wait time.Duration) (*pgxpool.Pool, error) {
	deadline := time.Now().Add(wait)
	for {
		p, err := pgxpool.New(ctx, url)
		if err == nil {
			if err = p.Ping(ctx); err == nil {
				return p, nil
			}
			p.Close()
		}
		if time.Now().After(deadline) {
			return nil, err
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// bundle is what a test works with: a pool whose search_path is the test's
// own schema (zclaimpg's tables migrated there, and a table of effects),
// the same through database/sql, and a Redis client.
type bundle struct {
	pool   *pgxpool.Pool
	db     *sql.DB
	rdb    *redis.Client
	schema string
	prefix string
}

func setup(t *testing.T) *bundle {
	t.Helper()
	schema := pgproc.SchemaName(t.Name())
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE") })
	cfg, err := pgxpool.ParseConfig(pgURL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	cfg.MaxConns = 16
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	db := stdlib.OpenDBFromPool(pool)
	t.Cleanup(func() { db.Close() })
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr, PoolSize: 32})
	t.Cleanup(func() { rdb.Close() })
	b := &bundle{pool: pool, db: db, rdb: rdb, schema: schema, prefix: schema + ":run:"}
	t.Cleanup(func() { b.forget() })
	if err := zclaimpg.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "CREATE TABLE effects (key text NOT NULL, n serial)"); err != nil {
		t.Fatal(err)
	}
	return b
}

// idem returns an idempotency store under the test's prefix (or prefix+sub),
// keyed by the task's payload.
func (b *bundle) idem(t *testing.T, sub string, opts zclaim.IdempotencyOptions) *zclaim.Idempotency {
	t.Helper()
	opts.Prefix = b.prefix + sub
	if opts.Lease == 0 {
		opts.Lease = time.Second // renewed every third of it: room for a loaded machine
	}
	opts.Key = func(_ context.Context, t *asynq.Task) (string, error) { return string(t.Payload()), nil }
	i, err := zclaim.NewIdempotency(b.rdb, opts)
	if err != nil {
		t.Fatal(err)
	}
	return i
}

// forget deletes every run record of the test's store: Redis has lost them.
func (b *bundle) forget() {
	iter := b.rdb.Scan(context.Background(), 0, b.prefix+"*", 1000).Iterator()
	for iter.Next(context.Background()) {
		b.rdb.Del(context.Background(), iter.Val())
	}
}

// effects counts the effect rows of each key.
func (b *bundle) effects(t *testing.T) map[string]int {
	t.Helper()
	rows, err := b.pool.Query(ctx, "SELECT key, count(*) FROM effects GROUP BY key")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var k string
		var n int
		if err := rows.Scan(&k, &n); err != nil {
			t.Fatal(err)
		}
		out[k] = n
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// deliver hands a task for key to h the way asynq would: a task that
// failed (met a run in progress elsewhere, or lost its record under it)
// comes back a millisecond later, for up to 30 s.
func deliver(h asynq.Handler, key string) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := h.ProcessTask(ctx, asynq.NewTask("effect", []byte(key)))
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(time.Millisecond)
	}
}

// insert is the handler's effect: one row, no unique constraint, so a
// second run that commits shows as a second row.
func insert(ctx context.Context, exec func(ctx context.Context, q string, args ...any) error) error {
	e, _ := zclaim.ExecutionFromContext(ctx)
	return exec(ctx, "INSERT INTO effects (key) VALUES ($1)", e.Key)
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
