// Package naive is an implementation of queue.Queue whose Remove does not tell whether it removed. // want package:"uses github.com/redis/go-redis/v9"
package naive

import (
	"context"

	"github.com/redis/go-redis/v9"
)

type Store struct {
	rdb *redis.Client
	key string
}

func (s *Store) Due(ctx context.Context, now string) ([]string, error) { // want Due:`^zset\(read ⟨r⟩.key\)$`
	return s.rdb.ZRangeByScore(ctx, s.key, &redis.ZRangeBy{Min: "-inf", Max: now}).Result() // want `racy poller: ZRANGEBYSCORE reads due members of s.key here, and ZREM at naive.go:\d+ removes them`
}

// Remove removes the id and says nothing of whether it was there.
func (s *Store) Remove(ctx context.Context, id string) (bool, error) { // want Remove:`^zset\(rm ⟨r⟩.key\)$`
	return true, s.rdb.ZRem(ctx, s.key, id).Err()
}
