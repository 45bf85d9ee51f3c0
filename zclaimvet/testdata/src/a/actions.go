package a

import (
	"github.com/redis/go-redis/v9"
)

// A console's actions on the one job a user picked. kill finds the job in
// the listing and moves it to the dead set; requeue looks its score up and
// moves it to another set; drop deletes what sits at the one score the
// user named, and returns how many went. None reads due members to run
// them: quiet. Their twin reads the due members and removes each it read
// (reported).
type actions struct {
	rdb  *redis.Client
	key  string
	dead string
}

func (a *actions) kill(id string) error { // want kill:`^zset\(read ⟨r⟩.key, rm ⟨r⟩.key\)$`
	zs, err := a.rdb.ZRangeWithScores(ctx, a.key, 0, -1).Result()
	if err != nil {
		return err
	}
	for _, z := range zs {
		if z.Member == id {
			a.rdb.ZRem(ctx, a.key, z.Member)
			a.rdb.ZAdd(ctx, a.dead, redis.Z{Score: z.Score, Member: z.Member})
		}
	}
	return nil
}

func (a *actions) requeue(id, to string) error { // want requeue:`^zset\(score ⟨r⟩.key, rm ⟨r⟩.key, mv ⟨p0⟩ to ⟨p1⟩\)$`
	s, err := a.rdb.ZScore(ctx, a.key, id).Result()
	if err != nil {
		return err
	}
	if err := a.rdb.ZRem(ctx, a.key, id).Err(); err != nil {
		return err
	}
	return a.rdb.ZAdd(ctx, to, redis.Z{Score: s, Member: id}).Err()
}

func (a *actions) drop(at string) (int64, error) { // want drop:`^zset\(rm ⟨r⟩.key\)$`
	return a.rdb.ZRemRangeByScore(ctx, a.key, at, at).Result()
}

func (a *actions) due(now string) []string { // want due:`^zset\(read ⟨r⟩.key\)$`
	return a.rdb.ZRangeByScore(ctx, a.key, &redis.ZRangeBy{Min: "-inf", Max: now}).Val()
}

type sweeper struct {
	rdb *redis.Client
	key string
}

func (w *sweeper) poll(now string, run func(string)) {
	zs := w.rdb.ZRangeWithScores(ctx, w.key, 0, -1).Val() // want `racy poller: ZRANGE WITHSCORES reads due members of w.key here, and ZREM at actions.go:\d+ removes them`
	for _, z := range zs {
		if z.Score <= 1 {
			w.rdb.ZRem(ctx, w.key, z.Member)
			run(z.Member.(string))
		}
	}
}
