-- ack.lua: finish claimed runs, each fenced by its token.
-- KEYS[1] in-flight ZSet   KEYS[2] run records hash
-- ARGV k in-flight members (id .. "|" .. token, see claim.lua), then
--   their k tokens in the same order: the script reads a member's token
--   from here, not by parsing the member (split_member's patterns cost
--   Redis about as much as the rest of an ack)
-- Returns one value per member: 1 when acked, 0 when its token is not
-- current (lease lost; nothing changed for it).
local bad = wrongtype({KEYS[1], 'zset', KEYS[2], 'hash'})
if bad then return redis.error_reply('ZCLAIM_WRONGTYPE ' .. bad) end

local k = #ARGV / 2
-- sliced runs cmd on key with the values t[1..n], a thousand at a time
-- (one unpack fails past about 8,000 values: Lua's C stack), and returns
-- the array replies joined into one.
local function sliced(cmd, key, t, n)
  if n <= 1000 then return redis.call(cmd, key, unpack(t, 1, n)) end
  local out = {}
  for i = 1, n, 1000 do
    local r = redis.call(cmd, key, unpack(t, i, math.min(i + 999, n)))
    if type(r) == 'table' then
      for j = 1, #r do out[#out + 1] = r[j] end
    end
  end
  return out
end

local scores = sliced('ZMSCORE', KEYS[1], ARGV, k)
local out, rem, del, n = {}, {}, {}, 0
for i = 1, k do
  if scores[i] then
    out[i] = 1
    n = n + 1
    rem[n], del[n] = ARGV[i], ARGV[k + i]
  else
    out[i] = 0
  end
end
if n > 0 then
  sliced('ZREM', KEYS[1], rem, n)
  sliced('HDEL', KEYS[2], del, n)
end
return out
