-- recover.lua: one bounded recovery pass over expired leases.
-- KEYS[1] schedule ZSet   KEYS[2] in-flight ZSet   KEYS[3] pending records
-- KEYS[4] run records   KEYS[5] dead ZSet   KEYS[6] dead info hash
-- KEYS[7] batches ZSet (batch leases, see prelude.lua)   KEYS[8] state marker
-- ARGV[1] batch   ARGV[2] score units per second   ARGV[3] max attempts
-- ARGV[4] notice channel   ARGV[5] dead set size kept (-1: no limit)
-- ARGV[6] ms a death is kept (-1: no limit)
-- ARGV[7] a seed (1 .. 2^31 - 2) for the jitter between jobs
-- KEYS[9] (optional) the schedule's history: the hash of the time bucket
--   now (see broker_sent.go), where each job put back or dead gets an event
-- ARGV[8] when KEYS[9] expires (Unix ms)
-- ARGV[9..] the backoff range in ms for attempt 1, 2, ...: lo, hi, lo, hi,
--   ... (the last pair repeats); each job comes back after its own delay
--   drawn uniformly from its attempt's range, so that a batch whose leases
--   expired together does not come back at one instant; the jobs of a
--   dispatcher's batch lease come back due at once (the dispatcher died,
--   not their runs: none began)
-- Leases are re-checked here against Redis TIME: only members whose
-- deadline has passed are touched; the member's removal voids its token.
-- Expired batch leases follow, whole, while the pass has touched fewer
-- than batch jobs.
-- Then up to batch jobs leave the dead set: deaths older than ARGV[6] ms,
-- then the oldest beyond ARGV[5] jobs.
-- Returns {requeued, dead, scanned, trimmed, marker|false} where scanned
-- counts the jobs touched, trimmed those removed from the dead set, and
-- marker is the state marker's value (see stateMarker in redis.go).
local kt = {KEYS[1], 'zset', KEYS[2], 'zset', KEYS[3], 'hash', KEYS[4], 'hash', KEYS[5], 'zset', KEYS[6], 'hash', KEYS[7], 'zset', KEYS[8], 'string'}
if KEYS[9] then
  kt[#kt + 1], kt[#kt + 2] = KEYS[9], 'hash'
  H.key, H.exp, H.ups = KEYS[9], ARGV[8], tonumber(ARGV[2])
end
local bad = wrongtype(kt)
if bad then return redis.error_reply('ZCLAIM_WRONGTYPE ' .. bad) end
local batch, ups, max = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local now_ms, now = clock(ups)
local requeued, dead, scanned, min = 0, 0, 0, nil
local seed, ndelays = tonumber(ARGV[7]), (#ARGV - 8) / 2
local function delay(attempt)
  seed = (seed * 16807) % 2147483647 -- Park-Miller: exact in doubles
  local k = math.min(attempt, ndelays)
  local lo, hi = tonumber(ARGV[7 + 2 * k]), tonumber(ARGV[8 + 2 * k])
  return lo + (hi - lo) * seed / 2147483647
end
local function back(id, attempt, due, rest, at_once)
  local score = now
  if not at_once then score = now + delay(attempt) * ups / 1000 end
  -- An empty member (a foreign producer's) can never become a task: dead
  -- now, not after its attempts; the dispatcher's claim tells the rest.
  local m, reason, why = max, 'lease expired', 'lease expired'
  if id == '' then m, reason = 0, 'empty job id' end
  if at_once then why = 'the lease of the dispatcher that claimed it expired' end
  local r = settle_back(KEYS[1], KEYS[3], KEYS[5], KEYS[6], id, attempt, due, rest, score, m, now_ms, reason, why)
  if r == 2 then dead = dead + 1 else requeued = requeued + 1 end
  if r == 1 and (min == nil or score < min) then min = score end
end

local expired = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now_ms, 'LIMIT', 0, batch)
if #expired > 0 then
  redis.call('ZREM', KEYS[2], unpack(expired))
  scanned = #expired
end
for _, m in ipairs(expired) do
  local id, tok, mdue = split_member(m)
  if id then back(id, take_run(KEYS[4], tok, mdue)) end
end
while scanned < batch do
  local m = redis.call('ZRANGEBYSCORE', KEYS[7], '-inf', now_ms, 'LIMIT', 0, 1)[1]
  if not m then break end
  local ids, recs, damaged, first, places, dispatch = take_batch(KEYS[7], KEYS[4], m, true)
  for j = 1, #ids do
    if not (places and places[j] == 49) then
      local a, due, rest = run_attempt(recs[j])
      back(ids[j], a, due, rest, dispatch)
    end
  end
  if damaged then
    bury_damaged(KEYS[5], KEYS[6], first, damaged, now_ms)
    dead = dead + 1
  end
  scanned = scanned + math.max(#ids, 1)
end
if min ~= nil then notify(ARGV[4], min) end

-- The dead set keeps a death (score: Unix ms) for ARGV[6] ms and at most
-- ARGV[5] jobs, as asynq bounds its archive.
local trimmed = 0
local function drop(ids)
  if #ids == 0 then return end
  redis.call('ZREM', KEYS[5], unpack(ids))
  redis.call('HDEL', KEYS[6], unpack(ids))
  trimmed = trimmed + #ids
end
local keep_n, keep_ms = tonumber(ARGV[5]), tonumber(ARGV[6])
if keep_ms >= 0 then
  drop(redis.call('ZRANGEBYSCORE', KEYS[5], '-inf', now_ms - keep_ms - 1, 'LIMIT', 0, batch))
end
if keep_n >= 0 and trimmed < batch then
  local over = math.min(redis.call('ZCARD', KEYS[5]) - keep_n, batch - trimmed)
  if over > 0 then drop(redis.call('ZRANGE', KEYS[5], 0, over - 1)) end
end
hist_end()
return {requeued, dead, scanned, trimmed, redis.call('GET', KEYS[8])}
