-- settle.lua: extend, complete or release a run, fenced by its token.
-- KEYS[1] run record hash   ARGV[1] token   ARGV[2] "extend" | "complete" | "release"
-- ARGV[3] lease in ms (extend)   ARGV[4] ttl in ms: of a running record
--   (extend, release) or of a finished one (complete)
-- Returns the new lease deadline in Unix ms for extend, 1 for complete and
-- release, 0 when the token is not current (nothing changed).
-- A key of another type fails the HMGET below, before anything is written.
local rec = redis.call('HMGET', KEYS[1], 's', 't')
if rec[1] ~= 'run' or tonumber(rec[2]) ~= tonumber(ARGV[1]) then return 0 end
local op = ARGV[2]
local now_ms = clock(1)
local r = 1
if op == 'extend' then
  r = now_ms + tonumber(ARGV[3])
  redis.call('HSET', KEYS[1], 'l', r)
elseif op == 'complete' then
  redis.call('HSET', KEYS[1], 's', 'done', 'd', now_ms, 'l', 0)
else
  -- Released: the holder's token is void; it stays recorded so that the
  -- next run's token is larger.
  redis.call('HSET', KEYS[1], 's', 'free', 'l', 0)
end
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[4]))
return r
