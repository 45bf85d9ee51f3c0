package a

import (
	"context"
	"sync"

	"github.com/redis/go-redis/v9"

	"wrap"
)

// A read in a literal handed to a helper of this package that calls it
// before it returns: the literal runs as part of the function.
func helperPoll(rdb *redis.Client, key string) {
	var ids []string
	inPlace(func() error {
		var err error
		ids, err = rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Max: "100"}).Result() // want `racy poller: ZRANGEBYSCORE reads due members of key here, and ZREM at wrappers.go:\d+ removes`
		return err
	})
	runAll(ids)
	rdb.ZRem(ctx, key, ids)
}

func inPlace(f func() error) error { return f() }

// Its twin: a helper that keeps the literal, to call it later (as later,
// in retries.go, runs it on a goroutine): the literal is a poller of its
// own, which only reads.
func keptPoll(rdb *redis.Client, key string) { // want keptPoll:`rm ⟨p1⟩`
	var ids []string
	keep(func() error {
		ids = rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Max: "100"}).Val()
		return nil
	})
	rdb.ZRem(ctx, key, ids)
}

func keep(f func() error) { kept = append(kept, f) }

var kept []func() error

// A wrapper whose code is another package's (a timeout helper): a literal
// that leaves the members in a variable of the caller's ran before the
// call returned, and so did one whose error the caller takes.
func wrappedPoll(rdb *redis.Client, key string) error {
	var zs []redis.Z
	err := wrap.Timeout(ctx, func(ctx context.Context) error {
		var err error
		zs, err = rdb.ZRangeWithScores(ctx, key, 0, 0).Result() // want `racy poller: ZRANGE WITHSCORES reads due members of key here, and ZREM at wrappers.go:\d+ removes`
		return err
	})
	if err != nil || len(zs) == 0 {
		return err
	}
	run(zs[0].Member.(string))
	return wrap.Timeout(ctx, func(ctx context.Context) error {
		return rdb.ZRem(ctx, key, zs[0].Member).Err()
	})
}

// sync.Once runs its literal in place too.
func oncePoll(rdb *redis.Client, key string, once *sync.Once) {
	var ids []string
	once.Do(func() { ids = rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Max: "100"}).Val() }) // want `racy poller`
	runAll(ids)
	rdb.ZRem(ctx, key, ids)
}

// Its twin: literals another package keeps (a message handler), which
// write nothing of the caller's and whose call hands nothing back: each is
// a poller of its own, one reading and one removing.
func handlers(rdb *redis.Client, key string) {
	wrap.OnMessage(func(string) error {
		runAll(rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Max: "100"}).Val())
		return nil
	})
	wrap.OnMessage(func(id string) error { return rdb.ZRem(ctx, key, id).Err() })
}
