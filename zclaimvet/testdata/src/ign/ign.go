package ign // want package:"uses github.com/redis/go-redis/v9"

import (
	"context"

	"github.com/redis/go-redis/v9"
)

var ctx = context.Background()

func run([]string) {}

// A poller the team reviewed: one worker runs it, by a lease elsewhere.
func reviewed(rdb *redis.Client, key string) {
	ids := rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Max: "+inf"}).Val() //zclaimvet:ignore one replica runs this, under the deploy's leader lease
	rdb.ZRem(ctx, key, ids)
	run(ids)
}

// The mark on the removal's line does the same.
func reviewedAtRemoval(rdb *redis.Client, key string) {
	ids := rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Max: "+inf"}).Val()
	rdb.ZRem(ctx, key, ids) //zclaimvet:ignore a dev-only tool
	run(ids)
}

// A mark without a reason is no mark.
func noReason(rdb *redis.Client, key string) {
	ids := rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Max: "+inf"}).Val() // want `racy poller`
	/* want `//zclaimvet:ignore needs a reason` */ rdb.ZRem(ctx, key, ids) //zclaimvet:ignore
	run(ids)
}
