package a

import (
	"github.com/redis/go-redis/v9"
)

// A claim made by adding the id to another set and testing the count:
// only the worker whose ZADD NX (or SADD) added it goes on, and the ZREM
// after it cleans up (quiet). Its twin adds without looking at the count:
// both workers go on (reported).
func takeByAdd(rdb *redis.Client, now string) { // want takeByAdd:`^zset\(read "due:jobs"\)$`
	ids := rdb.ZRangeByScore(ctx, "due:jobs", &redis.ZRangeBy{Min: "-inf", Max: now}).Val()
	for _, id := range ids {
		if rdb.ZAddNX(ctx, "taken:jobs", redis.Z{Member: id}).Val() == 1 {
			run(id)
			rdb.ZRem(ctx, "due:jobs", id)
		}
	}
}

func takeBySAdd(rdb *redis.Client, now string) { // want takeBySAdd:`^zset\(read "due:sjobs"\)$`
	ids := rdb.ZRangeByScore(ctx, "due:sjobs", &redis.ZRangeBy{Min: "-inf", Max: now}).Val()
	for _, id := range ids {
		n, err := rdb.SAdd(ctx, "taken:sjobs", id).Result()
		if err != nil || n == 0 {
			continue
		}
		run(id)
		rdb.ZRem(ctx, "due:sjobs", id)
	}
}

func addUnlooked(rdb *redis.Client, now string) {
	ids := rdb.ZRangeByScore(ctx, "due:ujobs", &redis.ZRangeBy{Min: "-inf", Max: now}).Val() // want `racy poller: ZRANGEBYSCORE reads due members of "due:ujobs" here, and ZREM at addclaims.go:\d+ removes them`
	for _, id := range ids {
		rdb.ZAddNX(ctx, "taken:ujobs", redis.Z{Member: id})
		run(id)
		rdb.ZRem(ctx, "due:ujobs", id)
	}
}
