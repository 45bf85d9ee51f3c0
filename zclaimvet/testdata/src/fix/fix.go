package fix // want package:"uses github.com/redis/go-redis/v9"

import (
	"context"

	"github.com/redis/go-redis/v9"
)

var ctx = context.Background()

func run([]string) {}

func poll(rdb *redis.Client) {
	for {
		ids := rdb.ZRangeByScore(ctx, "delay:jobs", &redis.ZRangeBy{Max: "+inf"}).Val() // want `racy poller`
		rdb.ZRem(ctx, "delay:jobs", ids)
		run(ids)
	}
}
