-- cancel.lua: remove a scheduled job and its pending record.
-- KEYS[1] schedule ZSet   KEYS[2] pending records hash   ARGV[1] id
-- Returns 1 when the id was scheduled, else 0. Runs in flight are not touched.
local bad = wrongtype({KEYS[1], 'zset', KEYS[2], 'hash'})
if bad then return redis.error_reply('ZCLAIM_WRONGTYPE ' .. bad) end
redis.call('HDEL', KEYS[2], ARGV[1])
return redis.call('ZREM', KEYS[1], ARGV[1])
