package a

import (
	"time"

	"github.com/bsm/redislock"
	"github.com/go-redsync/redsync/v4"
	"github.com/redis/go-redis/v9"
)

// Polls under a lock of a distributed-lock library: redsync's Mutex and
// redislock's Obtain take a key in Redis that expires, as a SET NX does.
func lockedRedsync(rdb *redis.Client, rs *redsync.Redsync, key string) error {
	mutex := rs.NewMutex("poll:" + key)
	if err := mutex.Lock(); err != nil {
		return err
	}
	defer mutex.Unlock()
	ids := rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Max: "100"}).Val() // want `poller under a lock: ZRANGEBYSCORE reads due members of key after the redsync Lock at locks.go:15`
	for _, id := range ids {
		run(id)
	}
	rdb.ZRem(ctx, key, toAny(ids)...)
	return nil
}

func lockedContext(rdb *redis.Client, m *redsync.Mutex, key string) error {
	if err := m.LockContext(ctx); err != nil {
		return err
	}
	defer m.Unlock()
	for _, id := range rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Max: "100"}).Val() { // want `after the redsync LockContext at`
		rdb.ZRem(ctx, key, id)
		run(id)
	}
	return nil
}

func lockedObtain(rdb *redis.Client, locker *redislock.Client, key string) error {
	lock, err := locker.Obtain(ctx, "poll:"+key, time.Second, nil)
	if err != nil {
		return err
	}
	defer lock.Release(ctx)
	for _, id := range rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Max: "100"}).Val() { // want `after the redislock Obtain at`
		rdb.ZRem(ctx, key, id)
		run(id)
	}
	return nil
}

// Their twins: the mutex's name read, or a lock released; none taken.
func lockNamed(rdb *redis.Client, m *redsync.Mutex, key string) {
	if m.Name() == "" {
		return
	}
	for _, id := range rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Max: "100"}).Val() { // want `racy poller`
		rdb.ZRem(ctx, key, id)
		run(id)
	}
}

func lockReleased(rdb *redis.Client, m *redsync.Mutex, key string) {
	m.Unlock()
	for _, id := range rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Max: "100"}).Val() { // want `racy poller`
		rdb.ZRem(ctx, key, id)
		run(id)
	}
}

// A poll whose every caller takes the lock first: the lock is the
// caller's, the report the poll's.
func pollHeld(rdb *redis.Client, key string) {
	for _, id := range rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Max: "100"}).Val() { // want `poller under a lock: ZRANGEBYSCORE reads due members of key after the redsync Lock at locks.go:82`
		rdb.ZRem(ctx, key, id)
		run(id)
	}
}

func monitor(rdb *redis.Client, m *redsync.Mutex, key string) {
	for {
		if err := m.Lock(); err == nil {
			pollHeld(rdb, key)
		}
	}
}

// The same, the caller leaving when the lock is not taken, or taking it
// in a statement of its own, in a select's case or not.
func pollGuarded(rdb *redis.Client, key string) {
	for _, id := range rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Max: "100"}).Val() { // want `poller under a lock: .* after the redsync TryLock at`
		rdb.ZRem(ctx, key, id)
		run(id)
	}
}

func monitorGuarded(rdb *redis.Client, m *redsync.Mutex, key string) error {
	if err := m.TryLock(); err != nil {
		return err
	}
	pollGuarded(rdb, key)
	return nil
}

func pollSelected(rdb *redis.Client, key string) {
	for _, id := range rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Max: "100"}).Val() { // want `poller under a lock: .* after the redsync Lock at`
		rdb.ZRem(ctx, key, id)
		run(id)
	}
}

func monitorSelect(rdb *redis.Client, m *redsync.Mutex, key string, tick <-chan time.Time) {
	for {
		select {
		case <-tick:
			if err := m.Lock(); err != nil {
				continue
			}
			pollSelected(rdb, key)
		}
	}
}

func pollObtained(rdb *redis.Client, key string) {
	for _, id := range rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Max: "100"}).Val() { // want `poller under a lock: .* after the redislock Obtain at`
		rdb.ZRem(ctx, key, id)
		run(id)
	}
}

func monitorObtain(rdb *redis.Client, locker *redislock.Client, key string) {
	lock, err := locker.Obtain(ctx, "poll", time.Second, nil)
	if err != nil {
		return
	}
	defer lock.Release(ctx)
	pollObtained(rdb, key)
}

// Its twins: a poll that one caller calls without the lock, one that
// another package may call (exported), and one called before the lock.
func pollOnceHeld(rdb *redis.Client, key string) {
	for _, id := range rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Max: "100"}).Val() { // want `racy poller`
		rdb.ZRem(ctx, key, id)
		run(id)
	}
}

