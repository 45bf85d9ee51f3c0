package a

import (
	"time"

	redigo "github.com/gomodule/redigo/redis"
	"github.com/redis/go-redis/v9"
)

// Periodic jobs: each due member is run and put back on its key at its
// next time. The ZADD moves it out of the due range, as a removal does,
// in a separate request: a second worker that read it before runs it
// again.
func cronBare(rdb *redis.Client, key string) {
	for _, id := range rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Max: "+inf"}).Val() { // want `racy poller: ZRANGEBYSCORE reads due members of key here, and ZADD at rescheduled.go:17 moves them to a later score in a separate request; two workers read the same member before either moves it`
		run(id)
		rdb.ZAdd(ctx, key, redis.Z{Score: float64(time.Now().Add(time.Hour).Unix()), Member: id})
	}
}

func cronScores(rdb *redis.Client, key string) {
	for _, z := range rdb.ZRangeByScoreWithScores(ctx, key, &redis.ZRangeBy{Max: "+inf"}).Val() { // want `racy poller: .* ZADD at rescheduled.go:25 moves them to a later score`
		name := z.Member.(string)
		run(name)
		rdb.ZAddArgs(ctx, key, redis.ZAddArgs{XX: true, Members: []redis.Z{{Score: z.Score + 60, Member: name}}})
	}
}

func cronRedigo(c redigo.Conn, key string) {
	ids, _ := redigo.Strings(c.Do("ZRANGEBYSCORE", key, "-inf", "+inf")) // want `racy poller: .* ZADD at rescheduled.go:33 moves them to a later score`
	for _, id := range ids {
		run(id)
		c.Do("ZADD", key, time.Now().Add(time.Hour).Unix(), id)
	}
}

// Under a lock per job that is let go once the job has moved on.
func cronLocked(rdb *redis.Client, key string) {
	for _, id := range rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Max: "+inf"}).Val() { // want `racy poller with a lock per job: ZRANGEBYSCORE reads due members of key, the SETNX at rescheduled.go:40 locks one, and ZADD at rescheduled.go:44 moves it to a later score, but the lock is let go at rescheduled.go:45: a worker that read the member before the move`
		if !rdb.SetNX(ctx, "cron-lock:"+id, 1, time.Minute).Val() {
			continue
		}
		run(id)
		rdb.ZAdd(ctx, key, redis.Z{Score: float64(time.Now().Add(time.Hour).Unix()), Member: id})
		rdb.Del(ctx, "cron-lock:"+id)
	}
}

// Under a lock taken before the read.
func cronUnderLock(rdb *redis.Client, key string) {
	if !rdb.SetNX(ctx, "cron-poll", 1, time.Second).Val() {
		return
	}
	for _, id := range rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Max: "+inf"}).Val() { // want `poller under a lock: .* and ZADD at rescheduled.go:56 moves them to a later score: correct while that lock is held`
		run(id)
		rdb.ZAdd(ctx, key, redis.Z{Score: float64(time.Now().Add(time.Hour).Unix()), Member: id})
	}
}

// Not reported: a failed run put back after a checked ZREM took the job
// (the ZREM's report), a ZADD of a member that is not one the function
// goes over (a presence store's own heartbeat), and a sweep that only
// pushes what it read back (nothing runs on it).
func retryAfterChecked(rdb *redis.Client, key string) {
	for _, id := range rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Max: "+inf"}).Val() { // want `checked ZREM at rescheduled.go:66`
		if rdb.ZRem(ctx, key, id).Val() != 1 {
			continue
		}
		if runErr(id) != nil {
			rdb.ZAdd(ctx, key, redis.Z{Score: float64(time.Now().Add(time.Minute).Unix()), Member: id})
		}
	}
}

func presence(rdb *redis.Client, key, self string) []string { // want presence:`read ⟨p1⟩`
	online := rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Min: "100", Max: "+inf"}).Val()
	rdb.ZAdd(ctx, key, redis.Z{Score: float64(time.Now().Unix()), Member: self})
	return online
}

