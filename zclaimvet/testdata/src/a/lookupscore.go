package a

import (
	"strconv"
	"strings"
	"time"

	redigo "github.com/gomodule/redigo/redis"
	"github.com/redis/go-redis/v9"
)

// A store finds one job by the time it was scheduled for (a key of "time
// and id" that its caller holds) and removes it, telling whether it went:
// a lookup of the score its caller names, no poll (quiet, through a
// helper, from the store's own callers). A tick that hands the helper the
// clock's current second reads what came due: reported.
type timed struct {
	rdb *redis.Client
	key string
}

func (t *timed) at(score float64) []string { // want at:`^zset\(lookup ⟨r⟩.key\)$`
	s := strconv.FormatFloat(score, 'f', -1, 64)
	return t.rdb.ZRangeByScore(ctx, t.key, &redis.ZRangeBy{Min: s, Max: s}).Val()
}

func (t *timed) forget(score float64, id string) (bool, error) { // want forget:`^zset\(lookup ⟨r⟩.key, rm ⟨r⟩.key\)$`
	for _, m := range t.at(score) {
		if strings.Contains(m, id) {
			n, err := t.rdb.ZRem(ctx, t.key, m).Result()
			return n == 1, err
		}
	}
	return false, nil
}

func (t *timed) forgetKey(key string) (bool, error) { // want forgetKey:`^zset\(lookup ⟨r⟩.key, rm ⟨r⟩.key\)$`
	at, id, _ := strings.Cut(key, "|")
	score, _ := strconv.ParseFloat(at, 64)
	return t.forget(score, id)
}

func (t *timed) tick() {
	now := float64(time.Now().Unix())
	for _, m := range t.at(now) { // want `racy poller: ZRANGEBYSCORE \(in at\) reads due members of t.key here, and ZREM at lookupscore.go:\d+ removes them`
		t.rdb.ZRem(ctx, t.key, m)
		run(m)
	}
}

// The same read of the current second in the function itself.
func (t *timed) second() {
	s := strconv.FormatInt(time.Now().Unix(), 10)
	for _, m := range t.rdb.ZRangeByScore(ctx, t.key, &redis.ZRangeBy{Min: s, Max: s}).Val() { // want `racy poller: ZRANGEBYSCORE reads due members of t.key here, and ZREM at lookupscore.go:\d+ removes them`
		t.rdb.ZRem(ctx, t.key, m)
		run(m)
	}
}

// A caller of a lookup sent by name (shapes.go's atScore) that hands it the
// clock's second and removes what it read: reported; one that hands it
// the score its own caller names: quiet.
func pollSecond(c redigo.Conn, key string) {
	ms, _ := atScore(c, key, time.Now().Unix()) // want `racy poller: ZRANGEBYSCORE \(in atScore\) reads due members of key here, and ZREM at lookupscore.go:\d+ removes them`
	for _, m := range ms {
		c.Do("ZREM", key, m)
		run(m)
	}
}

func forgetAt(c redigo.Conn, key string, score int64, id string) { // want forgetAt:`^zset\(lookup ⟨p1⟩, rm ⟨p1⟩\)$`
	ms, _ := atScore(c, key, score)
	for _, m := range ms {
		if strings.HasSuffix(m, id) {
			c.Do("ZREM", key, m)
		}
	}
}
