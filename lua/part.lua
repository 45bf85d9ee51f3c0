-- part.lua: settle jobs of one batch lease one by one (Broker.Claim's
-- claims share a lease; see prelude.lua), each fenced by its place.
-- KEYS[1] schedule ZSet   KEYS[2] pending records   KEYS[3] run records
-- KEYS[4] dead ZSet   KEYS[5] dead info hash   KEYS[6] batches ZSet
-- ARGV[1] "ack" | "retry" | "kill" | "extend"   ARGV[2] the lease ("first:n")
-- ARGV[3] retry: "at" or "in"; kill: the reason; extend: ms
-- ARGV[4] retry: score (at) or delay in ms (in)   ARGV[5] retry: max attempts
-- ARGV[6] score units per second   ARGV[7] notice channel
-- ARGV[8..] per job: its place in the lease (from 1), the byte offset of
--   its entry in the lease's jobs (from 1), and its id
-- Returns one value per job: 0 when the lease is no longer held, the job
-- was already settled, or (retry, kill) the entry at its offset is not
-- its own (nothing changed for it); else 1 (ack, kill),
-- retry.lua's 1, 2 or 3, or the lease's new deadline in Unix ms (extend,
-- which moves the deadline of the whole lease).
local op, lease = ARGV[1], ARGV[2]
-- The keys op may write; an ack or an extend touches the last two only.
local kt = {KEYS[3], 'hash', KEYS[6], 'zset'}
if op == 'retry' or op == 'kill' then
  kt = {KEYS[1], 'zset', KEYS[2], 'hash', KEYS[3], 'hash', KEYS[4], 'zset', KEYS[5], 'hash', KEYS[6], 'zset'}
end
local bad = wrongtype(kt)
if bad then return redis.error_reply('ZCLAIM_WRONGTYPE ' .. bad) end

local k = (#ARGV - 7) / 3
local out = {}
for i = 1, k do out[i] = 0 end
if not redis.call('ZSCORE', KEYS[6], lease) then return out end
local first, n = string.match(lease, '^(%d+):(%d+)$')
if not first then return out end
n = tonumber(n)
local R = KEYS[3]
-- Ack and Extend need no record: the place alone, which the claim was
-- answered with, names the job (reading the jobs would copy them all for
-- each). Retry and Kill read the job's record, and check its id.
local records = op == 'retry' or op == 'kill'
local blob = records and redis.call('HGET', R, 'b' .. first) or ''
local places = settled_places(R, first, n) or {}
local ups = tonumber(ARGV[6])
local now_ms, now
if op ~= 'ack' then now_ms, now = clock(ups) end
local done, min = 0, nil
for i = 1, k do
  local j, at, id = tonumber(ARGV[5 + 3 * i]), tonumber(ARGV[6 + 3 * i]), ARGV[7 + 3 * i]
  -- The job's entry, found where the claim said it is, and only if it
  -- is this job's (for Retry and Kill: see above).
  local rec
  if j and at and j >= 1 and j <= n and places[j] ~= 49 then
    if not records then
      rec = ''
    else
      local eid, erec = batch_entry(blob, at)
      if eid == id then rec = erec end
    end
  end
  if rec and op == 'extend' then
    out[i] = now_ms + tonumber(ARGV[3])
  elseif rec then
    places[j] = 49
    done = done + 1
    out[i] = 1
    if op == 'kill' then
      local attempt, due, rest = run_attempt(rec)
      bury(KEYS[4], KEYS[5], id, now_ms, attempt, due, rest, ARGV[3])
    elseif op == 'retry' then
      local score = tonumber(ARGV[4])
      if ARGV[3] == 'in' then score = now + score * ups / 1000 end
      local attempt, due, rest = run_attempt(rec)
      out[i] = settle_back(KEYS[1], KEYS[2], KEYS[4], KEYS[5], id, attempt, due, rest, score,
        tonumber(ARGV[5]), now_ms, 'attempts exhausted')
      if out[i] == 1 and (min == nil or score < min) then min = score end
    end
  end
end
if op == 'extend' then
  local deadline = 0
  for i = 1, k do if out[i] > deadline then deadline = out[i] end end
  if deadline > 0 then redis.call('ZADD', KEYS[6], 'XX', deadline, lease) end
  return out
end
if done > 0 then
  if redis.call('HINCRBY', R, 'batched', -done) == 0 then redis.call('HDEL', R, 'batched') end
  if unsettled(places, n) == 0 then
    redis.call('ZREM', KEYS[6], lease)
    redis.call('HDEL', R, 'b' .. first, 's' .. first)
  else
    redis.call('HSET', R, 's' .. first, places_string(places, n))
  end
end
if min ~= nil then notify(ARGV[7], min) end
return out
