// Package b polls through package wrap's methods: shape 2 across packages. // want package:"uses github.com/redis/go-redis/v9"
package b

import "wrap"

type Service struct{ rds *wrap.Redis }

func (s *Service) Poll() {
	ids := s.rds.ZRangeByScoreByOffset("delay:jobs", "-inf", "+inf", 0, 100) // want `racy poller: ZRANGEBYSCORE \(in ZRangeByScoreByOffset\) reads due members of "delay:jobs" here, and ZREM \(in ZRem\) at b.go:11`
	for _, id := range ids {
		s.rds.ZRem("delay:jobs", id)
		run(id)
	}
}

// The twin: each ZREM's count decides who runs the job.
func (s *Service) PollChecked() {
	for _, id := range s.rds.ZRangeByScoreByOffset("delay:jobs", "-inf", "+inf", 0, 100) { // want `checked ZREM`
		if n, _ := s.rds.ZRem("delay:jobs", id); n == 1 {
			run(id)
		}
	}
}

// A batch ZREM through the wrapper, its count tested: still racy.
func (s *Service) PollBatch() {
	ids := s.rds.ZRangeByScoreByOffset("delay:jobs", "-inf", "+inf", 0, 100) // want `racy poller`
	if n, _ := s.rds.ZRem("delay:jobs", ids); n > 0 {
		for _, id := range ids {
			run(id)
		}
	}
}

func run(string) {}

// Through the interface: the implementation's facts apply.
type Store struct{ rds wrap.Client }

func (s *Store) GetReady(bucket string) []string {
	ids := s.rds.ZRangeByScoreByOffset(bucket, "0", "+inf", 0, 20) // want `racy poller: ZRANGEBYSCORE \(in ZRangeByScoreByOffset\) reads due members of bucket here`
	s.rds.ZRem(bucket, ids)
	return ids
}

// A poll under the wrapper's lock, from another package.
func (s *Service) PollLocked() {
	if !s.rds.TryLock("lock:delay:jobs") {
		return
	}
	for _, id := range s.rds.ZRangeByScoreByOffset("delay:jobs", "-inf", "+inf", 0, 100) { // want `poller under a lock: .* after the SETNX \(in TryLock\) at`
		s.rds.ZRem("delay:jobs", id)
		run(id)
	}
}

// A lock per job through the wrapper, let go after the removal.
func (s *Service) PollLockEach() {
	for _, id := range s.rds.ZRangeByScoreByOffset("delay:jobs", "-inf", "+inf", 0, 100) { // want `racy poller with a lock per job: .* the SETNX \(in TryLock\) at b.go:60 locks one, .* let go at b.go:65`
		if !s.rds.TryLock("lock:" + id) {
			continue
		}
		run(id)
		s.rds.ZRem("delay:jobs", id)
		s.rds.Unlock("lock:" + id)
	}
}
