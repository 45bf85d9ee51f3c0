package a

import (
	"strconv"

	"github.com/redis/go-redis/v9"
)

// A scheduler that reads the head of the set by position, tests each due
// time in Go and pushes the due ids to a work list without removing them:
// an id leaves the set only when its worker, having run it, books its
// next time (or drops it). Until then every tick, on every instance,
// pushes it again (reported at the read).
type sched struct{ rdb *redis.Client }

func (s *sched) tick(now float64) { // want tick:`^zset\(read "sched:jobs"\)$`
	head := s.rdb.ZRangeWithScores(ctx, "sched:jobs", 0, 99).Val() // want `racy poller: ZRANGE WITHSCORES reads due members of "sched:jobs" here, and RPUSH at handoffs.go:\d+ hands them on without removing them; they leave the set only when ZADD at handoffs.go:\d+ takes them out later`
	for _, z := range head {
		if z.Score > now {
			break
		}
		s.rdb.RPush(ctx, "sched:work", z.Member)
	}
}

// booked is the worker's update once it ran the job: its next time.
func (s *sched) booked(id string, next float64) { // want booked:`^zset\(mv ⟨p0⟩ to "sched:jobs"\)$`
	s.rdb.ZAdd(ctx, "sched:jobs", redis.Z{Score: next, Member: id})
}

// The same tick with the id taken out before the push, the removal's
// count tested (only one instance removes it): no hand-off, but a checked
// poller (its milder report). And a tick that reads the head only to
// know how long to sleep hands no member on (quiet).
func (s *sched) tickMoved(now float64) {
	head := s.rdb.ZRangeWithScores(ctx, "sched:moved", 0, 99).Val() // want `checked ZREM at handoffs.go:\d+ after ZRANGE WITHSCORES on "sched:moved"`
	for _, z := range head {
		if z.Score > now {
			break
		}
		if s.rdb.ZRem(ctx, "sched:moved", z.Member).Val() == 1 {
			s.rdb.RPush(ctx, "sched:work", z.Member)
		}
	}
}

func (s *sched) bookedMoved(id string, next float64) { // want bookedMoved:`^zset\(mv ⟨p0⟩ to "sched:moved"\)$`
	s.rdb.ZAdd(ctx, "sched:moved", redis.Z{Score: next, Member: id})
}

func (s *sched) nap(now float64) float64 { // want nap:`^zset\(read "sched:jobs"\)$`
	head := s.rdb.ZRangeWithScores(ctx, "sched:jobs", 0, 0).Val()
	if len(head) == 0 {
		return 1
	}
	s.rdb.Publish(ctx, "sched:naps", strconv.FormatFloat(head[0].Score-now, 'f', -1, 64))
	return head[0].Score - now
}

// A hand-off of a set no code of the package removes from (its members
// leave by another program, or by expiry): not paired with anything
// (quiet), as the analyzer cannot tell.
func (s *sched) tickForeign(now string) { // want tickForeign:`^zset\(read "sched:foreign"\)$`
	ids := s.rdb.ZRangeByScore(ctx, "sched:foreign", &redis.ZRangeBy{Min: "-inf", Max: now}).Val()
	for _, id := range ids {
		s.rdb.LPush(ctx, "sched:work", id)
	}
}
