package a // want package:"uses github.com/go-redis/redis/v7"

import (
	"context"
	"fmt"
	"time"

	redisv8 "github.com/go-redis/redis/v8"
	redigo "github.com/gomodule/redigo/redis"
	"github.com/redis/go-redis/v9"
)

var ctx = context.Background()

// The seed article's poller: read the due members, then remove them.
func naive(rdb *redis.Client) {
	now := fmt.Sprint(time.Now().Unix())
	ids, _ := rdb.ZRangeByScore(ctx, "delay:jobs", &redis.ZRangeBy{Min: "-inf", Max: now}).Result() // want `racy poller: ZRANGEBYSCORE reads due members of "delay:jobs" here, and ZREM at a.go:20 removes them`
	for _, id := range ids {
		rdb.ZRem(ctx, "delay:jobs", id)
		run(id)
	}
}

// A real poller: a loop with a ticker, the key in a variable.
func poller(rdb *redis.Client, stop <-chan struct{}) {
	key := "queue:delayed"
	t := time.NewTicker(time.Second)
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		ids, err := rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Min: "-inf", Max: "+inf", Count: 100}).Result() // want `racy poller`
		if err != nil {
			continue
		}
		for _, id := range ids {
			go run(id)
			rdb.ZRem(ctx, key, id)
		}
	}
}

// A helper that takes the key as a parameter.
func takeDue(rdb *redis.Client, key string, max string) []string {
	ids := rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Min: "-inf", Max: max}).Val() // want `racy poller: ZRANGEBYSCORE reads due members of key here, and ZREMRANGEBYSCORE at a.go:50 removes`
	if len(ids) > 0 {
		rdb.ZRemRangeByScore(ctx, key, "-inf", max)
	}
	return ids
}

// A checked ZREM: correct, but a round trip per job.
func checked(rdb *redis.Client, key string) {
	ids, _ := rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Min: "-inf", Max: "+inf"}).Result() // want `checked ZREM at a.go:59 after ZRANGEBYSCORE on key`
	for _, id := range ids {
		n, err := rdb.ZRem(ctx, key, id).Result()
		if err != nil || n == 0 {
			continue
		}
		run(id)
	}
}

func checkedInline(rdb *redis.Client, key string) {
	for _, id := range rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Max: "+inf"}).Val() { // want `checked ZREM`
		if rdb.ZRem(ctx, key, id).Val() == 1 {
			run(id)
		}
	}
}

// ZRANGE ... BYSCORE, typed and through Do.
func zrangeArgs(rdb *redis.Client, key string) {
	ids := rdb.ZRangeArgs(ctx, redis.ZRangeArgs{Key: key, Start: "-inf", Stop: "+inf", ByScore: true}).Val() // want `racy poller: ZRANGE BYSCORE`
	rdb.ZRem(ctx, key, ids)
	runAll(ids)
}

func viaDo(rdb *redis.Client, key string) {
	res, _ := rdb.Do(ctx, "zrangebyscore", key, "-inf", "+inf").Result() // want `racy poller: ZRANGEBYSCORE reads due members of key here, and ZREM at a.go:84`
	rdb.Do(ctx, "ZREM", key, res)
	runAll(res)
	rdb.Do(ctx, "ZRANGE", key, "-inf", "+inf", "BYSCORE") // want `racy poller: ZRANGE BYSCORE`
	rdb.Do(ctx, "ZREM", key, "x")
}

// go-redis v8 and redigo.
func v8(rdb *redisv8.Client, key string) {
	ids, _ := rdb.ZRangeByScore(ctx, key, &redisv8.ZRangeBy{Max: "+inf"}).Result() // want `racy poller`
	for _, id := range ids {
		rdb.ZRem(ctx, key, id)
		run(id)
	}
}

func withRedigo(c redigo.Conn, key string) {
	ids, _ := redigo.Strings(c.Do("ZRANGEBYSCORE", key, "-inf", time.Now().Unix())) // want `racy poller`
	for _, id := range ids {
		c.Do("ZREM", key, id)
		run(id)
	}
}

func run(string) {}

// runAll hands jobs to workers.
func runAll(any) {}
