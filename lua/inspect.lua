-- inspect.lua: look up one job, or read one page of a listing, at one
-- instant and without writing.
-- KEYS[1] schedule ZSet   KEYS[2] pending records hash   KEYS[3] in-flight ZSet
-- KEYS[4] run records hash   KEYS[5] batches ZSet   KEYS[6] dead ZSet
-- KEYS[7] dead info hash
-- ARGV[1] "job": ARGV[2] the id. Every entry of the id: its scheduled
--   run, its runs in flight (per-job claims and batch leases) and its dead
--   entry. Costs O(log n) for the scheduled and dead entries and a scan of
--   the in-flight runs (claims held at this instant) for the others.
-- ARGV[1] "scheduled" | "dead" | "inflight": one page in score order (due
--   time, time of death, lease deadline) after a cursor: ARGV[2] the
--   cursor's score ("" from the start), ARGV[3] its member, ARGV[4] the
--   page size, ARGV[5] (inflight) "i" while paging the per-job claims, "b"
--   for the batch leases that follow them, ARGV[6] (b) jobs of the cursor's
--   lease already listed. O(log n + page) unless many members share the
--   cursor's score and the cursor's member has left.
-- Returns entries {kind, id, score, data|false, ref} flattened, where kind
-- is "s" (score: the due score; data: the pending record), "i" (score: the
-- lease deadline in ms; ref: the in-flight member; data: its run record),
-- "b" (as "i"; ref: "<lease member>#<index in the lease>"; data: the
-- job's record from the lease, "" for none) or "d" (score: the time of
-- death in ms; data: the dead info); then, for a listing, a last element:
-- the next cursor {score, member, phase, listed} or false at the end.
-- Error "ZCLAIM_WRONGTYPE key type".
local bad = wrongtype({KEYS[1], 'zset', KEYS[2], 'hash', KEYS[3], 'zset', KEYS[4], 'hash',
  KEYS[5], 'zset', KEYS[6], 'zset', KEYS[7], 'hash'})
if bad then return redis.error_reply('ZCLAIM_WRONGTYPE ' .. bad) end

local out = {}
local function add(kind, id, score, data, ref)
  out[#out + 1] = kind
  out[#out + 1] = id
  out[#out + 1] = score
  out[#out + 1] = data or false
  out[#out + 1] = ref or ''
end

-- lease_jobs returns the ids and records of batch lease m, and the
-- places of its jobs already settled (see settled_places).
local function lease_jobs(m)
  local first, n = string.match(m, '^(%d+):(%d+)$')
  if not first then return {}, {}, {} end
  local ids, recs = parse_batch(redis.call('HGET', KEYS[4], 'b' .. first) or '')
  return ids, recs, settled_places(KEYS[4], first, tonumber(n)) or {}
end

if ARGV[1] == 'job' then
  local id = ARGV[2]
  local s = redis.call('ZSCORE', KEYS[1], id)
  if s then add('s', id, s, redis.call('HGET', KEYS[2], id)) end
  local pat = string.gsub(id, '[%*%?%[%]\\]', '\\%0') .. '|*'
  local cur = '0'
  repeat
    local r = redis.call('ZSCAN', KEYS[3], cur, 'MATCH', pat, 'COUNT', 1000)
    cur = r[1]
    for i = 1, #r[2], 2 do
      local mid, tok = split_member(r[2][i])
      if mid == id then add('i', id, r[2][i + 1], redis.call('HGET', KEYS[4], tok), r[2][i]) end
    end
  until cur == '0'
  local b = redis.call('ZRANGE', KEYS[5], 0, -1, 'WITHSCORES')
  for i = 1, #b, 2 do
    local ids, recs, settled = lease_jobs(b[i])
    for j = 1, #ids do
      if ids[j] == id and settled[j] ~= 49 then add('b', id, b[i + 1], recs[j], b[i] .. '#' .. j) end
    end
  end
  local d = redis.call('ZSCORE', KEYS[6], id)
  if d then add('d', id, d, redis.call('HGET', KEYS[7], id)) end
  return out
end

-- after reports whether a sorts after b byte by byte, as a sorted set
-- orders members of one score (Lua's own < follows the server's locale).
local function after(a, b)
  local n = math.min(#a, #b)
  for i = 1, n do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then return x > y end
  end
  return #a > #b
end

-- start returns the rank just after cursor (s, m) in Z, and whether m
-- is still there at s; with incl, the rank of m itself then.
local function start(Z, s, m, incl)
  if s == '' then return 0, false end
  local at = redis.call('ZSCORE', Z, m)
  if at and tonumber(at) == tonumber(s) then
    return redis.call('ZRANK', Z, m) + (incl and 0 or 1), true
  end
  -- m left: skip the members that share its score and sort before it.
  local r = redis.call('ZCOUNT', Z, '-inf', '(' .. s)
  while true do
    local x = redis.call('ZRANGE', Z, r, r, 'WITHSCORES')
    if not x[1] or tonumber(x[2]) ~= tonumber(s) or after(x[1], m) then return r, false end
    r = r + 1
  end
end

local n = tonumber(ARGV[4])
local what = ARGV[1]
if what == 'scheduled' or what == 'dead' or (what == 'inflight' and ARGV[5] == 'i') then
  local Z, H = KEYS[1], KEYS[2]
  if what == 'dead' then Z, H = KEYS[6], KEYS[7] elseif what == 'inflight' then Z, H = KEYS[3], KEYS[4] end
  local r = start(Z, ARGV[2], ARGV[3], false)
  local z = redis.call('ZRANGE', Z, r, r + n, 'WITHSCORES')
  local more = #z > 2 * n
  if more then z[#z], z[#z - 1] = nil, nil end
  for i = 1, #z, 2 do
    if what == 'inflight' then
      local id, tok = split_member(z[i])
      add('i', id or z[i], z[i + 1], redis.call('HGET', H, tok or ''), z[i])
    else
      add(string.sub(what, 1, 1), z[i], z[i + 1], redis.call('HGET', H, z[i]))
    end
  end
  if more then
    out[#out + 1] = {z[#z], z[#z - 1], ARGV[5] or '', '0'}
    return out
  end
  if what ~= 'inflight' then
    out[#out + 1] = false
    return out
  end
  n = n - #z / 2
  ARGV[2], ARGV[3], ARGV[6] = '', '', '0'
  if n == 0 then
    -- The page is full: the next one starts at the batch leases, if any.
    if redis.call('ZCARD', KEYS[5]) == 0 then out[#out + 1] = false else out[#out + 1] = {'', '', 'b', '0'} end
    return out
  end
end
-- The jobs of batch leases, lease by lease in deadline order.
local r, held = start(KEYS[5], ARGV[2], ARGV[3], true)
local skip = held and tonumber(ARGV[6]) or 0
while n > 0 do
  local l = redis.call('ZRANGE', KEYS[5], r, r, 'WITHSCORES')
  if not l[1] then
    out[#out + 1] = false
    return out
  end
  local ids, recs, settled = lease_jobs(l[1])
  local j = skip + 1
  while j <= #ids and n > 0 do
    if settled[j] ~= 49 then
      add('b', ids[j], l[2], recs[j], l[1] .. '#' .. j)
      n = n - 1
    end
    j = j + 1
  end
  if n == 0 then
    if j <= #ids then
      out[#out + 1] = {l[2], l[1], 'b', tostring(j - 1)}
    else
      out[#out + 1] = {l[2], l[1], 'b', tostring(#ids)}
    end
    return out
  end
  skip = 0
  r = r + 1
end
out[#out + 1] = false
return out
