-- ack.lua: finish a claimed run, fenced by its token.
-- KEYS[1] in-flight ZSet   KEYS[2] run records hash
-- ARGV[1] in-flight member (id .. "|" .. token)   ARGV[2] token
-- Returns 1 when acked, 0 when the token is not current (lease lost).
local bad = wrongtype({KEYS[1], 'zset', KEYS[2], 'hash'})
if bad then return redis.error_reply('ZCLAIM_WRONGTYPE ' .. bad) end
if redis.call('ZREM', KEYS[1], ARGV[1]) == 0 then return 0 end
redis.call('HDEL', KEYS[2], ARGV[2])
return 1
