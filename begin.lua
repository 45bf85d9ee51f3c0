-- begin.lua: start a run of one idempotency key, unless it finished or is running.
-- KEYS[1] run record hash {s = "run"|"done"|"free", t = token, l = lease deadline (Unix ms)}
-- ARGV[1] lease in ms   ARGV[2] ttl of a running record in ms
-- Returns {0, token, deadline_ms} acquired; {1, token, 0} already done;
--   {2, token, ms_left} running elsewhere with a live lease.
-- The new token is the larger of the last one + 1 and Redis TIME in
-- microseconds, so it keeps growing after a record has expired.
-- Errors: Redis' WRONGTYPE (before any write), "ZCLAIM_CORRUPT key".
-- A key of another type fails the HMGET below, before anything is written.
local now_ms, _, now_us = clock(1)
local rec = redis.call('HMGET', KEYS[1], 's', 't', 'l')
local s, tok, dl = rec[1], tonumber(rec[2]), tonumber(rec[3])
-- A number outside 0..2^53 (or not a number) cannot be a token or a time.
local function sane(x) return x and x == x and x >= 0 and x <= 9007199254740992 end
if s or rec[2] or rec[3] then -- a record exists: it must be one of ours
  if (s ~= 'run' and s ~= 'done' and s ~= 'free') or not sane(tok) or (s == 'run' and not sane(dl)) then
    return redis.error_reply('ZCLAIM_CORRUPT ' .. KEYS[1])
  end
  if s == 'done' then return {1, tok, 0} end
  if s == 'run' and dl > now_ms then return {2, tok, dl - now_ms} end
end
local new = now_us
if tok and tok + 1 > new then new = tok + 1 end
local deadline = now_ms + tonumber(ARGV[1])
redis.call('HSET', KEYS[1], 's', 'run', 't', new, 'l', deadline)
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[2]))
return {0, new, deadline}
