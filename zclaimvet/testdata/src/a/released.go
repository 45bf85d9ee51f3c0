package a

import (
	"errors"
	"time"

	"github.com/bsm/redislock"
	"github.com/go-redsync/redsync/v4"
	redigo "github.com/gomodule/redigo/redis"
	"github.com/redis/go-redis/v9"
)

// A lock per member, taken after the read and let go after the removal:
// a worker that read the member before the removal takes the lock once
// it is let go, and runs the job again.
func releasedDel(rdb *redis.Client, key string) {
	for _, id := range rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Max: "+inf"}).Val() { // want `racy poller with a lock per job: ZRANGEBYSCORE reads due members of key, the SETNX at released.go:18 locks one, and ZREM at released.go:22 removes it, but the lock is let go at released.go:23`
		if !rdb.SetNX(ctx, "lock:"+id, 1, time.Minute).Val() {
			continue
		}
		run(id)
		rdb.ZRem(ctx, key, id)
		rdb.Del(ctx, "lock:"+id)
	}
}

// The same with the lock let go by a deferred DEL, by a lock library's
// release, and by the project's own helpers.
func releasedDeferred(rdb *redis.Client, key string) {
	for _, id := range rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Max: "+inf"}).Val() { // want `racy poller with a lock per job: .* the SET NX at released.go:32 locks one, and ZREM at released.go:37 removes it, but the lock is let go at released.go:35`
		func() {
			if rdb.SetArgs(ctx, "lock:"+id, 1, redis.SetArgs{Mode: "NX"}).Err() != nil {
				return
			}
			defer rdb.Do(ctx, "del", "lock:"+id)
			run(id)
			rdb.ZRem(ctx, key, id)
		}()
	}
}

func releasedObtain(rdb *redis.Client, locker *redislock.Client, key string) {
	for _, id := range rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Max: "+inf"}).Val() { // want `racy poller with a lock per job: .* the redislock Obtain at released.go:44 locks one, .* let go at released.go:50`
		lock, err := locker.Obtain(ctx, "lock:"+id, time.Second, nil)
		if err != nil {
			continue
		}
		run(id)
		rdb.ZRem(ctx, key, id)
		lock.Release(ctx)
	}
}

func releasedMutex(rdb *redis.Client, rs *redsync.Redsync, key string) {
	for _, id := range rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Max: "+inf"}).Val() { // want `racy poller with a lock per job: .* the redsync Lock at released.go:57 locks one, .* let go at released.go:62`
		m := rs.NewMutex("lock:" + id)
		if m.Lock() != nil {
			continue
		}
		run(id)
		rdb.ZRem(ctx, key, id)
		m.Unlock()
	}
}

func lockJob(rdb *redis.Client, id string) bool { // want lockJob:`zset\(lock SETNX\)`
	return rdb.SetNX(ctx, "job-lock:"+id, 1, time.Minute).Val()
}

func unlockJob(rdb *redis.Client, id string) { // want unlockJob:`zset\(unlock\)`
	rdb.Del(ctx, "job-lock:"+id)
}

var unlockScript = redis.NewScript(`if redis.call("GET", KEYS[1]) == ARGV[1] then return redis.call("DEL", KEYS[1]) end return 0`)

func releaseJob(rdb *redis.Client, id, token string) error { // want releaseJob:`zset\(unlock\)`
	return unlockScript.Run(ctx, rdb, []string{"job-lock:" + id}, token).Err()
}

func releasedHelpers(rdb *redis.Client, key string) {
	for _, id := range rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Max: "+inf"}).Val() { // want `racy poller with a lock per job: .* the SETNX \(in lockJob\) at released.go:82 locks one, .* let go at released.go:87`
		if !lockJob(rdb, id) {
			continue
		}
		run(id)
		rdb.ZRem(ctx, key, id)
		unlockJob(rdb, id)
	}
}

func releasedScript(rdb *redis.Client, key string) {
	for _, id := range rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Max: "+inf"}).Val() { // want `racy poller with a lock per job: .* let go at released.go:98`
		if !lockJob(rdb, id) {
			continue
		}
		run(id)
		rdb.ZRem(ctx, key, id)
		releaseJob(rdb, id, "t")
	}
}

