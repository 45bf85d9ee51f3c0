// Package counted is an implementation of queue.Queue whose Remove tells whether this call removed the id. // want package:"uses github.com/redis/go-redis/v9"
package counted

import (
	"context"

	"github.com/redis/go-redis/v9"
)

type Store struct {
	rdb *redis.Client
	key string
}

func (s *Store) Due(ctx context.Context, now string) ([]string, error) { // want Due:`^zset\(read ⟨r⟩.key\)$`
	return s.rdb.ZRangeByScore(ctx, s.key, &redis.ZRangeBy{Min: "-inf", Max: now}).Result() // want `checked ZREM at counted.go:\d+ after ZRANGEBYSCORE on s.key`
}

// Remove says whether this call removed the id: the caller runs the job
// only then.
func (s *Store) Remove(ctx context.Context, id string) (bool, error) { // want Remove:`^zset\(rm ⟨r⟩.key\)$`
	n, err := s.rdb.ZRem(ctx, s.key, id).Result()
	return n == 1, err
}
