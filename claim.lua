-- claim.lua: atomically take up to max due jobs and lease them.
-- KEYS[1] schedule ZSet (member = job id, score = due time in score units)
-- KEYS[2] in-flight ZSet (member = id .. "|" .. token, score = lease deadline, Unix ms)
-- KEYS[3] token counter (string: the last token)   KEYS[4] pending records hash (id -> record)
-- KEYS[5] run records hash (token -> record of a claimed run)
-- ARGV[1] max (1..1000)   ARGV[2] lease in ms   ARGV[3] score units per second (1 or 1000)
-- Returns {deadline_ms, first_token, now, next, id1, score1, record1|false, id2, ...}
--   where tokens run first_token, first_token+1, ... in reply order, now is
--   Redis TIME in score units and next is the earliest remaining score or
--   false (after a full batch: now, since more may be due); {0, 0, now, next}
--   when nothing is due. Error "ZCLAIM_WRONGTYPE key type".
local bad = wrongtype({KEYS[1], 'zset', KEYS[2], 'zset', KEYS[3], 'string', KEYS[4], 'hash', KEYS[5], 'hash'})
if bad then return redis.error_reply('ZCLAIM_WRONGTYPE ' .. bad) end

local max, lease, ups = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local now_ms, now, now_us = clock(ups)
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'WITHSCORES', 'LIMIT', 0, max)
local n = #due / 2
local function next_score()
  local head = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  if head[2] then return head[2] end
  return false
end
if n == 0 then return {0, 0, string.format('%.6f', now), next_score()} end

local ids = {}
for i = 1, n do ids[i] = due[2 * i - 1] end
redis.call('ZREM', KEYS[1], unpack(ids))

-- Tokens continue from the larger of the counter and Redis TIME in
-- microseconds, so they keep growing even if the counter is lost or rolled
-- back (an AOF that lost its last second, a failover to a lagging replica).
local base = tonumber(redis.call('GET', KEYS[3]) or '0') or 0
if now_us > base then base = now_us end
local first = base + 1
redis.call('SET', KEYS[3], string.format('%d', base + n))
local deadline = now_ms + lease
local recs = redis.call('HMGET', KEYS[4], unpack(ids))

local zadd, moved, hset = {}, {}, {}
local out = {deadline, first, string.format('%.6f', now), false}
for i = 1, n do
  local tok = string.format('%d', first + i - 1)
  zadd[2 * i - 1] = deadline
  zadd[2 * i] = ids[i] .. '|' .. tok
  out[#out + 1] = ids[i]
  out[#out + 1] = due[2 * i]
  out[#out + 1] = recs[i]
  if recs[i] then
    moved[#moved + 1] = ids[i]
    hset[#hset + 1] = tok
    hset[#hset + 1] = recs[i]
  end
end
redis.call('ZADD', KEYS[2], unpack(zadd))
if #moved > 0 then
  redis.call('HDEL', KEYS[4], unpack(moved))
  redis.call('HSET', KEYS[5], unpack(hset))
end
if n < max then out[4] = next_score() else out[4] = string.format('%.6f', now) end
return out
