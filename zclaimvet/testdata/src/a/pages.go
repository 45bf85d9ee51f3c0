package a

import (
	"github.com/redis/go-redis/v9"
)

// A console: one handler lists a page of the schedule by position, from
// the offset the user asked for; another removes the one job the user
// picked. A user's action on one member, not a poll (quiet). Its twin
// reads the head of the set (from 0) in one method and removes in
// another, as a poller's two halves do (reported).
type console struct {
	rdb *redis.Client
	key string
}

func (c *console) page(off int64) []redis.Z { // want page:`^zset\(read page ⟨r⟩.key\)$`
	return c.rdb.ZRangeWithScores(ctx, c.key, off, off+19).Val()
}

func (c *console) remove(id string) { // want remove:`^zset\(rm ⟨r⟩.key\)$`
	c.rdb.ZRem(ctx, c.key, id)
}

type halves struct {
	rdb *redis.Client
	key string
}

func (h *halves) head() []redis.Z { // want head:`^zset\(read ⟨r⟩.key\)$`
	return h.rdb.ZRangeWithScores(ctx, h.key, 0, 99).Val() // want `racy poller: ZRANGE WITHSCORES reads due members of h.key here, and ZREM at pages.go:\d+ removes them`
}

func (h *halves) done(id string) { // want done:`^zset\(rm ⟨r⟩.key\)$`
	h.rdb.ZRem(ctx, h.key, id)
}
