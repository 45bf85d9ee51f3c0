package a

import (
	"context"

	redigo "github.com/gomodule/redigo/redis"
	"github.com/redis/go-redis/v9"
)

// store is an interface the project declares over go-redis' client, for
// its tests: its methods are read as the client's.
type store interface {
	ZRangeByScore(ctx context.Context, key string, opt *redis.ZRangeBy) *redis.StringSliceCmd
	ZRem(ctx context.Context, key string, members ...interface{}) *redis.IntCmd
	TxPipelined(ctx context.Context, fn func(redis.Pipeliner) error) ([]redis.Cmder, error)
}

func viaStore(s store, key string) {
	ids := s.ZRangeByScore(ctx, key, &redis.ZRangeBy{Min: "-inf", Max: "100"}).Val() // want `racy poller: ZRANGEBYSCORE reads due members of key here, and ZREM at shaped.go:\d+`
	for _, id := range ids {
		s.ZRem(ctx, key, id)
		run(id)
	}
}

func viaStoreChecked(s store, key string) {
	for _, id := range s.ZRangeByScore(ctx, key, &redis.ZRangeBy{Max: "100"}).Val() { // want `checked ZREM`
		if s.ZRem(ctx, key, id).Val() == 1 {
			run(id)
		}
	}
}

// A sweep through it: the members go back to Redis only.
func sweepViaStore(s store, key string) {
	ids := s.ZRangeByScore(ctx, key, &redis.ZRangeBy{Max: "100"}).Val()
	for _, id := range ids {
		s.ZRem(ctx, key, id)
	}
}

// Its TxPipelined sends the read and the removal in one MULTI/EXEC.
func viaStoreTx(s store, key string) {
	var ids *redis.StringSliceCmd
	s.TxPipelined(ctx, func(p redis.Pipeliner) error {
		ids = p.ZRangeByScore(ctx, key, &redis.ZRangeBy{Max: "100"})
		p.ZRemRangeByScore(ctx, key, "-inf", "100")
		return nil
	})
	runAll(ids.Val())
}

// conn is an interface the project declares over redigo's connection.
type conn interface {
	Do(commandName string, args ...interface{}) (reply interface{}, err error)
	Send(commandName string, args ...interface{}) error
}

func viaConn(c conn, key string) {
	ids, _ := redigo.Strings(c.Do("ZRANGEBYSCORE", key, "-inf", "+inf")) // want `racy poller: ZRANGEBYSCORE reads due members of key here, and ZREM at shaped.go:\d+`
	for _, id := range ids {
		c.Send("ZREM", key, id)
		run(id)
	}
}

// A sweep through it: the members go back to Redis only.
func sweepViaConn(c conn, key string) {
	ids, _ := redigo.Strings(c.Do("ZRANGEBYSCORE", key, "-inf", "100"))
	for _, id := range ids {
		c.Do("ZREM", key, id)
		c.Do("DEL", "job:"+id)
	}
}

// An interface whose methods answer in types of their own is the
// project's abstraction, not the client: not read.
type ownStore interface {
	ZRangeByScore(key string, min, max int64) ([]string, error)
	ZRem(key string, ids ...string) (int64, error)
}

func viaOwnStore(s ownStore, key string) {
	ids, _ := s.ZRangeByScore(key, 0, 100)
	s.ZRem(key, ids...)
	runAll(ids)
}
