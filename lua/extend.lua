-- extend.lua: move a lease deadline to Redis now + ms, fenced by token.
-- KEYS[1] in-flight ZSet   ARGV[1] in-flight member   ARGV[2] ms
-- Returns the new deadline in Unix ms, or 0 when the token is not current.
-- (ZADD XX CH answers 0 for an unchanged score, so existence is checked first.)
local bad = wrongtype({KEYS[1], 'zset'})
if bad then return redis.error_reply('ZCLAIM_WRONGTYPE ' .. bad) end
if not redis.call('ZSCORE', KEYS[1], ARGV[1]) then return 0 end
local now_ms = clock(1)
local deadline = now_ms + tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], 'XX', deadline, ARGV[1])
return deadline
