-- takeover.lua: mark an abandoned run as taken over, at most once.
-- KEYS[1] run record (see begin.lua)   ARGV[1] the token the caller saw, or
--   "0" for a task whose worker died before its run began (no record); a
--   released ("free <token> 0") record is taken with its token: its task
--   is still active, so asynq never recorded the failure
-- ARGV[2] how long the takeover holds the record, in ms (its copy must
--   begin within it, or another process may take the run over again)
-- ARGV[3] the run lease in ms, to tell how long the run had been silent
-- KEYS[2] the key's bucket of finished records (see begin.lua)
-- ARGV[4] the key's field in KEYS[2]   ARGV[5] retention in ms
-- KEYS[3] the key's history bucket (history.lua: field as in KEYS[2]),
--   which gets a "taken over" event: the token taken over, and
--   "<ARGV[6]>\0<silent ms>"
-- ARGV[6] this process ("host:pid")
-- Returns {1, silent_ms} when this call took the run over (the record
--   becomes "take <token> <until>", which Begin acquires as an abandoned
--   run); {0} when the record is gone, finished, of another token, still
--   leased, or taken over by someone else meanwhile.
local function event(now_ms, silent)
  if not KEYS[3] then return end
  hist_add(KEYS[3], ARGV[4], now_ms, 'T', ARGV[1], ARGV[6] .. '\0' .. string.format('%d', silent))
  redis.call('PEXPIRE', KEYS[3], tonumber(ARGV[5]) + tonumber(ARGV[3]))
end
local rec = redis.call('GET', KEYS[1])
if not rec then
  if ARGV[1] ~= '0' then return {0} end
  local t = redis.call('TIME')
  local now_ms = t[1] * 1000 + math.floor(t[2] / 1000)
  -- No run record may mean a finished one.
  local fin = redis.call('HGET', KEYS[2], ARGV[4])
  if fin and tonumber(fin) + tonumber(ARGV[5]) > now_ms then return {0} end
  if not redis.call('SET', KEYS[1], string.format('take 0 %d', now_ms + tonumber(ARGV[2])), 'NX', 'PX', 10 * tonumber(ARGV[2])) then
    return {0}
  end
  event(now_ms, 0)
  return {1, 0}
end
local s, tok, n = string.match(rec, '^(%l+) (%d+) (%d+)$')
if (s ~= 'run' and s ~= 'take' and s ~= 'free') or tok ~= ARGV[1] then return {0} end
-- A failure that ended its task (settle.lua's release-final) is asynq's.
if s == 'free' and n ~= '0' then return {0} end
local t = redis.call('TIME')
local now_ms = t[1] * 1000 + math.floor(t[2] / 1000)
n = tonumber(n)
if n > now_ms then return {0} end
local ttl = redis.call('PTTL', KEYS[1])
if ttl < 0 then ttl = tonumber(ARGV[2]) end
redis.call('SET', KEYS[1], string.format('take %s %d', tok, now_ms + tonumber(ARGV[2])), 'PX', ttl)
-- A released run is not silent: its release says when it ended, which the
-- record does not keep.
local silent = 0
if s == 'run' then silent = now_ms - n + tonumber(ARGV[3]) end
if s == 'take' then silent = now_ms - n end
event(now_ms, silent)
return {1, silent}
