package a

import (
	"log/slog"

	"github.com/redis/go-redis/v9"
)

// A reaper reads the claims whose deadline has passed and hands each to a
// script that takes it back if its score still says so (a script, as
// anywhere, is taken to claim what it is handed); a member whose job
// record is gone it drops with a plain ZREM, logs, and leaves: nothing
// runs on it, so two reapers that both drop it run nothing twice.
type reaper struct {
	rdb     *redis.Client
	scripts map[string]*redis.Script
}

func (r *reaper) run(name string, keys []string, args ...any) *redis.Cmd { // want run:`^zset\(runs ⟨p1⟩ ⟨p2⟩...\)$`
	return r.scripts[name].Run(ctx, r.rdb, keys, args...)
}

func (r *reaper) reap(key, threshold string) { // want reap:`^zset\(read ⟨p0⟩\)$`
	for _, id := range r.rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Min: "-inf", Max: threshold}).Val() {
		r.reapOne(key, id)
	}
}

func (r *reaper) reapOne(key, id string) {
	data := r.rdb.HGetAll(ctx, "job:"+id).Val()
	if len(data) == 0 {
		if err := r.rdb.ZRem(ctx, key, id).Err(); err != nil {
			slog.Error("removing an orphan", "id", id, "error", err)
			return
		}
		slog.Warn("removed an orphan", "id", id)
		return
	}
	r.run("reap", []string{key, "scheduled"}, id, data["retries"])
}

// The same in one function, the script a go-redis Script's own Run.
var reapScript = redis.NewScript(`return 0`)

func reapHere(rdb *redis.Client, key, threshold string) { // want reapHere:`^zset\(read ⟨p1⟩\)$`
	for _, id := range rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Min: "-inf", Max: threshold}).Val() {
		if rdb.Exists(ctx, "job:"+id).Val() == 0 {
			rdb.ZRem(ctx, key, id)
			continue
		}
		reapScript.Run(ctx, rdb, []string{key}, id)
	}
}

// Its twins: the dropped member run after all; pushed to a list where the
// script stood; handed to a script whose keys are not the key read.
func (r *reaper) reapRun(key, threshold string) {
	for _, id := range r.rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Min: "-inf", Max: threshold}).Val() { // want `racy poller: ZRANGEBYSCORE reads due members of key here, and ZREM at cleanups.go:60 removes`
		if r.rdb.Exists(ctx, "job:"+id).Val() == 0 {
			r.rdb.ZRem(ctx, key, id)
			run(id)
			return
		}
		r.run("reap", []string{key}, id)
	}
}

func (r *reaper) reapPush(key, threshold string) {
	for _, id := range r.rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Min: "-inf", Max: threshold}).Val() { // want `racy poller: ZRANGEBYSCORE reads due members of key here, and ZREM at cleanups.go:71 removes`
		if r.rdb.Exists(ctx, "job:"+id).Val() == 0 {
			r.rdb.ZRem(ctx, key, id)
			return
		}
		r.rdb.LPush(ctx, "ready", id)
	}
}

func (r *reaper) reapOther(key, threshold string) {
	for _, id := range r.rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Min: "-inf", Max: threshold}).Val() { // want `racy poller: ZRANGEBYSCORE reads due members of key here, and ZREM at cleanups.go:81 removes`
		if r.rdb.Exists(ctx, "job:"+id).Val() == 0 {
			r.rdb.ZRem(ctx, key, id)
			return
		}
		r.run("reap", []string{"scheduled"}, id)
	}
}
