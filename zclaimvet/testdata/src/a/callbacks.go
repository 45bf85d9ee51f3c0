package a

import (
	"time"

	"github.com/bsm/redislock"
	"github.com/redis/go-redis/v9"
)

// A message handed out with a callback that acknowledges it: the callback,
// kept in the message or returned, removes the member when the consumer
// calls it, after the read.
type message struct {
	ID  string
	Ack func()
}

func dequeueAcked(rdb *redis.Client, key string) []message {
	var ms []message
	for _, id := range rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Max: "+inf"}).Val() { // want `racy poller: ZRANGEBYSCORE reads due members of key here, and ZREM at callbacks.go:21`
		ms = append(ms, message{ID: id, Ack: func() { rdb.ZRem(ctx, key, id) }})
	}
	return ms
}

func dequeueReturned(rdb *redis.Client, key string) ([]string, func()) {
	ids := rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Max: "+inf"}).Val() // want `racy poller: ZRANGEBYSCORE reads due members of key here, and ZREM at callbacks.go:28`
	return ids, func() { rdb.ZRem(ctx, key, toAny(ids)...) }
}

// Each member under a lock that the callback lets go after its removal.
func dequeueLocked(rdb *redis.Client, locker *redislock.Client, key string) []message {
	var ms []message
	for _, id := range rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Max: "+inf"}).Val() { // want `racy poller with a lock per job: .* the redislock Obtain at callbacks.go:35 locks one, and ZREM at callbacks.go:40 removes it, but the lock is let go at callbacks.go:41`
		lock, err := locker.Obtain(ctx, "lock:"+id, time.Second, nil)
		if err != nil {
			continue
		}
		ms = append(ms, message{ID: id, Ack: func() {
			rdb.ZRem(ctx, key, id)
			lock.Release(ctx)
		}})
	}
	return ms
}

// The twins: the callback's ZREM count decides, or the callback removes
// from another key.
func dequeueChecked(rdb *redis.Client, key string) []message {
	var ms []message
	for _, id := range rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Max: "+inf"}).Val() { // want `checked ZREM at callbacks.go:53`
		ms = append(ms, message{ID: id, Ack: func() {
			if rdb.ZRem(ctx, key, id).Val() == 1 {
				run(id)
			}
		}})
	}
	return ms
}

func dequeueElsewhere(rdb *redis.Client, key string) []message { // want dequeueElsewhere:`read ⟨p1⟩, rm ⟨p1⟩ \+ ":done"`
	var ms []message
	for _, id := range rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Max: "+inf"}).Val() {
		ms = append(ms, message{ID: id, Ack: func() { rdb.ZRem(ctx, key+":done", id) }})
	}
	return ms
}
