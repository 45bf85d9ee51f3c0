package a

import "github.com/redis/go-redis/v9"

// Wrappers that return the count: a check where the caller tests what
// they return, not where it drops it.
func zremCount(rdb *redis.Client, key, id string) int64 { // want zremCount:`^zset\(rm ⟨p1⟩\)$`
	return rdb.ZRem(ctx, key, id).Val()
}

func zremResult(rdb *redis.Client, key, id string) (int64, error) { // want zremResult:`^zset\(rm ⟨p1⟩\)$`
	n, err := rdb.ZRem(ctx, key, id).Result()
	if err != nil {
		return 0, err
	}
	return n, nil
}

func checkedByWrapper(rdb *redis.Client, key string) {
	for _, id := range rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Max: "+inf"}).Val() { // want `checked ZREM at counts.go:21 after ZRANGEBYSCORE`
		if zremCount(rdb, key, id) > 0 {
			run(id)
		}
	}
	for _, id := range rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Max: "+inf"}).Val() { // want `checked ZREM`
		if n, err := zremResult(rdb, key, id); err == nil && n == 1 {
			run(id)
		}
	}
}

func wrapperCountDropped(rdb *redis.Client, key string) {
	for _, id := range rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Max: "+inf"}).Val() { // want `racy poller`
		zremCount(rdb, key, id)
		run(id)
	}
	for _, id := range rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Max: "+inf"}).Val() { // want `racy poller`
		if _, err := zremResult(rdb, key, id); err == nil {
			run(id)
		}
	}
}

// A closure that returns the count returns it to the function, not to
// the function's callers: what they test is not the count.
func remByClosure(rdb *redis.Client, key, id string) bool { // want remByClosure:`^zset\(rm ⟨p1⟩\)$`
	func() int64 { return rdb.ZRem(ctx, key, id).Val() }()
	return true
}

func closureCountCalled(rdb *redis.Client, key string) {
	for _, id := range rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Max: "+inf"}).Val() { // want `racy poller`
		if remByClosure(rdb, key, id) {
			run(id)
		}
	}
}
