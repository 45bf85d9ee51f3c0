-- stats.lua: counts of a schedule at one instant of Redis time.
-- KEYS[1] schedule ZSet   KEYS[2] in-flight ZSet   KEYS[3] dead ZSet
-- KEYS[4] batches ZSet   KEYS[5] run records hash   KEYS[6] state marker
-- ARGV[1] score units per second
-- Returns {scheduled, due, inflight, expired, dead, next|false, now, marker|false}
-- where next is the earliest scheduled score and now is Redis TIME in score
-- units. inflight and expired count jobs, those of batch leases included
-- (the expired ones of at most 1000 batch leases).
local bad = wrongtype({KEYS[1], 'zset', KEYS[2], 'zset', KEYS[3], 'zset', KEYS[4], 'zset', KEYS[5], 'hash', KEYS[6], 'string'})
if bad then return redis.error_reply('ZCLAIM_WRONGTYPE ' .. bad) end
local now_ms, now = clock(tonumber(ARGV[1]))
local head = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
local expired = redis.call('ZCOUNT', KEYS[2], '-inf', now_ms)
for _, m in ipairs(redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', now_ms, 'LIMIT', 0, 1000)) do
  local first, n = string.match(m, '^(%d+):'), tonumber(string.match(m, ':(%d+)$')) or 0
  -- Jobs of the lease already settled one by one (part.lua) are not in flight.
  expired = expired + unsettled(first and settled_places(KEYS[5], first, n), n)
end
return {
  redis.call('ZCARD', KEYS[1]),
  redis.call('ZCOUNT', KEYS[1], '-inf', now),
  redis.call('ZCARD', KEYS[2]) + (tonumber(redis.call('HGET', KEYS[5], 'batched')) or 0),
  expired,
  redis.call('ZCARD', KEYS[3]),
  head[2] or false,
  string.format('%.6f', now),
  redis.call('GET', KEYS[6]),
}
