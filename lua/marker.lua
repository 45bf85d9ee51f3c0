-- marker.lua: read and advance a state marker (see stateMarker in redis.go).
-- KEYS[1] the marker: a string "<id> <seq>" (an older "<id>" reads as seq 0)
-- ARGV[1] an id for a new marker
-- ARGV[2] "" to advance the marker by one; or an id, which a marker that
--   still holds it gives up for ARGV[1] (a rollback was noticed)
-- Returns {id, seq} as they were before this call; for a marker written
--   here (missing, or replaced), {ARGV[1], 0}.
-- Error: Redis' WRONGTYPE from the GET, before anything is written.
local v = redis.call('GET', KEYS[1])
local id, seq
if v then
  id, seq = string.match(v, '^(%S+) (%d+)$')
  if not id then id, seq = v, '0' end
end
if not v or (ARGV[2] ~= '' and ARGV[2] == id) then
  redis.call('SET', KEYS[1], ARGV[1] .. ' 1')
  return {ARGV[1], 0}
end
seq = tonumber(seq)
redis.call('SET', KEYS[1], id .. ' ' .. string.format('%d', seq + 1))
return {id, seq}
