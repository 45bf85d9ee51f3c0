-- retry.lua: end a claimed run and put it back on the schedule (or into the
-- dead set after its last attempt), fenced by its token.
-- KEYS[1] schedule ZSet   KEYS[2] in-flight ZSet   KEYS[3] pending records
-- KEYS[4] run records   KEYS[5] dead ZSet   KEYS[6] dead info hash
-- ARGV[1] in-flight member (id .. "|" .. token)   ARGV[2] "at" or "in"
-- ARGV[3] score (at) or delay in ms (in)   ARGV[4] max attempts
-- ARGV[5] score units per second   ARGV[6] notice channel
-- Returns 0 when the token is not current, 1 when requeued, 2 when dead,
-- 3 when a newer entry of the id is scheduled and stands for this run.
local bad = wrongtype({KEYS[1], 'zset', KEYS[2], 'zset', KEYS[3], 'hash', KEYS[4], 'hash', KEYS[5], 'zset', KEYS[6], 'hash'})
if bad then return redis.error_reply('ZCLAIM_WRONGTYPE ' .. bad) end
if redis.call('ZREM', KEYS[2], ARGV[1]) == 0 then return 0 end
local id, tok, mdue = split_member(ARGV[1])
local ups = tonumber(ARGV[5])
local now_ms, now = clock(ups)
local score = tonumber(ARGV[3])
if ARGV[2] == 'in' then score = now + score * ups / 1000 end
local attempt, due, rest = take_run(KEYS[4], tok, mdue)
local r = settle_back(KEYS[1], KEYS[3], KEYS[5], KEYS[6], id, attempt, due, rest, score,
  tonumber(ARGV[4]), now_ms, 'attempts exhausted')
if r == 1 then notify(ARGV[6], score) end
return r
