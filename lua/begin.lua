-- begin.lua: start a run of one idempotency key, unless it finished or is running.
-- KEYS[1] run record: a string "<state> <token> <n>", where state is run
--   (n = lease deadline, Unix ms), take (an abandoned run that a live
--   process took over, takeover.lua: n = until when), free (released:
--   n = 0, or 1 for a failure that ended its task, settle.lua), or
--   done (n = 0: written by an earlier version; Complete now deletes the
--   record and keeps the finish in KEYS[2])
-- KEYS[2] the bucket of finished records that holds the key's (a hash:
--   field = digest of the key, value = the run's lease deadline when it
--   finished, Unix ms; see complete.lua)
-- KEYS[3] the key's history bucket (history.lua: field as in KEYS[2]),
--   where a run that is skipped (done, or running elsewhere) is noted
-- ARGV[1] the key's field in KEYS[2]   ARGV[2] this process ("host:pid")
-- The store's options are written into the script (storeScript), as
-- constants cost Redis less than arguments: the lease, the ttl of a
-- running record (a string, as SET takes it) and the retention, in ms.
-- Returns the token alone when it acquired a key with no record (the
--   common case: its deadline is floor(token / 1000) + lease, and no
--   earlier run is unfinished); {0, token, deadline_ms, prev} acquired
--   over a record, where prev is 1 when an earlier run's lease ran out
--   without Complete or Release (its worker died or stalled), 2 when an
--   earlier run was released; {1, token, 0} already done (token 0 when
--   the bucket said so);
--   {2, token, ms_left} running elsewhere with a live lease.
-- The new token is the larger of the last one + 1 and Redis TIME in
-- microseconds, so it keeps growing after a record has expired.
-- Errors: Redis' WRONGTYPE (from the HGET or the first SET, which then
--   writes nothing), "ZCLAIM_CORRUPT key".
local lease, ttl, retention = LEASE_MS, 'TTL_MS', RETENTION_MS
local t = redis.call('TIME')
local now_us = t[1] * 1000000 + t[2]
local now_ms = (now_us - now_us % 1000) / 1000
-- A skipped run's event, with the token of the run that made it skip.
local function skip(kind, tok)
  if not KEYS[3] then return end
  hist_add(KEYS[3], ARGV[1], now_ms, kind, tok, ARGV[2] .. '\0')
  redis.call('PEXPIRE', KEYS[3], ttl)
end
local fin = redis.call('HGET', KEYS[2], ARGV[1])
-- A field older than the retention is not done: its sweep is late.
if fin and tonumber(fin) + retention > now_ms then
  skip('k', '0')
  return {1, 0, 0}
end
local deadline = now_ms + lease
-- The common case, a key never seen (or long expired), in one call: SET NX
-- writes the new run only if there is no record, and GET answers the
-- record it found instead.
local rec = redis.call('SET', KEYS[1], string.format('run %d %d', now_us, deadline), 'NX', 'PX', ttl, 'GET')
if not rec then return now_us end
-- A record exists: it must be one of ours.
local s, tok, n = string.match(rec, '^(%l+) (%d+) (%d+)$')
tok, n = tonumber(tok), tonumber(n)
-- Lua numbers are doubles, which tell integers apart only up to 2^53: a
-- token from 2^53 - 1 up (a longer string of digits reads as at least that)
-- would give the next run 2^53 or a token no larger than its own, and a
-- larger n cannot be a time.
if (s ~= 'run' and s ~= 'done' and s ~= 'free' and s ~= 'take') or not tok or tok >= 9007199254740991 or n > 9007199254740992 then
  return redis.error_reply('ZCLAIM_CORRUPT ' .. KEYS[1])
end
if s == 'done' then
  skip('k', string.format('%d', tok))
  return {1, tok, 0}
end
if s == 'run' and n > now_ms then
  skip('w', string.format('%d', tok))
  return {2, tok, n - now_ms}
end
local new = now_us
if tok + 1 > new then new = tok + 1 end
redis.call('SET', KEYS[1], string.format('run %d %d', new, deadline), 'PX', ttl)
local prev = 2
if s == 'run' or s == 'take' then prev = 1 end
return {0, new, deadline, prev}
