-- kill.lua: end a claimed run and put it into the dead set, fenced by token.
-- KEYS[1] in-flight ZSet   KEYS[2] run records   KEYS[3] dead ZSet   KEYS[4] dead info hash
-- ARGV[1] in-flight member (id .. "|" .. token)   ARGV[2] reason
-- Returns 1 when dead, 0 when the token is not current.
local bad = wrongtype({KEYS[1], 'zset', KEYS[2], 'hash', KEYS[3], 'zset', KEYS[4], 'hash'})
if bad then return redis.error_reply('ZCLAIM_WRONGTYPE ' .. bad) end
if redis.call('ZREM', KEYS[1], ARGV[1]) == 0 then return 0 end
local id, tok, mdue = split_member(ARGV[1])
local now_ms = clock(1)
local attempt, due, rest = take_run(KEYS[2], tok, mdue)
bury(KEYS[3], KEYS[4], id, now_ms, attempt, due, rest, ARGV[2])
return 1
