-- dead.lua: take jobs out of the dead set: back onto the schedule (revive)
-- or for good (delete).
-- KEYS[1] schedule ZSet   KEYS[2] pending records hash   KEYS[3] dead ZSet
-- KEYS[4] dead info hash
-- ARGV[1] "revive" | "delete"   ARGV[2] score units per second
-- ARGV[3] notice channel   ARGV[4..] ids
-- A revived job is due now by Redis' clock, with the type, queue and
-- payload it died with, the same occurrence and no attempts spent. An id scheduled meanwhile
-- keeps that entry (the newer work) and only leaves the dead set.
-- Returns how many of the ids were dead.
-- Error "ZCLAIM_WRONGTYPE key type".
local bad = wrongtype({KEYS[1], 'zset', KEYS[2], 'hash', KEYS[3], 'zset', KEYS[4], 'hash'})
if bad then return redis.error_reply('ZCLAIM_WRONGTYPE ' .. bad) end
local revive = ARGV[1] == 'revive'
local now
if revive then
  local _
  _, now = clock(tonumber(ARGV[2]))
end
local n, woke = 0, false
for i = 4, #ARGV do
  local id = ARGV[i]
  if redis.call('ZREM', KEYS[3], id) == 1 then
    n = n + 1
    local info = redis.call('HGET', KEYS[4], id)
    redis.call('HDEL', KEYS[4], id)
    if revive and not redis.call('ZSCORE', KEYS[1], id) then
      -- The info is "<len>:<reason><record>" (see bury): the job comes
      -- back as the same occurrence (its due) with no attempts spent. One
      -- that cannot be read comes back as a bare id, a new occurrence.
      local due, rest
      local l = string.match(info or '', '^(%d+):')
      if l then due, rest = string.match(info, '^%d+@?([^:]*):(.*)$', #l + 2 + tonumber(l)) end
      redis.call('ZADD', KEYS[1], now, id)
      if due and due ~= '' then
        redis.call('HSET', KEYS[2], id, record(0, moved(due), rest))
      elseif rest and rest ~= '' then
        redis.call('HSET', KEYS[2], id, '0:' .. rest)
      else
        redis.call('HDEL', KEYS[2], id)
      end
      woke = true
    end
  end
end
if woke then notify(ARGV[3], now) end
return n
