package a

import (
	"context"

	"github.com/redis/go-redis/v9"
)

// A reaper that reads the expired claims and hands them to a script whose
// source is in the code, which removes them from the in-flight set and
// puts them back on the queue without looking at their scores: a second
// reaper that read them too puts back a claim a worker took since.
var restoreScript = redis.NewScript(`
for i = 1, #ARGV do
	redis.call('ZREM', KEYS[1], ARGV[i])
	redis.call('ZADD', KEYS[2], 0, ARGV[i])
end
return #ARGV
`)

func restore(rdb *redis.Client, now string) {
	ids := rdb.ZRangeByScore(ctx, "inflight", &redis.ZRangeBy{Min: "-inf", Max: now}).Val() // want `racy poller: ZRANGEBYSCORE reads due members of "inflight" here, and ZREM in a script at scripts.go:23 removes`
	restoreScript.Run(ctx, rdb, []string{"inflight", "queue"}, toAny(ids)...)
}

func toAny(ids []string) []any {
	out := make([]any, len(ids))
	for i, id := range ids {
		out[i] = id
	}
	return out
}

// The same through the project's helpers: one runs a script of its
// source parameter, one builds the batch's arguments; by Eval too.
func exec(ctx context.Context, rdb *redis.Client, src string, keys []string, args ...any) error { // want exec:`^zset\(runs ⟨p3⟩ ⟨p4⟩... of ⟨p2⟩\)$`
	return redis.NewScript(src).Run(ctx, rdb, keys, args...).Err()
}

func restoreBatch(rdb *redis.Client, ids []string) error { // want restoreBatch:`^zset\(rm ⟨p1⟩ from "inflight"\)$`
	script := `
		for i = 1, #ARGV do
			if redis.call('EXISTS', 'job:' .. ARGV[i]) == 1 then
				redis.call('ZREM', KEYS[1], ARGV[i])
				redis.call('LPUSH', KEYS[2], ARGV[i])
			end
		end`
	keys := []string{"inflight", "ready"}
	args := make([]any, len(ids))
	for i, id := range ids {
		args[i] = id
	}
	return exec(ctx, rdb, script, keys, args...)
}

func restoreAll(rdb *redis.Client, now string) {
	ids, _ := rdb.ZRangeByScore(ctx, "inflight", &redis.ZRangeBy{Min: "-inf", Max: now}).Result() // want `racy poller: ZRANGEBYSCORE reads due members of "inflight" here, and ZREM in a script \(in restoreBatch\) at scripts.go:59 removes`
	for i := 0; i < len(ids); i += 100 {
		restoreBatch(rdb, ids[i:min(i+100, len(ids))])
	}
}

func restoreEval(rdb *redis.Client, now string) {
	ids := rdb.ZRangeByScore(ctx, "inflight", &redis.ZRangeBy{Min: "-inf", Max: now}).Val() // want `racy poller: ZRANGEBYSCORE reads due members of "inflight" here, and ZREM in a script at scripts.go:65 removes`
	rdb.Eval(ctx, "redis.call('ZREM', KEYS[1], unpack(ARGV))\nredis.call('RPUSH', KEYS[2], unpack(ARGV))", []string{"inflight", "ready"}, toAny(ids)...)
}

// Its twins: scripts that decide for themselves, by the score they read,
// by the reply of their ZREM, or by comparing a job's state with what the
// caller saw; a script whose source is not in the code (EVALSHA).
var recheckScript = redis.NewScript(`
for i = 1, #ARGV do
	local s = redis.call('ZSCORE', KEYS[1], ARGV[i])
	redis.call('ZREM', KEYS[1], ARGV[i])
	if s then redis.call('ZADD', KEYS[2], 0, ARGV[i]) end
end`)

var replyScript = redis.NewScript(`
for _, id in ipairs(ARGV) do
	local n = redis.call('ZREM', KEYS[1], id)
	if n == 1 then redis.call('RPUSH', KEYS[2], id) end
end`)

var casScript = redis.NewScript(`
local inflight = KEYS[1]
if redis.call('HGET', 'job:' .. ARGV[1], 'state') == ARGV[2] then
	redis.call('ZREM', inflight, ARGV[1])
	redis.call('RPUSH', KEYS[2], ARGV[1])
end`)

