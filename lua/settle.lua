-- settle.lua: extend, complete or release a run, fenced by its token.
-- KEYS[1] run record (see begin.lua)   KEYS[2] the key's bucket of
--   finished records (see begin.lua; complete)
-- ARGV[1] token (decimal, as Begin gave it)
-- ARGV[2] "extend" | "complete" | "release" | "release-final" (a failure
--   that ends its task: asynq archives or revokes it)   ARGV[3] lease in ms
-- ARGV[4] ttl in ms: of a running record (extend, release), or the
--   retention of a finished one plus the lease (complete)
-- ARGV[5] the key's field in KEYS[2] (complete)
-- ARGV[6] odds of a sweep of KEYS[2]'s expired fields: 1 in this (complete)
-- Returns the new lease deadline in Unix ms for extend, 1 for complete and
-- release, 0 when the token is not current (nothing changed).
-- A run record of another type fails the GET below, before anything is written.
local rec = redis.call('GET', KEYS[1])
-- The fence: the record is this token's run. A prefix comparison, not a
-- pattern: the token ends at the space.
local run = 'run ' .. ARGV[1] .. ' '
if not rec or string.sub(rec, 1, #run) ~= run then return 0 end
local op = ARGV[2]
if op == 'complete' then
  -- The run record goes; the finish is one field of a small hash, which
  -- lives Retention + Lease past its last write. Its time is the run's
  -- lease deadline (Redis' clock): from its last renewal, no earlier than
  -- now - Lease, so a field is done until at least Retention after the
  -- finish of a run that held its lease.
  local n = string.sub(rec, #run + 1)
  local dl = tonumber(n)
  if not dl then return redis.error_reply('ZCLAIM_CORRUPT ' .. KEYS[1]) end
  -- The first write: a bucket of another type fails it, before anything changed.
  redis.call('HSET', KEYS[2], ARGV[5], n)
  redis.call('PEXPIRE', KEYS[2], ARGV[4])
  redis.call('DEL', KEYS[1])
  if dl % tonumber(ARGV[6]) == 0 then
    -- A field f is past its retention when f + Retention <= now, which
    -- holds for f <= dl - Lease - Retention.
    local all, old = redis.call('HGETALL', KEYS[2]), {}
    local before = dl - tonumber(ARGV[4])
    for j = 1, #all, 2 do
      if tonumber(all[j + 1]) <= before then old[#old + 1] = all[j] end
    end
    if #old > 0 then redis.call('HDEL', KEYS[2], unpack(old)) end
  end
  return 1
elseif op == 'extend' then
  local t = redis.call('TIME')
  local r = t[1] * 1000 + math.floor(t[2] / 1000) + tonumber(ARGV[3])
  redis.call('SET', KEYS[1], string.format('run %s %d', ARGV[1], r), 'PX', ARGV[4])
  return r
end
-- Released: the holder's token is void; it stays recorded so that the
-- next run's token is larger. "free <token> 1" marks a failure that ends
-- its task, which a takeover leaves to asynq.
local final = '0'
if op == 'release-final' then final = '1' end
redis.call('SET', KEYS[1], 'free ' .. ARGV[1] .. ' ' .. final, 'PX', ARGV[4])
return 1
