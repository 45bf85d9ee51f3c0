package a

import (
	"github.com/redis/go-redis/v9"
)

// A worker's start moves every member of its pending set back to the work
// list: it reads them all by rank, then removes each and pushes it on.
// Two workers starting at once push the same task twice: reported. A
// start that only counts or lists them is quiet.
type starter struct {
	rdb *redis.Client
}

func (s *starter) requeueAll() {
	ids := s.rdb.ZRange(ctx, "pending", 0, -1).Val() // want `racy poller: ZRANGE reads due members of "pending" here, and ZREM at rankpush.go:\d+ removes them`
	s.rdb.TxPipelined(ctx, func(pipe redis.Pipeliner) error {
		for _, id := range ids {
			pipe.ZRem(ctx, "pending", id)
			pipe.LPush(ctx, "work", id)
		}
		return nil
	})
}

func (s *starter) show() []string { // want show:`^zset\(rank "pending"\)$`
	return s.rdb.ZRange(ctx, "pending", 0, -1).Val()
}

func (s *starter) drop(id string) { // want drop:`^zset\(rm "pending"\)$`
	s.rdb.ZRem(ctx, "pending", id)
}
