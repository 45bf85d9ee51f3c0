package a

import (
	"time"

	"github.com/redis/go-redis/v9"
)

// A poller reached as a method value by a helper that takes a lock first
// (a leader's lease): reported as a poller under a lock, as one that
// takes the lock itself. Its twin is handed to a helper that takes none
// (reported racy).
type leaderSched struct{ rdb *redis.Client }

func (s *leaderSched) withLease(fn func()) {
	if s.rdb.SetNX(ctx, "sched:leader", "me", 10*time.Second).Val() {
		fn()
	}
}

func (s *leaderSched) withoutLease(fn func()) {
	fn()
}

func (s *leaderSched) pollLeased() {
	ids := s.rdb.ZRangeByScore(ctx, "leased:jobs", &redis.ZRangeBy{Max: "+inf"}).Val() // want `poller under a lock: ZRANGEBYSCORE reads due members of "leased:jobs" after the SETNX at helperlock.go:16`
	s.rdb.ZRem(ctx, "leased:jobs", ids)
	runAll(ids)
}

func (s *leaderSched) pollFree() {
	ids := s.rdb.ZRangeByScore(ctx, "free:jobs", &redis.ZRangeBy{Max: "+inf"}).Val() // want `racy poller`
	s.rdb.ZRem(ctx, "free:jobs", ids)
	runAll(ids)
}

func (s *leaderSched) Run() {
	s.withLease(s.pollLeased)
	s.withoutLease(s.pollFree)
}
