package b

import "wrap"

// zsets is the part of wrap's client this package uses, declared here (to
// hand a fake to its tests): its methods are wrap's, whose facts say what
// they send.
type zsets interface {
	ZRangeByScoreByOffset(key, min, max string, offset, count int64) []string
	ZRem(key string, members ...any) (int64, error)
}

type scanner struct{ rds zsets }

func newScanner(r *wrap.Redis) *scanner { return &scanner{rds: r} }

func (s *scanner) scan() {
	for _, id := range s.rds.ZRangeByScoreByOffset("delay:scan", "-inf", "100", 0, 10) { // want `racy poller: ZRANGEBYSCORE \(in ZRangeByScoreByOffset\) reads due members of "delay:scan"`
		s.rds.ZRem("delay:scan", id)
		run(id)
	}
}

// Its twin: a method of the same name but another signature is none of
// wrap's.
type otherZsets interface {
	ZRangeByScoreByOffset(key, min, max string, offset, count int64) []string
	ZRem(key string, member string) (int64, error)
}

type otherScanner struct{ rds otherZsets }

func (s *otherScanner) scan() { // want scan:`^zset\(read "delay:other"\)$`
	for _, id := range s.rds.ZRangeByScoreByOffset("delay:other", "-inf", "100", 0, 10) {
		s.rds.ZRem("delay:other", id)
		run(id)
	}
}
