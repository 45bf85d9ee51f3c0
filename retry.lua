-- retry.lua: end a claimed run and put it back on the schedule (or into the
-- dead set after its last attempt), fenced by its token.
-- KEYS[1] schedule ZSet   KEYS[2] in-flight ZSet   KEYS[3] pending records
-- KEYS[4] run records   KEYS[5] dead ZSet   KEYS[6] dead info hash
-- ARGV[1] member   ARGV[2] id   ARGV[3] token   ARGV[4] "at" or "in"
-- ARGV[5] score (at) or delay in ms (in)   ARGV[6] max attempts   ARGV[7] score units per second
-- ARGV[8] notice channel
-- Returns 0 when the token is not current, 1 when requeued, 2 when dead.
local bad = wrongtype({KEYS[1], 'zset', KEYS[2], 'zset', KEYS[3], 'hash', KEYS[4], 'hash', KEYS[5], 'zset', KEYS[6], 'hash'})
if bad then return redis.error_reply('ZCLAIM_WRONGTYPE ' .. bad) end
if redis.call('ZREM', KEYS[2], ARGV[1]) == 0 then return 0 end
local ups = tonumber(ARGV[7])
local now_ms, now = clock(ups)
local score = tonumber(ARGV[5])
if ARGV[4] == 'in' then score = now + score * ups / 1000 end
local r = settle_back(KEYS[1], KEYS[3], KEYS[4], KEYS[5], KEYS[6], ARGV[2], ARGV[3], score,
  tonumber(ARGV[6]), now_ms, 'attempts exhausted')
if r == 1 then redis.call('PUBLISH', ARGV[8], score) end
return r