func monitorTwice(rdb *redis.Client, m *redsync.Mutex, key string) {
	if err := m.Lock(); err == nil {
		pollOnceHeld(rdb, key)
	}
	pollOnceHeld(rdb, key)
}

func PollExported(rdb *redis.Client, key string) {
	for _, id := range rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Max: "100"}).Val() { // want `racy poller`
		rdb.ZRem(ctx, key, id)
		run(id)
	}
}

func monitorExported(rdb *redis.Client, m *redsync.Mutex, key string) {
	if err := m.Lock(); err == nil {
		PollExported(rdb, key)
	}
}

func pollBefore(rdb *redis.Client, key string) {
	for _, id := range rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Max: "100"}).Val() { // want `racy poller`
		rdb.ZRem(ctx, key, id)
		run(id)
	}
}

func monitorLate(rdb *redis.Client, m *redsync.Mutex, key string) error {
	pollBefore(rdb, key)
	return m.Lock()
}

func toAny(ids []string) []interface{} {
	out := make([]interface{}, len(ids))
	for i, id := range ids {
		out[i] = id
	}
	return out
}

// Their twins: a poll used as a value, whose calls are not all seen, and a
// lock taken by a goroutine the caller starts.
func pollValued(rdb *redis.Client, key string) {
	for _, id := range rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Max: "100"}).Val() { // want `racy poller`
		rdb.ZRem(ctx, key, id)
		run(id)
	}
}

func monitorValue(rdb *redis.Client, m *redsync.Mutex, key string) func(*redis.Client, string) {
	if err := m.Lock(); err == nil {
		pollValued(rdb, key)
	}
	return pollValued
}

func pollElsewhere(rdb *redis.Client, key string) {
	for _, id := range rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Max: "100"}).Val() { // want `racy poller`
		rdb.ZRem(ctx, key, id)
		run(id)
	}
}

func monitorElsewhere(rdb *redis.Client, m *redsync.Mutex, key string) {
	go func() { m.Lock() }()
	pollElsewhere(rdb, key)
}

// A lock taken by a helper of the project's, named for it: a poll after
// it is under that lock.
func acquireLock(rdb *redis.Client, key string) bool { // want acquireLock:`^zset\(lock SETNX\)$`
	return rdb.SetNX(ctx, key, 1, time.Second).Val()
}

func pollHelperLocked(rdb *redis.Client, key string) {
	if !acquireLock(rdb, "lock:"+key) {
		return
	}
	for _, id := range rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Max: "100"}).Val() { // want `poller under a lock: .* after the SETNX \(in acquireLock\) at locks.go:224`
		rdb.ZRem(ctx, key, id)
		run(id)
	}
}

func acquire(rdb *redis.Client, key string) (bool, error) { // want acquire:`^zset\(lock SET NX\)$`
	return rdb.SetArgs(ctx, key, 1, redis.SetArgs{Mode: "NX", TTL: time.Second}).Val() == "OK", nil
}

func pollAcquired(rdb *redis.Client, key string) {
	if ok, _ := acquire(rdb, "lock:"+key); !ok {
		return
	}
	for _, id := range rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Max: "100"}).Val() { // want `poller under a lock: .* after the SET NX \(in acquire\) at`
		rdb.ZRem(ctx, key, id)
		run(id)
	}
}

// Its twins: a helper that takes a SET NX but is not named for a lock
// (a mark), and one named for a release.
func markSeen(rdb *redis.Client, key string) bool {
	return rdb.SetNX(ctx, key, 1, time.Second).Val()
}

func pollMarked(rdb *redis.Client, key string) {
	if !markSeen(rdb, "seen:"+key) {
		return
	}
	for _, id := range rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Max: "100"}).Val() { // want `racy poller`
		rdb.ZRem(ctx, key, id)
		run(id)
	}
}

func unlockOrRelock(rdb *redis.Client, key string) bool {
	return rdb.SetNX(ctx, key, 1, time.Second).Val()
}

func pollUnlocked(rdb *redis.Client, key string) {
	if !unlockOrRelock(rdb, "lock:"+key) {
		return
	}
	for _, id := range rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Max: "100"}).Val() { // want `racy poller`
		rdb.ZRem(ctx, key, id)
		run(id)
	}
}

// A poll whose every caller takes the lock through a lock helper.
func pollHeldByHelper(rdb *redis.Client, key string) {
	for _, id := range rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Max: "100"}).Val() { // want `poller under a lock: .* after the SETNX \(in acquireLock\) at`
		rdb.ZRem(ctx, key, id)
		run(id)
	}
}

func monitorHelper(rdb *redis.Client, key string) {
	if !acquireLock(rdb, "lock:"+key) {
		return
	}
	pollHeldByHelper(rdb, key)
}
