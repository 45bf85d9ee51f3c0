-- move.lua: move scheduled jobs to another due time, or cancel them.
-- KEYS[1] schedule ZSet   KEYS[2] pending records hash
-- ARGV[1] "now" | "at" | "cancel"   ARGV[2] score units per second
-- ARGV[3] notice channel   ARGV[4] the new score ("at")   ARGV[5..] ids
-- "now" moves each job to Redis' now and keeps its occurrence (a job
-- without a record gets one that holds its due); "at" moves it to
-- ARGV[4], a new occurrence for a job not yet claimed (no attempts spent),
-- the same one for a job waiting for a retry. A record that cannot be
-- read is left as it is, for the claim to send to the dead set. Ids not
-- scheduled are passed over; runs in flight are not touched.
-- Returns how many of the ids were scheduled.
-- Error "ZCLAIM_WRONGTYPE key type".
local bad = wrongtype({KEYS[1], 'zset', KEYS[2], 'hash'})
if bad then return redis.error_reply('ZCLAIM_WRONGTYPE ' .. bad) end
local mode, ups = ARGV[1], tonumber(ARGV[2])
local to = ARGV[4]
if mode == 'now' then
  local now_ms = clock(ups)
  if ups == 1000 then to = string.format('%d', now_ms) else to = string.format('%.3f', now_ms / 1000) end
end
local n = 0
for i = 5, #ARGV do
  local id = ARGV[i]
  local score = redis.call('ZSCORE', KEYS[1], id)
  if score and mode == 'cancel' then
    n = n + 1
    redis.call('ZREM', KEYS[1], id)
    redis.call('HDEL', KEYS[2], id)
  elseif score then
    n = n + 1
    local rec = redis.call('HGET', KEYS[2], id)
    if not rec or string.match(rec, '^%d+[@:]') then
      local a, due, rest = run_attempt(rec)
      if due == '' then due = score end
      if mode == 'at' and a == 1 then
        -- Not claimed yet: rescheduling makes a new occurrence.
        if rec and rest ~= '' then redis.call('HSET', KEYS[2], id, record(0, to, rest)) end
        if rec and rest == '' then redis.call('HDEL', KEYS[2], id) end
      else
        if a == 1 then due = moved(due) end -- a first attempt at another score
        redis.call('HSET', KEYS[2], id, record(a - 1, due, rest))
      end
    end
    redis.call('ZADD', KEYS[1], to, id)
  end
end
if n > 0 and mode ~= 'cancel' then notify(ARGV[3], to) end
return n
