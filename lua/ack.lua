-- ack.lua: finish claimed runs, each fenced by its token.
-- KEYS[1] in-flight ZSet   KEYS[2] run records hash
-- ARGV in-flight members (id .. "|" .. token)
-- Returns one value per member: 1 when acked, 0 when its token is not
-- current (lease lost; nothing changed for it).
local bad = wrongtype({KEYS[1], 'zset', KEYS[2], 'hash'})
if bad then return redis.error_reply('ZCLAIM_WRONGTYPE ' .. bad) end

-- sliced runs cmd on key with the values of array t, a thousand at a time
-- (one unpack fails past about 8,000 values: Lua's C stack), and returns
-- the array replies joined into one.
local function sliced(cmd, key, t)
  if #t <= 1000 then return redis.call(cmd, key, unpack(t)) end
  local out = {}
  for i = 1, #t, 1000 do
    local r = redis.call(cmd, key, unpack(t, i, math.min(i + 999, #t)))
    if type(r) == 'table' then
      for j = 1, #r do out[#out + 1] = r[j] end
    end
  end
  return out
end

local scores = sliced('ZMSCORE', KEYS[1], ARGV)
local out, rem, del = {}, {}, {}
for i, sc in ipairs(scores) do
  if sc then
    out[i] = 1
    rem[#rem + 1] = ARGV[i]
    local _, tok = split_member(ARGV[i])
    del[#del + 1] = tok
  else
    out[i] = 0
  end
end
if #rem > 0 then
  sliced('ZREM', KEYS[1], rem)
  sliced('HDEL', KEYS[2], del)
end
return out
