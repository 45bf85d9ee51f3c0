-- settle.lua: extend or release a run, fenced by its token (complete.lua
-- completes one).
-- KEYS[1] run record (see begin.lua)   KEYS[2] the key's history bucket
--   (history.lua), which gets a "failed" event for a release, or a "lease
--   lost" one
-- ARGV[1] token (decimal, as Begin gave it)
-- ARGV[2] "extend" | "release" | "release-final" (a failure that ends its
--   task: asynq archives or revokes it)
-- ARGV[3] the key's field in KEYS[2]   ARGV[4] this process ("host:pid")
-- ARGV[5] the failure, for the history
-- The store's options are written into the script (storeScript): the
-- lease in ms, and the ttl of the running or released record in ms (a
-- string, as SET takes it).
-- Returns the new lease deadline in Unix ms for extend, 1 for release, 0
-- when the token is not current (nothing changed).
-- A run record of another type fails the GET below, before anything is written.
local lease, ttl = LEASE_MS, 'TTL_MS'
local rec = redis.call('GET', KEYS[1])
-- The fence: the record is this token's run. A prefix comparison, not a
-- pattern: the token ends at the space.
local run = 'run ' .. ARGV[1] .. ' '
local op = ARGV[2]
local function event(kind, detail)
  if not KEYS[2] then return end
  local t = redis.call('TIME')
  hist_add(KEYS[2], ARGV[3], t[1] * 1000 + math.floor(t[2] / 1000), kind, ARGV[1], ARGV[4] .. '\0' .. detail)
  redis.call('PEXPIRE', KEYS[2], ttl)
end
if not rec or string.sub(rec, 1, #run) ~= run then
  event('l', op)
  return 0
end
if op == 'extend' then
  local t = redis.call('TIME')
  local r = t[1] * 1000 + math.floor(t[2] / 1000) + lease
  redis.call('SET', KEYS[1], string.format('run %s %d', ARGV[1], r), 'PX', ttl)
  return r
end
-- Released: the holder's token is void; it stays recorded so that the
-- next run's token is larger. "free <token> 1" marks a failure that ends
-- its task, which a takeover leaves to asynq.
local final, kind = '0', 'r'
if op == 'release-final' then final, kind = '1', 'R' end
event(kind, ARGV[5] or '') -- first: a history of another type fails it, before anything changed
redis.call('SET', KEYS[1], 'free ' .. ARGV[1] .. ' ' .. final, 'PX', ttl)
return 1
