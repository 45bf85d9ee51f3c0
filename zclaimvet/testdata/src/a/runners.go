package a

import (
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"golang.org/x/sync/errgroup"
)

// A literal handed to a runner (errgroup's Go, WaitGroup's Go,
// time.AfterFunc) runs as a goroutine: a removal in it after the read is
// racy. Twins: a claim of the id first (cleanup); another key.
func viaErrgroup(rdb *redis.Client, key string) error {
	g, ctx := errgroup.WithContext(ctx)
	for _, id := range rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Max: "+inf"}).Val() { // want `racy poller: ZRANGEBYSCORE reads due members of key here, and ZREM at runners.go:\d+`
		g.Go(func() error {
			run(id)
			return rdb.ZRem(ctx, key, id).Err()
		})
	}
	return g.Wait()
}

func viaWaitGroup(rdb *redis.Client, key string) {
	var wg sync.WaitGroup
	for _, id := range rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Max: "+inf"}).Val() { // want `racy poller`
		wg.Go(func() {
			run(id)
			rdb.ZRem(ctx, key, id)
		})
	}
	wg.Wait()
}

func viaAfterFunc(rdb *redis.Client, key string) {
	for _, id := range rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Max: "+inf"}).Val() { // want `racy poller`
		time.AfterFunc(time.Second, func() { rdb.ZRem(ctx, key, id) })
	}
}

func viaErrgroupClaim(rdb *redis.Client, key string) error { // want viaErrgroupClaim:`read ⟨p1⟩`
	var g errgroup.Group
	for _, id := range rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Max: "+inf"}).Val() {
		g.Go(func() error {
			if !rdb.SetNX(ctx, "lock:"+id, 1, time.Minute).Val() {
				return nil
			}
			run(id)
			return rdb.ZRem(ctx, key, id).Err()
		})
	}
	return g.Wait()
}

func viaErrgroupOtherKey(rdb *redis.Client, key string) error { // want viaErrgroupOtherKey:`read ⟨p1⟩, rm ⟨p1⟩ \+ ":done"`
	var g errgroup.Group
	for _, id := range rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Max: "+inf"}).Val() {
		g.Go(func() error { return rdb.ZRem(ctx, key+":done", id).Err() })
	}
	return g.Wait()
}
