-- dequeue.lua: asynq v0.26's dequeue of up to ARGV[3] tasks of a queue, in
-- one call, for the store's AsynqClient (middleware_dequeue.go,
-- middleware_prefetch.go), each task marked with the process that holds it
-- until its run begins (middleware_held.go).
-- KEYS[1..4] and ARGV[1..2] are asynq's: the queue's pending list, paused
-- flag, active list and lease set; the tasks' lease deadline (Unix s) and
-- the prefix of its tasks' keys. KEYS[5] the queue's holder marks (a hash
-- in the queue's slot: task id -> holder). ARGV[3] how many tasks to take
-- at most, ARGV[4] the holder.
-- Each task taken makes asynq's writes (the task active, under the lease)
-- and its mark.
-- Returns 2 values a task taken, in the order taken (none for a paused or
-- empty queue): its message and its id.
if redis.call('EXISTS', KEYS[2]) ~= 0 then return {} end
local out = {}
for _ = 1, tonumber(ARGV[3]) do
  local id = redis.call('RPOPLPUSH', KEYS[1], KEYS[3])
  if not id then break end
  local tk = ARGV[2] .. id
  redis.call('HSET', tk, 'state', 'active')
  redis.call('HDEL', tk, 'pending_since')
  redis.call('ZADD', KEYS[4], ARGV[1], id)
  redis.call('HSET', KEYS[5], id, ARGV[4])
  -- A task without its message stays active, as asynq's dequeue leaves it.
  local msg = redis.call('HGET', tk, 'msg')
  if msg then
    out[#out + 1] = msg
    out[#out + 1] = id
  end
end
return out
