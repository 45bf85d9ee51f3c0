-- giveback.lua: puts active tasks back at the front of their queue, where
-- asynq's next dequeue takes them first, in the order given: tasks that
-- dequeue.lua took ahead of asynq's dequeues and asynq did not ask for
-- (middleware_prefetch.go), and the task of a dead worker's run that a
-- takeover puts back (asynq_adapter.go's requeue). Each task's holder mark
-- goes (middleware_held.go).
-- KEYS[1..3] asynq's pending list, active list and lease set of the queue;
--   KEYS[4] the queue's holder marks (a hash: task id -> holder)
-- ARGV[1] the prefix of the queue's task keys   ARGV[2] now (Unix ns:
--   asynq's pending_since)   ARGV[3..] the tasks' ids
-- A task no longer active (asynq's recovery moved it) is left where it is.
-- Returns the number of tasks put back.
local n = 0
for j = #ARGV, 3, -1 do
  local id = ARGV[j]
  if redis.call('LREM', KEYS[2], 0, id) > 0 then
    redis.call('ZREM', KEYS[3], id)
    redis.call('HDEL', KEYS[4], id)
    redis.call('HSET', ARGV[1] .. id, 'state', 'pending', 'pending_since', ARGV[2])
    redis.call('RPUSH', KEYS[1], id)
    n = n + 1
  end
end
return n
