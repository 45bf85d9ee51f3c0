-- sweep.lua: drops the holder marks of a queue's tasks that are no longer
-- active (middleware_held.go): a task asynq finished before its holder's
-- next beat took its mark out, or whose handler is not the middleware's.
-- Every mark's task was active when the dequeue wrote it, in the same
-- script, so a queue with more marks than active tasks has some to drop.
-- KEYS[1] the queue's holder marks (task id -> holder)
-- KEYS[2] asynq's active list of the queue
-- Returns the number of marks dropped.
local n = redis.call('HLEN', KEYS[1])
if n == 0 or n <= redis.call('LLEN', KEYS[2]) then return 0 end
local active = {}
for _, id in ipairs(redis.call('LRANGE', KEYS[2], 0, -1)) do active[id] = true end
local gone, dropped = {}, 0
for _, id in ipairs(redis.call('HKEYS', KEYS[1])) do
  if not active[id] then
    gone[#gone + 1] = id
    if #gone == 1000 then
      dropped = dropped + redis.call('HDEL', KEYS[1], unpack(gone))
      gone = {}
    end
  end
end
if #gone > 0 then dropped = dropped + redis.call('HDEL', KEYS[1], unpack(gone)) end
return dropped
