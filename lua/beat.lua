-- beat.lua: a holder's beat (middleware_held.go): the process lives.
-- KEYS[1] the store's live holders (a sorted set: holder -> its last beat,
--   Unix ms by Redis' clock)
-- ARGV[1] the holder   ARGV[2] how long a holder that stopped is kept, in ms
-- Returns Redis TIME in Unix ms.
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - tonumber(ARGV[2]))
return now
