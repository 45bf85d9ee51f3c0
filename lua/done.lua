-- done.lua: a run's Complete, then the record asynq v0.26 makes of its
-- task's success, in one call (Idempotency.AsynqClient). It runs in place
-- of asynq's own done or mark-as-complete script, and writes what that
-- script writes. complete.lua is written in front of it (doneScript) as
-- the function complete(KEYS, ARGV).
-- KEYS[1..k] complete.lua's (k = 3, or 2 for a store without histories);
--   KEYS[k+1..] asynq's, for a done: active
--   list, lease set, task hash, processed-of-the-day counter, processed
--   counter, [unique lock]; for a mark as complete: active list, lease
--   set, completed set, task hash, the two counters, [unique lock]
-- ARGV[1] k   ARGV[2] c, the number of complete.lua's arguments
--   ARGV[3..c+2] complete.lua's   ARGV[c+3..] asynq's: task id, the day counter's
--   expiry (Unix s), [the completed task's expiry (Unix s), its message,]
--   the largest int64 (where the processed counter wraps to 1)
-- Returns { complete.lua's reply, asynq's reply ("OK", or the error its
-- script would reply or raise) }. A Complete that raises an error (a key
-- of another type) leaves asynq's part to run all the same; an error
-- either part raises is its reply, so that the script replies whenever it
-- ran, and the caller knows whether the Complete was made.
local function asynq_done(K, A)
  local id = A[1]
  if redis.call('LREM', K[1], 0, id) == 0 then return redis.error_reply('NOT FOUND') end
  if redis.call('ZREM', K[2], id) == 0 then return redis.error_reply('NOT FOUND') end
  local kept = string.sub(K[3], -10) == ':completed'
  local j, max = 4, A[3]
  if kept then
    if redis.call('ZADD', K[3], A[3], id) ~= 1 then return redis.error_reply('INTERNAL') end
    redis.call('HSET', K[4], 'msg', A[4], 'state', 'completed')
    j, max = 5, A[5]
  elseif redis.call('DEL', K[3]) == 0 then
    return redis.error_reply('NOT FOUND')
  end
  if redis.call('INCR', K[j]) == 1 then redis.call('EXPIREAT', K[j], A[2]) end
  if tonumber(redis.call('GET', K[j + 1])) == tonumber(max) then
    redis.call('SET', K[j + 1], 1)
  else
    redis.call('INCR', K[j + 1])
  end
  local unique = K[j + 2]
  if unique and redis.call('GET', unique) == id then redis.call('DEL', unique) end
  return redis.status_reply('OK')
end

local ck, ca, ak, aa = {}, {}, {}, {}
local k, c = tonumber(ARGV[1]), tonumber(ARGV[2])
for j = 1, #KEYS do
  if j <= k then ck[j] = KEYS[j] else ak[j - k] = KEYS[j] end
end
for j = 1, c do ca[j] = ARGV[j + 2] end
for j = c + 3, #ARGV do aa[j - c - 2] = ARGV[j] end
-- The reply of f(k, a), or the error it raised as an error reply.
local function reply(f, k, a)
  local ok, r = pcall(f, k, a)
  if not ok and type(r) ~= 'table' then r = redis.error_reply(tostring(r)) end
  return r
end
local done = reply(complete, ck, ca)
return { done, reply(asynq_done, ak, aa) }
