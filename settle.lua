-- settle.lua: extend, complete or release a run, fenced by its token.
-- KEYS[1] run record (see begin.lua)   ARGV[1] token
-- ARGV[2] "extend" | "complete" | "release"   ARGV[3] lease in ms (extend)
-- ARGV[4] ttl in ms: of a running record (extend, release) or of a
--   finished one (complete)
-- Returns the new lease deadline in Unix ms for extend, 1 for complete and
-- release, 0 when the token is not current (nothing changed).
-- A key of another type fails the GET below, before anything is written.
local s, tok = string.match(redis.call('GET', KEYS[1]) or '', '^(%l+) (%d+) %d+$')
if s ~= 'run' or tonumber(tok) ~= tonumber(ARGV[1]) then return 0 end
local function now_ms()
  local t = redis.call('TIME')
  return t[1] * 1000 + math.floor(t[2] / 1000)
end
local op, r, rec = ARGV[2], 1, nil
if op == 'extend' then
  r = now_ms() + tonumber(ARGV[3])
  rec = string.format('run %s %d', tok, r)
elseif op == 'complete' then
  rec = string.format('done %s %d', tok, now_ms())
else
  -- Released: the holder's token is void; it stays recorded so that the
  -- next run's token is larger.
  rec = 'free ' .. tok .. ' 0'
end
redis.call('SET', KEYS[1], rec, 'PX', ARGV[4])
return r
