package a

import (
	"github.com/avast/retry-go"
	"github.com/cenkalti/backoff/v4"
	"github.com/redis/go-redis/v9"
)

// A read in one retry helper's literal and a removal in another's: each
// literal runs where it is handed over, as part of the function.
func retriedPoll(rdb *redis.Client, key string) {
	var ids []string
	retry.Do(func() error {
		var err error
		ids, err = rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Max: "100"}).Result() // want `racy poller: ZRANGEBYSCORE reads due members of key here, and ZREM at retries.go:\d+ removes`
		return err
	})
	for _, id := range ids {
		run(id)
	}
	backoff.Retry(func() error { return rdb.ZRem(ctx, key, ids).Err() }, backoff.NewExponentialBackOff())
}

// The helpers that hand back data, and a removal in a helper the caller
// calls.
func retriedWithData(rdb *redis.Client, key string) {
	ids, _ := retry.DoWithData(func() ([]string, error) {
		return rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Max: "100"}).Result() // want `racy poller`
	})
	backoff.RetryNotify(func() error { return rdb.ZRem(ctx, key, ids).Err() }, backoff.NewExponentialBackOff(), nil)
	runAll(ids)
}

func retriedHelper(rdb *redis.Client) {
	ids, _ := backoff.RetryWithData(func() ([]string, error) {
		return getBatch(rdb, "delay:retried"), nil // want `racy poller`
	}, backoff.NewExponentialBackOff())
	clearBatch(rdb, "delay:retried", ids[0])
	runAll(ids)
}

// Its twin: literals handed to a function not known to run them in place
// (kept for later, perhaps) are pollers of their own, and neither both
// reads and removes.
func registered(rdb *redis.Client, key string) {
	var ids []string
	later(func() { ids = rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Max: "100"}).Val() })
	later(func() { rdb.ZRem(ctx, key, ids) })
}

func later(f func()) { go f() }
