-- periodic.lua: periodic definitions and their ticks.
-- KEYS[1] schedule ZSet   KEYS[2] pending records hash
-- KEYS[3] definitions hash (name -> definition)
-- KEYS[4] tick marks hash (name -> "<next tick, Unix ms> <timing>")
-- Each definition has one tick at a time: the job "periodic:<name>" on the
-- schedule (or in flight), due at its mark. A dispatcher that claimed the
-- tick at the mark writes the next one (advance), once: the mark is the
-- guard.
--
-- ARGV[1] "set": ARGV[2] notice channel, ARGV[3] Unix ms before which a
--   mark whose tick is not scheduled is stale (its tick was cancelled or
--   died: the chain is repaired); then per definition: name, definition,
--   timing (spec and time zone), next tick ms, next tick score, record
--   rest. An unchanged definition is left alone; a changed one is stored,
--   and a changed timing (or a new definition, or a stale mark) schedules
--   its next tick, replacing the one scheduled. Returns how many changed.
-- ARGV[1] "delete": ARGV[2] name. Removes the definition, its mark and its
--   scheduled tick. Returns 1 when it existed, else 0.
-- ARGV[1] "advance": ARGV[2] notice channel, ARGV[3] name, ARGV[4] the mark
--   expected (the claimed tick's ms), ARGV[5] next tick ms, ARGV[6] its
--   score, ARGV[7] record rest. Returns 1 when it moved the mark, else 0
--   (another claim moved it, the timing changed, or the definition is gone).
-- ARGV[1] "get": ARGV[2] name. Returns {definition|false, mark|false}.
-- ARGV[1] "list": returns {name1, definition1, mark1|false, ...}.
-- Error "ZCLAIM_WRONGTYPE key type".
local bad = wrongtype({KEYS[1], 'zset', KEYS[2], 'hash', KEYS[3], 'hash', KEYS[4], 'hash'})
if bad then return redis.error_reply('ZCLAIM_WRONGTYPE ' .. bad) end
local S, P, DEF, TICK = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local prefix = 'periodic:'
local mode = ARGV[1]

local function schedule_tick(name, ms, timing, score, rest)
  redis.call('HSET', TICK, name, ms .. ' ' .. timing)
  redis.call('ZADD', S, score, prefix .. name)
  redis.call('HSET', P, prefix .. name, record(0, score, rest))
end

if mode == 'set' then
  local n, min = 0, nil
  local stale = tonumber(ARGV[3])
  for i = 4, #ARGV, 6 do
    local name, def, timing, ms, score, rest = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3], ARGV[i + 4], ARGV[i + 5]
    local id = prefix .. name
    local mark = redis.call('HGET', TICK, name)
    local mark_ms, old_timing
    if mark then mark_ms, old_timing = string.match(mark, '^(%d+) (.*)$') end
    local scheduled = redis.call('ZSCORE', S, id)
    local broken = mark_ms and not scheduled and tonumber(mark_ms) < stale
    if old_timing ~= timing or broken then
      redis.call('HSET', DEF, name, def)
      schedule_tick(name, ms, timing, score, rest)
      n = n + 1
      if min == nil or tonumber(score) < min then min = tonumber(score) end
    elseif redis.call('HGET', DEF, name) ~= def then
      redis.call('HSET', DEF, name, def)
      n = n + 1
      if scheduled then
        -- The tick keeps its occurrence and attempts; it carries the new type, queue and payload.
        local a, due = run_attempt(redis.call('HGET', P, id))
        if due == '' then due = scheduled end
        redis.call('HSET', P, id, record(a - 1, due, rest))
      end
    end
  end
  if min then notify(ARGV[2], min) end
  return n
end

if mode == 'delete' then
  local name = ARGV[2]
  local existed = redis.call('HDEL', DEF, name)
  redis.call('HDEL', TICK, name)
  redis.call('ZREM', S, prefix .. name)
  redis.call('HDEL', P, prefix .. name)
  return existed
end

if mode == 'advance' then
  local name = ARGV[3]
  local mark = redis.call('HGET', TICK, name)
  if not mark or not redis.call('HEXISTS', DEF, name) then return 0 end
  local mark_ms, timing = string.match(mark, '^(%d+) (.*)$')
  if mark_ms ~= ARGV[4] then return 0 end
  schedule_tick(name, ARGV[5], timing, ARGV[6], ARGV[7])
  notify(ARGV[2], ARGV[6])
  return 1
end

if mode == 'get' then
  return {redis.call('HGET', DEF, ARGV[2]), redis.call('HGET', TICK, ARGV[2])}
end

if mode == 'list' then
  local out = {}
  local all = redis.call('HGETALL', DEF)
  for i = 1, #all, 2 do
    out[#out + 1] = all[i]
    out[#out + 1] = all[i + 1]
    out[#out + 1] = redis.call('HGET', TICK, all[i])
  end
  return out
end
return redis.error_reply('ZCLAIM_ARG unknown mode ' .. tostring(mode))
