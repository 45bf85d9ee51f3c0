package a

import redigo "github.com/gomodule/redigo/redis"

// The restore script with redigo: its keys are the first of the
// arguments, as many as NewScript was told.
var restoreRedigo = redigo.NewScript(2, `
for i = 1, #ARGV do
	redis.call('ZREM', KEYS[1], ARGV[i])
	redis.call('RPUSH', KEYS[2], ARGV[i])
end`)

func restoreWithRedigo(c redigo.Conn, now int64) {
	ids, _ := redigo.Strings(c.Do("ZRANGEBYSCORE", "inflight", "-inf", now)) // want `racy poller: ZRANGEBYSCORE reads due members of "inflight" here, and ZREM in a script at scripts_redigo.go:16 removes`
	for _, id := range ids {
		restoreRedigo.Do(c, "inflight", "ready", id)
	}
}

// Its twins: a script that tests its ZREM's reply, and a script told of
// one key, so that the in-flight set it is handed second is an argument,
// not its KEYS[2].
var claimRedigo = redigo.NewScript(2, `
if redis.call('ZREM', KEYS[1], ARGV[1]) == 1 then
	redis.call('RPUSH', KEYS[2], ARGV[1])
end`)

var oneKeyRedigo = redigo.NewScript(1, `
redis.call('ZREM', KEYS[2], ARGV[1])`)

func restoreWithRedigoChecked(c redigo.Conn, now int64) { // want restoreWithRedigoChecked:`^zset\(read "inflight"\)$`
	ids, _ := redigo.Strings(c.Do("ZRANGEBYSCORE", "inflight", "-inf", now))
	for _, id := range ids {
		claimRedigo.Do(c, "inflight", "ready", id)
		oneKeyRedigo.Do(c, "ready", "inflight", id)
	}
}

// EVAL sent by name: the keys follow the script and their count.
const restoreSrc = `
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('RPUSH', 'ready', ARGV[1])`

const restoreSecondSrc = `
redis.call('ZREM', KEYS[2], ARGV[1])`

func restoreByName(c redigo.Conn, now int64) {
	ids, _ := redigo.Strings(c.Do("ZRANGEBYSCORE", "inflight", "-inf", now)) // want `racy poller: ZRANGEBYSCORE reads due members of "inflight" here, and ZREM in a script at scripts_redigo.go:50 removes`
	for _, id := range ids {
		c.Do("EVAL", restoreSrc, 1, "inflight", id)
	}
}

// Its twin: told of one key, the script's KEYS[2] is none of the keys.
func restoreByNameOneKey(c redigo.Conn, now int64) { // want restoreByNameOneKey:`^zset\(read "inflight"\)$`
	ids, _ := redigo.Strings(c.Do("ZRANGEBYSCORE", "inflight", "-inf", now))
	for _, id := range ids {
		c.Do("EVAL", restoreSecondSrc, 1, "ready", "inflight", id)
	}
}
