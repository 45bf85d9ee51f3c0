-- enqueue.lua: asynq tasks of one queue written as asynq v0.26's
-- Client.Enqueue writes each (its enqueueCmd), many in one call
-- (DispatcherOptions.AsynqRedis).
-- KEYS[1..n] the tasks' hashes (asynq:{queue}:t:<task id>)
-- KEYS[n+1] the queue's pending list (asynq:{queue}:pending)
-- ARGV[1] pending_since (Unix ns)   ARGV[2..] per task: its encoded
--   message, then its task id
-- Returns one value per task: 1 when written, 0 when asynq already holds a
-- task of that id (nothing written for it: asynq's ErrTaskIDConflict).
-- The ids written go onto the list in the order given, as one LPUSH each
-- would push them.
local n = #KEYS - 1
local out, ids = {}, {}
for i = 1, n do
  if redis.call('EXISTS', KEYS[i]) == 1 then
    out[i] = 0
  else
    redis.call('HSET', KEYS[i], 'msg', ARGV[2 * i], 'state', 'pending', 'pending_since', ARGV[1])
    ids[#ids + 1] = ARGV[2 * i + 1]
    out[i] = 1
  end
end
if #ids > 0 then redis.call('LPUSH', KEYS[n + 1], unpack(ids)) end
return out
