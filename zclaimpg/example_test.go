package zclaimpg_test

import (
	"context"
	"log"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/zclaim/zclaim"
	"github.com/zclaim/zclaim/zclaimpg"
)

// A handler whose row and done mark commit together: a second run of the
// occurrence (its worker died after the commit, or Redis forgot the run)
// rolls back and the task succeeds as skipped.
func ExampleInTx() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://app@localhost:5432/app")
	if err != nil {
		log.Fatal(err)
	}
	if err := zclaimpg.Migrate(ctx, pool); err != nil { // from every replica, at start
		log.Fatal(err)
	}
	go zclaimpg.PruneLoop(ctx, pool, zclaimpg.PruneOptions{MaxAge: 7 * 24 * time.Hour})

	rdb := redis.NewClient(&redis.Options{Addr: "localhost:6379"})
	idem, err := zclaim.NewIdempotency(rdb, zclaim.IdempotencyOptions{})
	if err != nil {
		log.Fatal(err)
	}
	mux := asynq.NewServeMux()
	mux.Use(idem.Middleware())
	mux.HandleFunc("reminder:send", func(ctx context.Context, t *asynq.Task) error {
		return zclaimpg.InTx(ctx, pool, pgx.TxOptions{}, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, "INSERT INTO reminders (body) VALUES ($1)", t.Payload())
			return err
		})
	})
	_ = mux // asynq.NewServerFromRedisClient(rdb, ...).Run(mux)
}