// The lock taken and let go in the function that runs the job, called
// for each member the poll read: the removal is its caller's to pair.
func handleLocked(rdb *redis.Client, key, id string) { // want handleLocked:`zset\(rm ⟨p1⟩\)`
	if !rdb.SetNX(ctx, "lock:"+id, 1, time.Minute).Val() {
		return
	}
	defer rdb.Del(ctx, "lock:"+id)
	run(id)
	rdb.ZRem(ctx, key, id)
}

func pollHandled(rdb *redis.Client, key string) {
	for _, id := range rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Max: "+inf"}).Val() { // want `racy poller: ZRANGEBYSCORE reads due members of key here, and ZREM \(in handleLocked\) at released.go:115 removes them`
		handleLocked(rdb, key, id)
	}
}

// A checked ZREM under such a lock decides on its own.
func releasedChecked(rdb *redis.Client, key string) {
	for _, id := range rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Max: "+inf"}).Val() { // want `checked ZREM at released.go:125`
		if !rdb.SetNX(ctx, "lock:"+id, 1, time.Minute).Val() {
			continue
		}
		if rdb.ZRem(ctx, key, id).Val() == 1 {
			run(id)
		}
		rdb.Del(ctx, "lock:"+id)
	}
}

// Their twins, not reported: the lock let go only on the way out of a
// failed run (before the removal), or a DEL of another key (the job's
// payload) after the removal. (A lock kept until it expires is shapes.go's
// setNXGuard.)
func failedRunReleases(rdb *redis.Client, key string) { // want failedRunReleases:`read ⟨p1⟩`
	for _, id := range rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Max: "+inf"}).Val() {
		if !rdb.SetNX(ctx, "lock:"+id, 1, time.Hour).Val() {
			continue
		}
		if err := runErr(id); err != nil {
			rdb.Del(ctx, "lock:"+id)
			continue
		}
		rdb.ZRem(ctx, key, id)
	}
}

func payloadDeleted(rdb *redis.Client, key string) { // want payloadDeleted:`read ⟨p1⟩`
	for _, id := range rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Max: "+inf"}).Val() {
		if !rdb.SetNX(ctx, "lock:"+id, 1, time.Hour).Val() {
			continue
		}
		run(id)
		rdb.ZRem(ctx, key, id)
		rdb.Del(ctx, "job:"+id)
	}
}

func runErr(id string) error {
	if id == "" {
		return errors.New("empty")
	}
	return nil
}

// A worker started before the poll takes each member's lock and lets it
// go after the removal.
func releasedInWorker(rdb *redis.Client, key string) {
	ch := make(chan string)
	go func() {
		for id := range ch {
			if !rdb.SetNX(ctx, "lock:"+id, 1, time.Minute).Val() {
				continue
			}
			run(id)
			rdb.ZRem(ctx, key, id)
			rdb.Del(ctx, "lock:"+id)
		}
	}()
	for _, id := range rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Max: "+inf"}).Val() { // want `racy poller with a lock per job: .* the SETNX at released.go:173 locks one, and ZREM at released.go:177 removes it, but the lock is let go at released.go:178`
		ch <- id
	}
}

// The same through redigo: SET NX and DEL sent by name.
func releasedRedigo(c redigo.Conn, key string) {
	ids, _ := redigo.Strings(c.Do("ZRANGEBYSCORE", key, "-inf", "+inf")) // want `racy poller with a lock per job: .* the SET NX at released.go:190 locks one, and ZREM at released.go:194 removes it, but the lock is let go at released.go:195`
	for _, id := range ids {
		if reply, _ := c.Do("SET", "lock:"+id, 1, "NX", "EX", 60); reply == nil {
			continue
		}
		run(id)
		c.Do("ZREM", key, id)
		c.Do("DEL", "lock:"+id)
	}
}

