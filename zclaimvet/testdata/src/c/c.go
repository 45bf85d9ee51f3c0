// Package c polls through package rwrap. // want package:"uses github.com/gomodule/redigo/redis"
// The key is the first of the wrapper's arguments.
package c

import "rwrap"

func delayKey() string { return "delay:queue" }

func getExpired(now int64) []string { // want getExpired:`read ⟨g c.delayKey⟩\(\)`
	ids, _ := rwrap.ZRANGEBYSCORE(delayKey(), "0", now)
	return ids
}

func drop(id string) error { // want drop:`rm ⟨g c.delayKey⟩\(\)`
	return rwrap.ZREM(delayKey(), id)
}

func tick(now int64) {
	for _, id := range getExpired(now) { // want `racy poller: ZRANGEBYSCORE \(in ZRANGEBYSCORE\) reads due members of delayKey\(\) here, and ZREM \(in ZREM\) at c.go:21`
		rwrap.LPUSH("ready", id)
		drop(id)
	}
}

// The twin: another key.
func tickOther(now int64) { // want tickOther:`read "a", rm "b"`
	ids, _ := rwrap.ZRANGEBYSCORE("a", "0", now)
	rwrap.ZREM("b", ids[0])
}

// A wrapper's error tested is no check of the count.
func tickErr(now int64) {
	for _, id := range getExpired(now) { // want `racy poller`
		if err := drop(id); err != nil {
			return
		}
	}
}

// A wrapper that tests the count and returns the outcome: a check where
// the caller tests it, not where the caller drops it.
func take(id string) bool { // want take:`rm ⟨g c.delayKey⟩\(\)`
	n, _ := rwrap.Do("ZREM", delayKey(), id)
	return n == int64(1)
}

func tickTake(now int64) {
	for _, id := range getExpired(now) { // want `checked ZREM`
		if take(id) {
			rwrap.LPUSH("ready", id)
		}
	}
}

func tickDropped(now int64) {
	for _, id := range getExpired(now) { // want `racy poller`
		take(id)
		rwrap.LPUSH("ready", id)
	}
}

// Through the wrapper package's interface over redigo's connection.
func viaConn(c rwrap.Conn, now int64) {
	ids, _ := c.Do("ZRANGEBYSCORE", delayKey(), "0", now) // want `racy poller: ZRANGEBYSCORE reads due members of delayKey\(\) here, and ZREM at c.go:\d+`
	for _, id := range ids.([]interface{}) {
		c.Do("ZREM", delayKey(), id)
		rwrap.LPUSH("ready", id)
	}
}