func restoreChecked(rdb *redis.Client, now, sha string) { // want restoreChecked:`^zset\(read "inflight"\)$`
	ids := rdb.ZRangeByScore(ctx, "inflight", &redis.ZRangeBy{Min: "-inf", Max: now}).Val()
	recheckScript.Run(ctx, rdb, []string{"inflight", "queue"}, toAny(ids)...)
	replyScript.Run(ctx, rdb, []string{"inflight", "ready"}, toAny(ids)...)
	for _, id := range ids {
		casScript.Run(ctx, rdb, []string{"inflight", "ready"}, id, "running")
	}
	rdb.EvalSha(ctx, sha, []string{"inflight", "ready"}, toAny(ids)...)
}

// A script handed nothing the read saw removes nothing the read saw.
func restoreOne(rdb *redis.Client, now string) int { // want restoreOne:`^zset\(read "inflight"\)$`
	n := len(rdb.ZRangeByScore(ctx, "inflight", &redis.ZRangeBy{Min: "-inf", Max: now}).Val())
	restoreScript.Run(ctx, rdb, []string{"inflight", "queue"}, "job-1")
	return n
}

// Scripts on one line: a ZREM that begins a statement after do (reported),
// and one whose reply an if on the same line tests (quiet).
func restoreOneLine(rdb *redis.Client, now string) {
	ids := rdb.ZRangeByScore(ctx, "inflight", &redis.ZRangeBy{Min: "-inf", Max: now}).Val() // want `racy poller: ZRANGEBYSCORE reads due members of "inflight" here, and ZREM in a script at scripts.go:112 removes`
	rdb.Eval(ctx, "for i = 1, #ARGV do redis.call('ZREM', KEYS[1], ARGV[i]) redis.call('RPUSH', KEYS[2], ARGV[i]) end",
		[]string{"inflight", "ready"}, toAny(ids)...)
}

func restoreOneLineTested(rdb *redis.Client, now string) { // want restoreOneLineTested:`^zset\(read "inflight"\)$`
	ids := rdb.ZRangeByScore(ctx, "inflight", &redis.ZRangeBy{Min: "-inf", Max: now}).Val()
	rdb.Eval(ctx, "for i = 1, #ARGV do if redis.call('ZREM', KEYS[1], ARGV[i]) == 1 then redis.call('RPUSH', KEYS[2], ARGV[i]) end end",
		[]string{"inflight", "ready"}, toAny(ids)...)
}

// A consumer whose script claims each message by its record: it reads the
// record, stops where it is gone, deletes it and removes the member, all
// in one script (quiet); its twin reads the record without deleting it,
// so two consumers both get it (reported).
var takeRecordScript = redis.NewScript(`
local body = redis.call('GET', 'msg:' .. ARGV[1])
if not body then return false end
redis.call('DEL', 'msg:' .. ARGV[1])
redis.call('ZREM', KEYS[1], ARGV[1])
return body`)

var peekRecordScript = redis.NewScript(`
local body = redis.call('GET', 'msg:' .. ARGV[1])
redis.call('ZREM', KEYS[1], ARGV[1])
return body`)

func consumeByRecord(rdb *redis.Client, now string) { // want consumeByRecord:`^zset\(read "delayed"\)$`
	for _, id := range rdb.ZRangeByScore(ctx, "delayed", &redis.ZRangeBy{Min: "-inf", Max: now}).Val() {
		body, _ := takeRecordScript.Run(ctx, rdb, []string{"delayed"}, id).Text()
		run(body)
	}
}

func consumeByPeek(rdb *redis.Client, now string) {
	for _, id := range rdb.ZRangeByScore(ctx, "delayed", &redis.ZRangeBy{Min: "-inf", Max: now}).Val() { // want `racy poller: ZRANGEBYSCORE reads due members of "delayed" here, and ZREM in a script at scripts.go:\d+ removes`
		body, _ := peekRecordScript.Run(ctx, rdb, []string{"delayed"}, id).Text()
		run(body)
	}
}
