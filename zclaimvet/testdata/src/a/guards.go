package a

import (
	"fmt"

	"github.com/redis/go-redis/v9"
)

// A reaper reads the expired members and hands each to a helper that
// removes it, tests the count and returns early when another reaper took
// it first, before the requeue it does itself: the helper's test decides,
// though it returns only an error (checked). A helper that returns the
// outcome its caller ignores, or one that tests only the error, decides
// nothing (racy).
type reaper struct{ rdb *redis.Client }

func (r *reaper) requeueOne(id string) error { // want requeueOne:`^zset\(rm "inflight"\)$`
	n, err := r.rdb.ZRem(ctx, "inflight", id).Result()
	if err != nil {
		return err
	}
	if n == 0 {
		return nil
	}
	return r.rdb.LPush(ctx, "ready", id).Err()
}

func (r *reaper) reap(now string) {
	ids := r.rdb.ZRangeByScore(ctx, "inflight", &redis.ZRangeBy{Min: "-inf", Max: now}).Val() // want `checked ZREM at guards.go:\d+ after ZRANGEBYSCORE on "inflight"`
	for _, id := range ids {
		r.requeueOne(id)
	}
}

func (r *reaper) removed(id string) bool { // want removed:`^zset\(rm "inflight2"\)$`
	n := r.rdb.ZRem(ctx, "inflight2", id).Val()
	if n == 0 {
		return false
	}
	r.rdb.Incr(ctx, "reaped")
	return true
}

func (r *reaper) reapIgnoring(now string) {
	ids := r.rdb.ZRangeByScore(ctx, "inflight2", &redis.ZRangeBy{Min: "-inf", Max: now}).Val() // want `racy poller: ZRANGEBYSCORE reads due members of "inflight2" here, and ZREM \(in removed\)`
	for _, id := range ids {
		r.removed(id)
		r.rdb.LPush(ctx, "ready", id)
	}
}

func (r *reaper) removeErr(id string) error { // want removeErr:`^zset\(rm "inflight3"\)$`
	if err := r.rdb.ZRem(ctx, "inflight3", id).Err(); err != nil {
		return err
	}
	return r.rdb.LPush(ctx, "ready", id).Err()
}

func (r *reaper) reapErrOnly(now string) {
	ids := r.rdb.ZRangeByScore(ctx, "inflight3", &redis.ZRangeBy{Min: "-inf", Max: now}).Val() // want `racy poller: ZRANGEBYSCORE reads due members of "inflight3" here, and ZREM \(in removeErr\)`
	for _, id := range ids {
		r.removeErr(id)
	}
}

// Keys made by one format: the promoter reads the default queue's delayed
// set and removes each job from the set of the queue its record names,
// the same set (racy). Two constant queue names are two sets (quiet).
const delayedFmt = "jobs:delayed:%s"

type fmtJob struct{ ID, Queue string }

func (r *reaper) promote(now string) {
	ids := r.rdb.ZRangeByScore(ctx, fmt.Sprintf(delayedFmt, "default"), &redis.ZRangeBy{Min: "-inf", Max: now}).Val() // want `racy poller: ZRANGEBYSCORE reads due members of fmt.Sprintf\(delayedFmt, "default"\) here, and ZREM at guards.go:\d+`
	for _, id := range ids {
		var j fmtJob
		j.ID, j.Queue = id, r.rdb.HGet(ctx, "job:"+id, "queue").Val()
		pipe := r.rdb.Pipeline()
		pipe.ZRem(ctx, fmt.Sprintf(delayedFmt, j.Queue), j.ID)
		pipe.LPush(ctx, "ready", j.ID)
		pipe.Exec(ctx)
	}
}

func (r *reaper) otherQueue(now string) { // want otherQueue:`^zset\(read fmt.Sprintf\("jobs:delayed:%s", "low"\), rm fmt.Sprintf\("jobs:delayed:%s", "high"\)\)$`
	ids := r.rdb.ZRangeByScore(ctx, fmt.Sprintf(delayedFmt, "low"), &redis.ZRangeBy{Min: "-inf", Max: now}).Val()
	for _, id := range ids {
		r.rdb.HSet(ctx, "seen", id, now)
		r.rdb.ZRem(ctx, fmt.Sprintf(delayedFmt, "high"), id)
	}
}
