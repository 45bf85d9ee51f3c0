-- settle.lua: extend or release a run, fenced by its token (complete.lua
-- completes one).
-- KEYS[1] run record (see begin.lua)
-- ARGV[1] token (decimal, as Begin gave it)
-- ARGV[2] "extend" | "release" | "release-final" (a failure that ends its
--   task: asynq archives or revokes it)
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
if not rec or string.sub(rec, 1, #run) ~= run then return 0 end
local op = ARGV[2]
if op == 'extend' then
  local t = redis.call('TIME')
  local r = t[1] * 1000 + math.floor(t[2] / 1000) + lease
  redis.call('SET', KEYS[1], string.format('run %s %d', ARGV[1], r), 'PX', ttl)
  return r
end
-- Released: the holder's token is void; it stays recorded so that the
-- next run's token is larger. "free <token> 1" marks a failure that ends
-- its task, which a takeover leaves to asynq.
local final = '0'
if op == 'release-final' then final = '1' end
redis.call('SET', KEYS[1], 'free ' .. ARGV[1] .. ' ' .. final, 'PX', ttl)
return 1
