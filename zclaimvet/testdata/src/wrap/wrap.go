// Package wrap is a project's own client wrapper around go-redis. // want package:"uses github.com/redis/go-redis/v9"
// Its methods take the key and send one command each.
package wrap

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"
)

type Redis struct{ c *redis.Client }

func (r *Redis) ZRangeByScoreByOffset(key, min, max string, offset, count int64) []string { // want ZRangeByScoreByOffset:`read ⟨p0⟩`
	return r.c.ZRangeByScore(context.Background(), key, &redis.ZRangeBy{Min: min, Max: max, Offset: offset, Count: count}).Val()
}

func (r *Redis) ZRem(key string, members ...any) (int64, error) { // want ZRem:`rm ⟨p0⟩`
	return r.c.ZRem(context.Background(), key, members...).Result()
}

func (r *Redis) ZAdd(key string, score float64, member string) {}

func (r *Redis) TryLock(key string) bool { // want TryLock:`^zset\(lock SETNX\)$`
	return r.c.SetNX(context.Background(), key, 1, 0).Val()
}

// Unlock lets TryLock's lock go.
func (r *Redis) Unlock(key string) { // want Unlock:`^zset\(unlock\)$`
	r.c.Del(context.Background(), key)
}

// Client is the wrapper as an interface, the way callers hold it.
type Client interface {
	ZRangeByScoreByOffset(key, min, max string, offset, count int64) []string
	ZRem(key string, members ...any) (int64, error)
}

var _ Client = (*Redis)(nil)

// Timeout runs f under a deadline and returns its error: a wrapper whose
// code the packages calling it analyse without (its own, not theirs).
func Timeout(ctx context.Context, f func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	return f(ctx)
}

// OnMessage keeps f, to call it for each message that comes later.
func OnMessage(f func(string) error) { handlers = append(handlers, f) }

var handlers []func(string) error
