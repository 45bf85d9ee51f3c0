package a

import (
	"github.com/redis/go-redis/v9"
)

// A scheduler lists what waits (a filter's range, for a caller to show),
// and puts messages stuck in its processing set back on the schedule: it
// reads the processing set, removes each and adds it back to the waiting
// set. Two schedulers read the same stuck message: the processing read is
// reported. The waiting set's ZADD puts there a member read from another
// key, which moves nothing on the waiting set: its listing is quiet.
type restorer struct {
	rdb     *redis.Client
	waiting string
	working string
}

func (r *restorer) list(min, max string) []string { // want list:`^zset\(read ⟨r⟩.waiting\)$`
	return r.rdb.ZRangeByScore(ctx, r.waiting, &redis.ZRangeBy{Min: min, Max: max}).Val()
}

func (r *restorer) restore(cutoff string) {
	for _, z := range r.rdb.ZRangeByScoreWithScores(ctx, r.working, &redis.ZRangeBy{Min: "-inf", Max: cutoff}).Val() { // want `racy poller: ZRANGEBYSCORE reads due members of r.working here, and ZREM at restores.go:\d+ removes them`
		m := z.Member.(string)
		pipe := r.rdb.Pipeline()
		pipe.ZRem(ctx, r.working, m)
		pipe.ZAdd(ctx, r.waiting, redis.Z{Score: z.Score, Member: m})
		pipe.Exec(ctx)
	}
}

// Its twin moves what it read on the same key, to a later score: a
// reschedule of what came due, which two schedulers both do (reported).
func (r *restorer) postpone(now string, at float64) {
	for _, m := range r.rdb.ZRangeByScore(ctx, r.waiting, &redis.ZRangeBy{Min: "-inf", Max: now}).Val() { // want `racy poller: ZRANGEBYSCORE reads due members of r.waiting here, and ZADD at restores.go:\d+ moves them to a later score`
		r.rdb.ZAdd(ctx, r.waiting, redis.Z{Score: at, Member: m})
		run(m)
	}
}