// A lock kept as the done mark where the run succeeds (the removal, then
// on to the next member), and let go only where it failed: the release
// does not follow the removal.
func successKeepsLock(rdb *redis.Client, key string) { // want successKeepsLock:`read ⟨p1⟩`
	for _, id := range rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Max: "+inf"}).Val() {
		if !rdb.SetNX(ctx, "lock:"+id, 1, time.Hour).Val() {
			continue
		}
		if runErr(id) == nil {
			rdb.ZRem(ctx, key, id)
			continue
		}
		rdb.Del(ctx, "lock:"+id)
	}
}

// The same kept lock, the two paths an if's body and its else, or two
// clauses of a switch: only one of them runs.
func successElseReleases(rdb *redis.Client, key string) { // want successElseReleases:`read ⟨p1⟩`
	for _, id := range rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Max: "+inf"}).Val() {
		if !rdb.SetNX(ctx, "lock:"+id, 1, time.Hour).Val() {
			continue
		}
		if runErr(id) == nil {
			rdb.ZRem(ctx, key, id)
		} else if id != "" {
			rdb.Del(ctx, "lock:"+id)
		}
	}
}

func successCaseReleases(rdb *redis.Client, key string) { // want successCaseReleases:`read ⟨p1⟩`
	for _, id := range rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Max: "+inf"}).Val() {
		if !rdb.SetNX(ctx, "lock:"+id, 1, time.Hour).Val() {
			continue
		}
		switch err := runErr(id); {
		case err == nil:
			rdb.ZRem(ctx, key, id)
		default:
			rdb.Del(ctx, "lock:"+id)
		}
	}
}

// Their twins: the release after the if or the switch, which every path
// reaches (a break leaves the switch only).
func releasedAfterElse(rdb *redis.Client, key string) {
	for _, id := range rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Max: "+inf"}).Val() { // want `racy poller with a lock per job: .* the SETNX at released.go:248 locks one, and ZREM at released.go:252 removes it, but the lock is let go at released.go:256`
		if !rdb.SetNX(ctx, "lock:"+id, 1, time.Hour).Val() {
			continue
		}
		if runErr(id) == nil {
			rdb.ZRem(ctx, key, id)
		} else {
			run(id)
		}
		rdb.Del(ctx, "lock:"+id)
	}
}

func releasedAfterBreak(rdb *redis.Client, key string) {
	for _, id := range rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Max: "+inf"}).Val() { // want `racy poller with a lock per job: .* the SETNX at released.go:262 locks one, and ZREM at released.go:267 removes it, but the lock is let go at released.go:272`
		if !rdb.SetNX(ctx, "lock:"+id, 1, time.Hour).Val() {
			continue
		}
		switch err := runErr(id); {
		case err == nil:
			rdb.ZRem(ctx, key, id)
			break
		default:
			run(id)
		}
		rdb.Del(ctx, "lock:"+id)
	}
}

// A select's clauses: the member handed on and removed, or the lock let
// go when the poll is cancelled. Not reported.
func handedOrReleased(rdb *redis.Client, key string, work chan<- string) { // want handedOrReleased:`read ⟨p1⟩`
	for _, id := range rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Max: "+inf"}).Val() {
		if !rdb.SetNX(ctx, "lock:"+id, 1, time.Hour).Val() {
			continue
		}
		select {
		case work <- id:
			rdb.ZRem(ctx, key, id)
		case <-ctx.Done():
			rdb.Del(ctx, "lock:"+id)
		}
	}
}

// A clause that falls through into the release's: reported.
func fallsIntoRelease(rdb *redis.Client, key string) {
	for _, id := range rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Max: "+inf"}).Val() { // want `racy poller with a lock per job: .* the SETNX at released.go:295 locks one, and ZREM at released.go:300 removes it, but the lock is let go at released.go:303`
		if !rdb.SetNX(ctx, "lock:"+id, 1, time.Hour).Val() {
			continue
		}
		switch err := runErr(id); {
		case err == nil:
			rdb.ZRem(ctx, key, id)
			fallthrough
		default:
			rdb.Del(ctx, "lock:"+id)
		}
	}
}
