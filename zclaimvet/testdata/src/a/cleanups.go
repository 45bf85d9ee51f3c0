package a

import (
	"log/slog"
	"strings"

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
	for _, id := range r.rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Min: "-inf", Max: threshold}).Val() { // want `racy poller: ZRANGEBYSCORE reads due members of key here, and ZREM at cleanups.go:61 removes`
		if r.rdb.Exists(ctx, "job:"+id).Val() == 0 {
			r.rdb.ZRem(ctx, key, id)
			run(id)
			return
		}
		r.run("reap", []string{key}, id)
	}
}

func (r *reaper) reapPush(key, threshold string) {
	for _, id := range r.rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Min: "-inf", Max: threshold}).Val() { // want `racy poller: ZRANGEBYSCORE reads due members of key here, and ZREM at cleanups.go:72 removes`
		if r.rdb.Exists(ctx, "job:"+id).Val() == 0 {
			r.rdb.ZRem(ctx, key, id)
			return
		}
		r.rdb.LPush(ctx, "ready", id)
	}
}

func (r *reaper) reapOther(key, threshold string) {
	for _, id := range r.rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Min: "-inf", Max: threshold}).Val() { // want `racy poller: ZRANGEBYSCORE reads due members of key here, and ZREM at cleanups.go:82 removes`
		if r.rdb.Exists(ctx, "job:"+id).Val() == 0 {
			r.rdb.ZRem(ctx, key, id)
			return
		}
		r.run("reap", []string{"scheduled"}, id)
	}
}

// A sweep whose read goes through the project's own wrapper, which only
// reads and returns: the expired members are removed with their records,
// and only how many there were is written.
type wrapped struct{ rdb *redis.Client }

func (w *wrapped) rangeByScore(key, max string) ([]string, error) { // want rangeByScore:`^zset\(read ⟨p0⟩\)$`
	res := w.rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Min: "-inf", Max: max})
	if res.Err() != nil {
		return nil, res.Err()
	}
	return res.Val(), nil
}

func (w *wrapped) expire(key, max string) error {
	ids, err := w.rangeByScore(key, max)
	if err != nil {
		return err
	}
	pipe := w.rdb.Pipeline()
	for _, id := range ids {
		pipe.ZRem(ctx, key, id)
		pipe.Del(ctx, "msg:"+id)
	}
	pipe.HIncrBy(ctx, "stats", "expired", int64(len(ids)))
	_, err = pipe.Exec(ctx)
	return err
}

// Its twins: a wrapper that does more than read (it pushes what it read),
// and a sweep that writes a member of the batch, not only how many.
func (w *wrapped) rangeAndPush(key, max string) []string { // want rangeAndPush:`^zset\(read ⟨p0⟩\)$`
	ids := w.rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Min: "-inf", Max: max}).Val()
	w.rdb.LPush(ctx, "ready", ids)
	return ids
}

func (w *wrapped) expirePushed(key, max string) {
	ids := w.rangeAndPush(key, max) // want `racy poller: ZRANGEBYSCORE \(in rangeAndPush\) reads due members of key here, and ZREM at cleanups.go:128 removes`
	for _, id := range ids {
		w.rdb.ZRem(ctx, key, id)
	}
}

func (w *wrapped) expireNoting(key, max string) {
	ids, _ := w.rangeByScore(key, max) // want `racy poller: ZRANGEBYSCORE \(in rangeByScore\) reads due members of key here, and ZREM at cleanups.go:135 removes`
	for _, id := range ids {
		w.rdb.ZRem(ctx, key, id)
	}
	w.rdb.HSet(ctx, "stats", "last", ids[len(ids)-1])
}

// A mover that drops a member it cannot parse (a ZREM, then continue:
// nothing runs on it) and takes the others by a ZREM of their own, its
// count tested: the second removal is the claim, and it is checked.
func moveParsed(rdb *redis.Client, key string) {
	for _, m := range rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Min: "-inf", Max: "+inf"}).Val() { // want `checked ZREM at cleanups.go:150 after ZRANGEBYSCORE on key`
		queue, id, ok := strings.Cut(m, "/")
		if !ok {
			rdb.ZRem(ctx, key, m)
			continue
		}
		if rdb.ZRem(ctx, key, m).Val() == 1 {
			rdb.RPush(ctx, queue, id)
		}
	}
}

// Its twins: the other removal unchecked (racy, and named), and the drop
// the only removal (racy: the parsed members are pushed and never taken).
func moveParsedRacy(rdb *redis.Client, key string) {
	for _, m := range rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Min: "-inf", Max: "+inf"}).Val() { // want `racy poller: ZRANGEBYSCORE reads due members of key here, and ZREM at cleanups.go:165 removes`
		queue, id, ok := strings.Cut(m, "/")
		if !ok {
			rdb.ZRem(ctx, key, m)
			continue
		}
		rdb.ZRem(ctx, key, m)
		rdb.RPush(ctx, queue, id)
	}
}

func moveParsedNever(rdb *redis.Client, key string) {
	for _, m := range rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Min: "-inf", Max: "+inf"}).Val() { // want `racy poller: ZRANGEBYSCORE reads due members of key here, and ZREM at cleanups.go:174 removes`
		queue, id, ok := strings.Cut(m, "/")
		if !ok {
			rdb.ZRem(ctx, key, m)
			continue
		}
		rdb.RPush(ctx, queue, id)
	}
}
