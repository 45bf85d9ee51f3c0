-- giveback.lua: puts tasks that dequeue.lua took ahead of asynq's dequeues
-- back on their queue, where asynq's next dequeue takes them first, in the
-- order they were taken, and deletes the runs it began for them
-- (middleware_prefetch.go).
-- It also serves a takeover, which puts the task of a dead worker back
-- (asynq_adapter.go's requeue). Each task's holder mark goes (see
-- middleware_held.go).
-- KEYS[1..3] asynq's pending list, active list and lease set of the queue;
--   KEYS[4] the queue's holder marks (a hash: task id -> holder);
--   KEYS[5..] the run records of the tasks whose runs it began, in their
--   order (none on Redis Cluster, where they are in other slots)
-- ARGV[1] the prefix of the queue's task keys   ARGV[2] now (Unix ns:
--   asynq's pending_since)   ARGV[1 + 2j], ARGV[2 + 2j] the j-th task's
--   id, and its run record as dequeue.lua wrote it ('' where it began none)
-- A task no longer active (asynq's recovery moved it) is left where it is.
-- Returns the number of tasks put back.
local tasks, rk, m = (#ARGV - 2) / 2, {}, 4
for j = 1, tasks do
  if ARGV[2 + 2 * j] ~= '' then m = m + 1; rk[j] = KEYS[m] end
end
local n = 0
for j = tasks, 1, -1 do
  local id, rec = ARGV[1 + 2 * j], ARGV[2 + 2 * j]
  if rk[j] and redis.call('GET', rk[j]) == rec then redis.call('DEL', rk[j]) end
  if redis.call('LREM', KEYS[2], 0, id) > 0 then
    redis.call('ZREM', KEYS[3], id)
    redis.call('HDEL', KEYS[4], id)
    redis.call('HSET', ARGV[1] .. id, 'state', 'pending', 'pending_since', ARGV[2])
    redis.call('RPUSH', KEYS[1], id)
    n = n + 1
  end
end
return n
