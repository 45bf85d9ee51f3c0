-- schedule.lua: add or replace scheduled jobs; announce an earlier head.
-- KEYS[1] schedule ZSet   KEYS[2] pending records hash (id -> record)
-- KEYS[3] (optional) the schedule's history: the hash of the time bucket now
-- (broker_sent.go), where each job's "scheduled" event is its field
-- "<id>\0s" (the newest of that bucket)
-- ARGV[1] notice channel   ARGV[2] when KEYS[3] expires (Unix ms)
-- ARGV[3] score units per second   then per job: id, score, record ("" =
--   no record)
-- Returns {the number of ids that were not scheduled before, 1 when the
-- notice was refused (an ACL) else 0}.
-- Publishes the smallest new score on the channel when it is earlier than
-- the head of the schedule was. Error "ZCLAIM_WRONGTYPE key type".
local kt = {KEYS[1], 'zset', KEYS[2], 'hash'}
if KEYS[3] then
  kt[5], kt[6] = KEYS[3], 'hash'
  H.key, H.exp, H.ups = KEYS[3], ARGV[2], tonumber(ARGV[3])
end
local bad = wrongtype(kt)
if bad then return redis.error_reply('ZCLAIM_WRONGTYPE ' .. bad) end

local head = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
local zadd, hset, hdel, hs = {}, {}, {}, {}
local min = nil
local now_ms
if H.key then
  local t = redis.call('TIME')
  now_ms = t[1] * 1000 + math.floor(t[2] / 1000)
end
for i = 4, #ARGV, 3 do
  local id, score, rec = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  if H.key then
    hs[#hs + 1] = id .. '\0s'
    hs[#hs + 1] = hist_event(now_ms, 's', hist_due(score), '')
  end
  zadd[#zadd + 1] = score
  zadd[#zadd + 1] = id
  if rec == '' then hdel[#hdel + 1] = id else
    hset[#hset + 1] = id
    hset[#hset + 1] = rec
  end
  local s = tonumber(score)
  if min == nil or s < min then min = s end
end
local added = redis.call('ZADD', KEYS[1], unpack(zadd))
if #hset > 0 then redis.call('HSET', KEYS[2], unpack(hset)) end
if #hdel > 0 then redis.call('HDEL', KEYS[2], unpack(hdel)) end
if #hs > 0 then
  redis.call('HSET', KEYS[3], unpack(hs))
  redis.call('PEXPIREAT', KEYS[3], H.exp)
end
local denied = 0
if min ~= nil and (head[2] == nil or min < tonumber(head[2])) and not notify(ARGV[1], min) then
  denied = 1
end
return {added, denied}
