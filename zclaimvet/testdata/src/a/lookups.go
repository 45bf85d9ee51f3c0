package a

import (
	"strconv"

	"github.com/redis/go-redis/v9"
)

// An expiry sweep that looks up each member's owner through a helper of
// its own (a read, its error tested, the value parsed): nothing runs.
func ownerOf(rdb *redis.Client, id string) (int, error) {
	v, err := rdb.HGet(ctx, "req:"+id, "user_id").Result()
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(v)
}

func sweepWithLookup(rdb *redis.Client, key string) {
	ids := rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Max: "100"}).Val()
	pipe := rdb.TxPipeline()
	for _, id := range ids {
		owner, _ := ownerOf(rdb, id)
		pipe.ZRem(ctx, key, id)
		if owner > 0 {
			pipe.ZRem(ctx, "user:"+strconv.Itoa(owner), id)
		}
	}
	pipe.Exec(ctx)
}

// Its twins: a lookup that keeps the member outside itself, and one that
// hands it to a goroutine.
var lastSeen string

func ownerKept(rdb *redis.Client, id string) (int, error) {
	lastSeen = id
	v, err := rdb.HGet(ctx, "req:"+id, "user_id").Result()
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(v)
}

func sweepWithKept(rdb *redis.Client, key string) {
	ids := rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Max: "100"}).Val() // want `racy poller`
	for _, id := range ids {
		rdb.ZRem(ctx, key, id)
		ownerKept(rdb, id)
	}
}

func ownerStarted(rdb *redis.Client, id string) (int, error) {
	if id == "" {
		return 0, nil
	}
	go run(id)
	return 1, nil
}

func sweepWithStarted(rdb *redis.Client, key string) {
	ids := rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Max: "100"}).Val() // want `racy poller`
	for _, id := range ids {
		rdb.ZRem(ctx, key, id)
		ownerStarted(rdb, id)
	}
}
