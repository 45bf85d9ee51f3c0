-- dequeue.lua: asynq v0.26's dequeue of up to ARGV[3] tasks, and the
-- Begin of each one's run in the same step, for the store's AsynqClient
-- (middleware_dequeue.go, middleware_prefetch.go).
-- KEYS and ARGV[1..2] are asynq's: the queue's pending list, paused flag,
-- active list and lease set; the tasks' lease deadline (Unix s) and the
-- prefix of its tasks' keys. ARGV[3] how many tasks to take at most,
-- ARGV[4] the holder (the process's id among the store's live ones),
-- ARGV[5..] the task types the store's middleware has handled.
-- KEYS[5] the queue's holder marks (a hash in the queue's slot: task id ->
-- holder), where each task taken is marked as the holder's until its
-- run begins (middleware_held.go).
-- The store writes in front of it (dequeueScript): PREFIX its prefix,
-- TAGGED whether that has a hash tag, DONE_SUB its buckets of finished
-- records in each slot, TAGS the hash tag of each slot (4 bytes each,
-- padded with spaces), CRC the CRC16 table (2 bytes an entry), CRC0 the
-- CRC16 of PREFIX, and MAXLEN
-- the longest key; and, as begin.lua's, LEASE_MS, TTL_MS and RETENTION_MS.
-- Each task taken makes asynq's writes (the task active, under the lease)
-- and then, where it begins a run, begin.lua's.
-- Returns 5 values a task taken, in the order taken (none for a paused or
-- empty queue): its message, its id, the reply of its Begin (the new
-- run's token; 0 for a key that finished, begin.lua's {1, 0, 0}; -1 where
-- it began none), and the bucket and field where it looked for the
-- finished record ('' where it began none; the middleware checks they are
-- its own).
-- It begins nothing for a task of another type, one whose message holds a
-- header of the store's (zclaim-job or zclaim-takeover, as a key of its
-- headers: its key is not its id; bytes of the payload that look so only
-- make it leave the Begin to the middleware), an id the
-- middleware refuses, or a key that has a run record (the middleware's
-- Begin then makes its own call), nor where its commands fail (a key of
-- the wrong type): asynq's part is made all the same.
if redis.call('EXISTS', KEYS[2]) ~= 0 then return {} end

-- The task's type: the message's field 1 (protobuf), its first when set.
local function typeOf(m)
  if string.byte(m, 1) ~= 10 then return nil end
  local n, mul, p = 0, 1, 2
  while true do
    local b = string.byte(m, p)
    if not b or p > 5 then return nil end
    n, mul, p = n + b % 128 * mul, mul * 128, p + 1
    if b < 128 then break end
  end
  return string.sub(m, p, p + n - 1)
end

-- The Redis Cluster slot of the run record PREFIX .. k (CRC16 of its hash
-- tag), as keys.go's slot: PREFIX has no brace (TAGGED is false), so the
-- tag is one in k, or else the whole name, whose CRC16 goes on from
-- PREFIX's (CRC0).
local function slot(k)
  local crc = CRC0
  local s = string.find(k, '{', 1, true)
  if s then
    local e = string.find(k, '}', s + 1, true)
    if e and e > s + 1 then k, crc = string.sub(k, s + 1, e - 1), 0 end
  end
  -- A byte at a time, its two halves apart: a call of the bit library or
  -- of string.byte costs Redis more than the arithmetic around it.
  local bytes = {string.byte(k, 1, -1)}
  local hi, lo = (crc - crc % 256) / 256, crc % 256
  for j = 1, #bytes do
    local x = bit.bxor(hi, bytes[j])
    local th, tl = string.byte(CRC, 2 * x + 1, 2 * x + 2)
    hi, lo = bit.bxor(lo, th), tl
  end
  return (hi * 256 + lo) % 16384
end


local now_us, now_ms

local function begin(id)
  local h = redis.sha1hex(id)
  -- The field: the digest's first 16 bytes, read as 4 numbers of 32 bits.
  local a, b, c, d = tonumber(string.sub(h, 1, 8), 16), tonumber(string.sub(h, 9, 16), 16),
    tonumber(string.sub(h, 17, 24), 16), tonumber(string.sub(h, 25, 32), 16)
  local field = string.char(
    (a - a % 16777216) / 16777216, (a % 16777216 - a % 65536) / 65536, (a % 65536 - a % 256) / 256, a % 256,
    (b - b % 16777216) / 16777216, (b % 16777216 - b % 65536) / 65536, (b % 65536 - b % 256) / 256, b % 256,
    (c - c % 16777216) / 16777216, (c % 16777216 - c % 65536) / 65536, (c % 65536 - c % 256) / 256, c % 256,
    (d - d % 16777216) / 16777216, (d % 16777216 - d % 65536) / 65536, (d % 65536 - d % 256) / 256, d % 256)
  local n = tonumber(string.sub(h, 33, 40), 16) % DONE_SUB
  local bucket
  if TAGGED then
    bucket = PREFIX .. '\0done:' .. n
  else
    local s = slot(id)
    bucket = PREFIX .. '\0done:{' .. string.match(string.sub(TAGS, 4 * s + 1, 4 * s + 4), '%w+') .. '}' .. n
  end
  if not now_us then
    local t = redis.call('TIME')
    now_us = t[1] * 1000000 + t[2]
    now_ms = (now_us - now_us % 1000) / 1000
  end
  local fin = redis.call('HGET', bucket, field)
  if fin and tonumber(fin) + RETENTION_MS > now_ms then return 0, bucket, field end
  -- One TIME a call: the runs it begins share their token, each of its own key.
  local rec = redis.call('SET', PREFIX .. id, string.format('run %d %d', now_us, now_ms + LEASE_MS), 'NX', 'PX', 'TTL_MS', 'GET')
  if rec then return -1, '', '' end
  return now_us, bucket, field
end

local known = {}
for j = 5, #ARGV do known[ARGV[j]] = true end
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
    local tok, bucket, field = -1, '', ''
    if known[typeOf(msg)] and #id <= MAXLEN and string.sub(id, 1, 5) ~= '\0done' and
      not string.find(msg, '\10\10zclaim-job', 1, true) and not string.find(msg, '\10\15zclaim-takeover', 1, true) then
      local ok, t, b, f = pcall(begin, id)
      if ok then tok, bucket, field = t, b, f end
    end
    local j = #out
    out[j + 1], out[j + 2], out[j + 3], out[j + 4], out[j + 5] = msg, id, tok, bucket, field
  end
end
return out
