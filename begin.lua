-- begin.lua: start a run of one idempotency key, unless it finished or is running.
-- KEYS[1] run record: a string "<state> <token> <n>", where state is run
--   (n = lease deadline, Unix ms), done (n = finished at, Unix ms) or free (n = 0)
-- ARGV[1] lease in ms   ARGV[2] ttl of a running record in ms
-- Returns {0, token, deadline_ms} acquired; {1, token, 0} already done;
--   {2, token, ms_left} running elsewhere with a live lease.
-- The new token is the larger of the last one + 1 and Redis TIME in
-- microseconds, so it keeps growing after a record has expired.
-- Errors: Redis' WRONGTYPE (from the GET, before any write), "ZCLAIM_CORRUPT key".
local t = redis.call('TIME')
local now_us = t[1] * 1000000 + t[2]
local now_ms = math.floor(now_us / 1000)
local rec = redis.call('GET', KEYS[1])
local tok
if rec then -- a record exists: it must be one of ours
  local s, t, n = string.match(rec, '^(%l+) (%d+) (%d+)$')
  tok, n = tonumber(t), tonumber(n)
  -- A number above 2^53 cannot be a token or a time.
  if (s ~= 'run' and s ~= 'done' and s ~= 'free') or not tok or tok > 9007199254740992 or n > 9007199254740992 then
    return redis.error_reply('ZCLAIM_CORRUPT ' .. KEYS[1])
  end
  if s == 'done' then return {1, tok, 0} end
  if s == 'run' and n > now_ms then return {2, tok, n - now_ms} end
end
local new = now_us
if tok and tok + 1 > new then new = tok + 1 end
local deadline = now_ms + tonumber(ARGV[1])
redis.call('SET', KEYS[1], string.format('run %d %d', new, deadline), 'PX', ARGV[2])
return {0, new, deadline}