func touchAll(rdb *redis.Client, key string) {
	ids := rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Max: "+inf"}).Val()
	for _, id := range ids {
		rdb.ZAdd(ctx, key, redis.Z{Score: float64(time.Now().Add(time.Hour).Unix()), Member: id})
	}
}

// The same through helpers: one reads what is due, the other puts a
// member back at its next time. The second is a move only where its
// caller hands it a member the first read.
func dueReminders(rdb *redis.Client) []string { // want dueReminders:`zset\(read "reminders"\)`
	return rdb.ZRangeByScore(ctx, "reminders", &redis.ZRangeBy{Max: "+inf"}).Val()
}

func markReminded(rdb *redis.Client, token string, next time.Time) { // want markReminded:`zset\(mv ⟨p1⟩ to "reminders"\)`
	rdb.ZAdd(ctx, "reminders", redis.Z{Score: float64(next.Unix()), Member: token})
}

func remind(rdb *redis.Client) {
	for _, tok := range dueReminders(rdb) { // want `racy poller: ZRANGEBYSCORE \(in dueReminders\) reads due members of "reminders" here, and ZADD \(in markReminded\) at rescheduled.go:102 moves them to a later score`
		run(tok)
		markReminded(rdb, tok, time.Now().Add(time.Hour))
	}
}

// Its twin: new reminders, not what was read.
func addReminders(rdb *redis.Client, tokens []string) { // want addReminders:`zset\(read "reminders", mv ⟨p1⟩ to "reminders"\)`
	if len(dueReminders(rdb)) > 100 {
		return
	}
	for _, tok := range tokens {
		markReminded(rdb, tok, time.Now().Add(time.Hour))
	}
}

// A store's methods: Due reads, Schedule adds whatever it is given (a
// producer's call, unless a poll hands it what Due read).
type cronStore struct {
	rdb *redis.Client
	key string
}

func (s *cronStore) Due() []string { // want Due:`zset\(read ⟨r⟩.key\)`
	return s.rdb.ZRangeByScore(ctx, s.key, &redis.ZRangeBy{Max: "+inf"}).Val()
}

func (s *cronStore) Schedule(id string, at time.Time) { // want Schedule:`zset\(mv ⟨p0⟩ to ⟨r⟩.key\)`
	s.rdb.ZAdd(ctx, s.key, redis.Z{Score: float64(at.Unix()), Member: id})
}

func (s *cronStore) Poll() {
	for _, id := range s.Due() { // want `racy poller: ZRANGEBYSCORE \(in Due\) reads due members of s.key here, and ZADD \(in Schedule\) at rescheduled.go:134 moves them`
		run(id)
		s.Schedule(id, time.Now().Add(time.Minute))
	}
}

// A store whose methods no poll of the package calls together: its Add is
// a producer's until a caller hands it what Due read.
type jobStore struct {
	rdb *redis.Client
	key string
}

func (s *jobStore) Due() []string { // want Due:`zset\(read ⟨r⟩.key\)`
	return s.rdb.ZRangeByScore(ctx, s.key, &redis.ZRangeBy{Max: "+inf"}).Val()
}

func (s *jobStore) Add(id string, at time.Time) { // want Add:`zset\(mv ⟨p0⟩ to ⟨r⟩.key\)`
	s.rdb.ZAdd(ctx, s.key, redis.Z{Score: float64(at.Unix()), Member: id})
}

// ZADD NX only adds: a member that is there stays due.
func addMissing(rdb *redis.Client, c redigo.Conn, key string) { // want addMissing:`zset\(read ⟨p2⟩\)`
	for _, id := range rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Max: "+inf"}).Val() {
		run(id)
		rdb.ZAddNX(ctx, key, redis.Z{Score: 1, Member: id})
		rdb.ZAddArgs(ctx, key, redis.ZAddArgs{Members: []redis.Z{{Score: 1, Member: id}}, NX: true})
		c.Do("ZADD", key, "NX", 1, id)
	}
}
