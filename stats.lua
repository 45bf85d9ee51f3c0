-- stats.lua: counts of a schedule at one instant of Redis time.
-- KEYS[1] schedule ZSet   KEYS[2] in-flight ZSet   KEYS[3] dead ZSet
-- ARGV[1] score units per second
-- Returns {scheduled, due, inflight, expired, dead, next|false, now}
-- where next is the earliest scheduled score and now is Redis TIME in score units.
local bad = wrongtype({KEYS[1], 'zset', KEYS[2], 'zset', KEYS[3], 'zset'})
if bad then return redis.error_reply('ZCLAIM_WRONGTYPE ' .. bad) end
local now_ms, now = clock(tonumber(ARGV[1]))
local head = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
return {
  redis.call('ZCARD', KEYS[1]),
  redis.call('ZCOUNT', KEYS[1], '-inf', now),
  redis.call('ZCARD', KEYS[2]),
  redis.call('ZCOUNT', KEYS[2], '-inf', now_ms),
  redis.call('ZCARD', KEYS[3]),
  head[2] or false,
  string.format('%.6f', now),
}
