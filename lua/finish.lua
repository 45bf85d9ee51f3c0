-- finish.lua: settle batch leases (a dispatcher's claims), each as one.
-- KEYS[1] schedule ZSet   KEYS[2] batches ZSet   KEYS[3] pending records
-- KEYS[4] run records   KEYS[5] dead ZSet   KEYS[6] dead info hash
-- KEYS[7] (optional) the schedule's history: the hash of the time bucket
--   now (see broker_sent.go)
-- ARGV[1] score units per second   ARGV[2] max attempts   ARGV[3] notice channel
-- ARGV[4] m, the number of jobs enqueued into asynq   ARGV[5] when KEYS[7]
--   expires, Unix ms
-- ARGV[6..5+2m] m pairs: job id, then its "enqueued" event as
--   history.lua writes one, made by the Dispatcher (broker_sent.go's
--   enqueuedEvent), kept as the job's field "<id>\0e" (the newest of that
--   bucket); a job going back or dead gets its event too, in its field
--   "<id>"
-- ARGV[6+2m..] one group per lease: its member ("first:n"), then k, then k
--   triples (index of a job in the batch, 1-based; "r" or "d"; delay in ms
--   for "r", reason for "d"). Jobs not named are done and leave the broker;
--   an "r" job goes back to the schedule after its delay (or into the dead
--   set after its last attempt), a "d" job into the dead set.
-- Returns one value per lease: 1 when settled, 0 when it was not held (its
-- lease expired and recovery took it; nothing changed for it).
-- Every settle writes the batches and run records; the schedule, pending
-- records and dead set only when a job goes back or dies, or a lease's
-- member cannot be read, which the arguments tell before anything is
-- written. Only the keys a settle writes are checked (and the clock read).
local kt = {KEYS[2], 'zset', KEYS[4], 'hash'}
local sent = tonumber(ARGV[4])
local start = 6 + 2 * sent
if KEYS[7] then
  kt[#kt + 1], kt[#kt + 2] = KEYS[7], 'hash'
  H.key, H.exp, H.ups = KEYS[7], ARGV[5], tonumber(ARGV[1])
end
local i, more = start, false
while i <= #ARGV do
  local k = tonumber(ARGV[i + 1])
  if k > 0 or not string.find(ARGV[i], '^%d+:%d+$') then more = true end
  i = i + 2 + 3 * k
end
if more then
  local n = #kt
  kt[n + 1], kt[n + 2], kt[n + 3], kt[n + 4] = KEYS[1], 'zset', KEYS[3], 'hash'
  kt[n + 5], kt[n + 6], kt[n + 7], kt[n + 8] = KEYS[5], 'zset', KEYS[6], 'hash'
end
local bad = wrongtype(kt)
if bad then return redis.error_reply('ZCLAIM_WRONGTYPE ' .. bad) end
local ups, max = tonumber(ARGV[1]), tonumber(ARGV[2])
local now_ms, now = 0, 0
if more then now_ms, now = clock(ups) end
if H.key and sent > 0 then
  local hset = {}
  for j = 6, 5 + 2 * sent, 2 do
    hset[#hset + 1] = ARGV[j] .. '\0e'
    hset[#hset + 1] = ARGV[j + 1]
    if #hset == 1000 then -- one unpack takes a few thousand values at most
      redis.call('HSET', H.key, unpack(hset))
      hset = {}
    end
  end
  if #hset > 0 then redis.call('HSET', H.key, unpack(hset)) end
  H.written = true
end
local out, min = {}, nil
i = start
while i <= #ARGV do
  local k = tonumber(ARGV[i + 1])
  local ids, recs, damaged, first = take_batch(KEYS[2], KEYS[4], ARGV[i], k > 0)
  out[#out + 1] = ids and 1 or 0
  if damaged then bury_damaged(KEYS[5], KEYS[6], first, damaged, now_ms) end
  for j = 1, k do
    local at = i + 2 + 3 * (j - 1)
    local x = tonumber(ARGV[at])
    local id = ids and ids[x]
    if id then
      local attempt, due, rest = run_attempt(recs[x])
      if ARGV[at + 1] == 'r' then
        local score = now + tonumber(ARGV[at + 2]) * ups / 1000
        if settle_back(KEYS[1], KEYS[3], KEYS[5], KEYS[6], id, attempt, due, rest, score, max, now_ms, 'attempts exhausted',
          'enqueue failed; again in ' .. ARGV[at + 2] .. ' ms') == 1
          and (min == nil or score < min) then
          min = score
        end
      else
        bury(KEYS[5], KEYS[6], id, now_ms, attempt, due, rest, ARGV[at + 2])
      end
    end
  end
  i = i + 2 + 3 * k
end
if min ~= nil then notify(ARGV[3], min) end
hist_end()
return out
