-- complete.lua: finish a run, fenced by its token. A script of its own, not
-- an op of settle.lua: every run that succeeds calls it, and each argument
-- and branch costs Redis work on that path.
-- KEYS[1] run record (see begin.lua)   KEYS[2] the key's bucket of finished
--   records (see begin.lua)
-- ARGV[1] the run record as the client last saw it, "run <token>
--   <deadline>"   ARGV[2] the key's field in KEYS[2]   ARGV[3] that
--   deadline (Unix ms)
-- KEYS[3] the key's history bucket (history.lua: field as in KEYS[2]),
--   which gets a "finished" event, or a "lease lost" one
-- ARGV[4] this process ("host:pid")   ARGV[5] the "finished" event, as
--   history.lua writes one, made by the client (its time is Redis' clock
--   as the client reads it: its token, Redis' time at Begin, and the time
--   since), or "" for none: the success path asks Redis nothing more than
--   one HSETNX
-- ARGV[6] present: sweep KEYS[2]'s and KEYS[3]'s expired fields too (the
--   client draws it, with odds doneSweepOdds), and set KEYS[3]'s expiry:
--   only a sweep does on the success path, so a bucket of histories lives
--   Retention + Lease after its last sweep (about one Complete in 32 into
--   it), and one not swept yet keeps what it holds until it is
-- The store's options are written into the script (storeScript): the
-- bucket's ttl in ms (a string, as PEXPIRE takes it), the retention of a
-- finished record plus the lease.
-- Returns 1, or 0 when the token is not current (nothing changed).
local ttl = 'TTL_MS'
-- A run record of another type fails the GET below, before anything is written.
local rec = redis.call('GET', KEYS[1])
local n = ARGV[3]
local function lost()
  if not KEYS[3] then return end
  local t = redis.call('TIME')
  hist_add(KEYS[3], ARGV[2], t[1] * 1000 + math.floor(t[2] / 1000), 'l', string.match(ARGV[1], '^run (%d+) ') or '0',
    ARGV[4] .. '\0complete')
  redis.call('PEXPIRE', KEYS[3], ttl)
end
if rec ~= ARGV[1] then
  -- The fence is the token. The record as the client saw it is the common
  -- case, one comparison; else the record moved on without this client
  -- (an Extend of its own that raced this call, or another run). A prefix
  -- comparison, not a pattern: the token ends at the space.
  local run = string.match(ARGV[1], '^run %d+ ')
  if not rec or not run or string.sub(rec, 1, #run) ~= run then
    lost()
    return 0
  end
  n = string.sub(rec, #run + 1)
  if not tonumber(n) then return redis.error_reply('ZCLAIM_CORRUPT ' .. KEYS[1]) end
end
-- The run record goes; the finish is one field of a small hash, which
-- lives Retention + Lease past its last write. Its time is the run's
-- lease deadline (Redis' clock): from its last renewal, no earlier than
-- now - Lease, so a field is done until at least Retention after the
-- finish of a run that held its lease.
-- The event first: a history of another type fails its HSETNX, before
-- anything changed. A field that holds events already gets it appended.
if KEYS[3] and ARGV[5] ~= '' then hist_append(KEYS[3], ARGV[2], ARGV[5]) end
redis.call('HSET', KEYS[2], ARGV[2], n)
redis.call('PEXPIRE', KEYS[2], ttl)
redis.call('DEL', KEYS[1])
if ARGV[6] then
  if KEYS[3] then redis.call('PEXPIRE', KEYS[3], ttl) end
  -- A field f is past its retention when f + Retention <= now, which
  -- holds for f <= n - Lease - Retention.
  local all, old = redis.call('HGETALL', KEYS[2]), {}
  local before = tonumber(n) - tonumber(ttl)
  for j = 1, #all, 2 do
    if tonumber(all[j + 1]) <= before then old[#old + 1] = all[j] end
  end
  if #old > 0 then redis.call('HDEL', KEYS[2], unpack(old)) end
  -- A history is past its retention when its newest event (its last) is.
  all, old = {}, {}
  if KEYS[3] then all = redis.call('HGETALL', KEYS[3]) end
  for j = 1, #all, 2 do
    local last = string.match(all[j + 1], '(%d+)\31[^\30]*\30$')
    if not last or tonumber(last) <= before then old[#old + 1] = all[j] end
  end
  if #old > 0 then redis.call('HDEL', KEYS[3], unpack(old)) end
end
return 1
