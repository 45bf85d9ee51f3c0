package a

import (
	"github.com/redis/go-redis/v9"
)

// A WATCH transaction whose function a method builds, called where Watch
// takes it (quiet), or kept in a struct field set to such a method
// (quiet). Its twin runs the built function outside a transaction
// (reported).
type watchQueue struct {
	rdb   *redis.Client
	build func(key string) func(*redis.Tx) error
}

func (q *watchQueue) watcher(key string) func(*redis.Tx) error {
	return func(tx *redis.Tx) error {
		ids := tx.ZRangeByScore(ctx, key, &redis.ZRangeBy{Max: "+inf"}).Val()
		tx.ZRem(ctx, key, ids)
		runAll(ids)
		return nil
	}
}

func (q *watchQueue) poll(key string) error {
	return q.rdb.Watch(ctx, q.watcher(key), key)
}

func newWatchQueue(rdb *redis.Client) *watchQueue {
	q := &watchQueue{rdb: rdb}
	q.build = q.watcher
	return q
}

func newWatchQueueLit(rdb *redis.Client) *watchQueue {
	q := &watchQueue{rdb: rdb}
	*q = watchQueue{rdb: rdb, build: q.fieldWatcher}
	return q
}

func (q *watchQueue) fieldWatcher(key string) func(*redis.Tx) error {
	return func(tx *redis.Tx) error {
		ids := tx.ZRangeByScore(ctx, key, &redis.ZRangeBy{Max: "+inf"}).Val()
		tx.ZRem(ctx, key, ids)
		runAll(ids)
		return nil
	}
}

func (q *watchQueue) pollField(key string) error {
	return q.rdb.Watch(ctx, q.build(key), key)
}

// The twin: the same shape of builder, its function run on the client
// with no transaction.
func (q *watchQueue) plainWorker(key string) func() {
	return func() {
		ids := q.rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Max: "+inf"}).Val() // want `racy poller`
		q.rdb.ZRem(ctx, key, ids)
		runAll(ids)
	}
}

func (q *watchQueue) pollPlain(key string) {
	q.plainWorker(key)()
}
