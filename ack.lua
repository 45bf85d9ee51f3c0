-- ack.lua: finish claimed runs, each fenced by its token.
-- KEYS[1] in-flight ZSet   KEYS[2] run records hash
-- ARGV pairs: in-flight member (id .. "|" .. token), token
-- Returns one value per pair: 1 when acked, 0 when its token is not
-- current (lease lost; nothing changed for it).
local bad = wrongtype({KEYS[1], 'zset', KEYS[2], 'hash'})
if bad then return redis.error_reply('ZCLAIM_WRONGTYPE ' .. bad) end
local out, del = {}, {}
for i = 1, #ARGV, 2 do
  local n = redis.call('ZREM', KEYS[1], ARGV[i])
  out[#out + 1] = n
  if n == 1 then del[#del + 1] = ARGV[i + 1] end
end
if #del > 0 then redis.call('HDEL', KEYS[2], unpack(del)) end
return out
