-- claim.lua: atomically take up to max due jobs and lease them.
-- KEYS[1] schedule ZSet (member = job id, score = due time in score units)
-- KEYS[2] in-flight ZSet (member = id .. "|" .. token, or id .. "|" .. token .. "@" .. due
--   for a job without a record; score = lease deadline, Unix ms)
-- KEYS[3] token counter (string: the last token)   KEYS[4] pending records hash (id -> record)
-- KEYS[5] run records hash (token -> record of a claimed run; batch leases: see lua/prelude.lua)
-- KEYS[6] batches ZSet (batch leases, see lua/prelude.lua)
-- ARGV[1] max (1..1000)   ARGV[2] lease in ms   ARGV[3] score units per second (1 or 1000)
-- ARGV[4] "batch" for one lease over the whole batch (a dispatcher's claim,
--   settled with finish.lua, or Broker.Claim's, settled job by job with
--   part.lua) instead of one in-flight member per job;
--   "batch-ids" for the same without the jobs' due times (Redis formats
--   each score it answers, which costs it more than the claim's own work)
-- ARGV[5] "dispatch" for a dispatcher's batch lease: recovery puts its jobs
--   back due at once, not after their backoff (the dispatcher died, not the
--   job's run); "" otherwise
-- Returns {deadline_ms, first_token, now, next, {id1, score1, id2, ...},
--   {record1|false, record2|false, ...}}, or {} for the records when the
--   pending records hash is empty, where tokens run first_token,
--   first_token+1, ... in reply order, now is Redis TIME in score units and
--   next is the earliest remaining score or false (after a full batch: now,
--   since more may be due); {0, 0, now, next, inflight} when nothing is
--   due, where inflight counts the in-flight members and batch leases.
--   A batch claim answers its jobs as the record of its lease (see
--   prelude.lua) and their scores joined by spaces instead:
--   {deadline_ms, first_token, now, next, jobs, "score1 score2 ..." or false},
--   where a lazy claim (below) leaves a score empty where the job's record
--   gives it.
--   A claim that reads scores where the pending records hash is not empty
--   (lazy) reads ids only; a per-job one answers {deadline_ms, first_token,
--   now, next, {id1, id2, ...}, {record1|false, ...}, {index1, score1,
--   index2, score2, ...}}: the scores of the jobs (by place, from 1) whose
--   record does not give one. A first attempt's score is its record's due
--   (what Schedule wrote), unless the due is marked moved (see moved in
--   lua/prelude.lua). A retry found at another score than the one it was
--   put back at is answered as a new occurrence: attempts 0, due = its
--   score (see the record format in lua/prelude.lua).
--   Error "ZCLAIM_WRONGTYPE key type", or "ZCLAIM_CORRUPT key" for a token
--   counter that no token can follow.
-- Every key is read, or checked, before the first write.
local batch, scored = ARGV[4] == 'batch' or ARGV[4] == 'batch-ids', ARGV[4] ~= 'batch-ids'
local bad = wrongtype({batch and KEYS[6] or KEYS[2], 'zset', KEYS[5], 'hash'})
if bad then return redis.error_reply('ZCLAIM_WRONGTYPE ' .. bad) end

local max, lease, ups = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local now_ms, now, now_us = clock(ups)
local now_s = string.format('%.6f', now)
-- Redis formats every score it answers (snprintf %.17g): a claim that
-- reads scores, of jobs with records, asks only for those whose record
-- does not give it (lazy).
local pending, lazy, due, err = nil, false, nil, nil
if scored then
  pending, err = read('HLEN', KEYS[4])
  if err then return err end
  lazy = pending > 0
end
if scored and not lazy then
  due, err = read('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'WITHSCORES', 'LIMIT', 0, max)
else
  due, err = read('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, max)
end
if err then return err end
local n = (scored and not lazy) and #due / 2 or #due
local function next_score()
  local head = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  if head[2] then return head[2] end
  return false
end
-- Nothing due: also whether anything is in flight (claims or batch
-- leases), so that an idle claimer's recovery loop can rest.
if n == 0 then return {0, 0, now_s, next_score(), redis.call('ZCARD', KEYS[2]) + redis.call('ZCARD', KEYS[6])} end

local ids = due
if scored and not lazy then
  ids = {}
  for i = 1, n do ids[i] = due[2 * i - 1] end
end
local last, recs
last, err = read('GET', KEYS[3])
if err then return err end
-- A counter that this claim's tokens cannot follow exactly (within max of
-- 2^53, where doubles stop telling integers apart; inf; NaN) is corrupt:
-- refuse before writing anything.
local base = tonumber(last or '0') or 0
if not (base < 9007199254740991 - max) then return redis.error_reply('ZCLAIM_CORRUPT ' .. KEYS[3]) end
-- An empty pending records hash (every job a plain ZADD) is not read
-- further: no job has a record.
if not pending then
  pending, err = read('HLEN', KEYS[4])
  if err then return err end
end
if pending > 0 then
  recs, err = read('HMGET', KEYS[4], unpack(ids))
  if err then return err end
else
  recs = {}
end

-- Every claimed run carries its occurrence's due (see lua/prelude.lua): a job
-- without one in its record (a plain ZADD, or a record of an older version)
-- takes its score, read only for those jobs when the claim reads no scores.
-- A per-job claim of a job without a record carries it in its in-flight
-- member instead ("id|token@due"): no run record to write.
local had, missing, ask, retried = false, {}, {}, {}
local nm, na, nr = 0, 0, 0 -- their lengths (#t is a search)
local byte = string.byte
for i = 1, n do
  local rec = recs[i]
  if rec then
    had = true
    -- A one-digit attempt, "@" and a due (what Schedule writes) is
    -- recognised by two bytes; the pattern is for the rest.
    local b1, b2, b3 = byte(rec, 1, 3)
    local dued = b2 == 64 and b3 ~= 58
    if not dued and not string.find(rec, '^%d+@[^:]') then nm = nm + 1; missing[nm] = i end
    -- A retry keeps the score it was put back at (prelude.lua): first
    -- attempts ("0@…") are told apart by their first byte.
    if b1 ~= 48 and string.find(rec, '^%d+@[^:~]*~') then nr = nr + 1; retried[nr] = i end
    -- A first attempt's record gives its score (lazy), unless its due
    -- says the job was moved since (prelude.lua's moved).
    if lazy and not (dued and b1 == 48 and b3 >= 49 and b3 <= 57) then na = na + 1; ask[na] = i end
  else
    if batch then nm = nm + 1; missing[nm] = i end
    if lazy then na = na + 1; ask[na] = i end
  end
end
-- lazy: the scores asked for, by place (scoreof), and as the reply gives
-- them (asked).
local scoreof, asked = {}, {}
-- zmscore reads the scores of the jobs at places idx, in idx's order;
-- scores takes them from what the claim read where it read them.
local function zmscore(idx, k)
  local q = {}
  for j = 1, k do q[j] = ids[idx[j]] end
  return redis.call('ZMSCORE', KEYS[1], unpack(q))
end
local function scores(idx, k)
  if not scored then return zmscore(idx, k) end
  local sc = {}
  for j = 1, k do
    local i = idx[j]
    if lazy then sc[j] = scoreof[i] else sc[j] = due[2 * i] end
  end
  return sc
end
if na > 0 then
  local sc = zmscore(ask, na)
  for j = 1, na do
    local i = ask[j]
    scoreof[i], asked[2 * j - 1], asked[2 * j] = sc[j], i, sc[j]
  end
end
if nm > 0 then
  local sc = scores(missing, nm)
  for j = 1, nm do
    local i, score = missing[j], sc[j]
    if recs[i] then
      -- A record that cannot be read is left as it is: the claimer
      -- reports it and sends the job to the dead set.
      local a, rest = string.match(recs[i], '^(%d+)@?:(.*)$')
      if a then recs[i] = record(a, score, rest) end
    else
      recs[i] = '0@' .. score .. ':' -- record('0', score, ''), inline
    end
  end
end
-- A retry found at the score it was put back at stays a retry of its
-- occurrence. One found at another score was added again by a producer
-- (a plain ZADD only moves a member): new work, a new occurrence due at
-- that score, which the retry's run of the old one gives way to.
if nr > 0 then
  local sc = scores(retried, nr)
  for j = 1, nr do
    local i, score = retried[j], sc[j]
    local a, d, back, rest = string.match(recs[i], '^(%d+)@([^:~]*)~([^:]*):(.*)$')
    if tonumber(score) == tonumber(back) then
      recs[i] = record(a, d, rest)
    else
      recs[i] = record('0', score, rest)
    end
  end
end

-- The due jobs are the n lowest scores.
redis.call('ZREMRANGEBYRANK', KEYS[1], 0, n - 1)
-- Tokens continue from the larger of the counter and Redis TIME in
-- microseconds, so they keep growing even if the counter is lost or rolled
-- back (an AOF that lost its last second, a failover to a lagging replica).
if now_us > base then base = now_us end
local first = base + 1
redis.call('SET', KEYS[3], string.format('%d', base + n))
local deadline = now_ms + lease

-- Records move with their jobs. HDEL passes over ids without one.
if had then redis.call('HDEL', KEYS[4], unpack(ids)) end
local next = now_s
if n < max then next = next_score() end

if batch then
  -- One lease for the batch: its jobs' ids and records in one field.
  -- "<length>:" is made once per length (lens), inline: a call of a
  -- helper per piece cost Redis about 5% of the claim.
  local parts, lens, k = {}, {}, 0
  for i = 1, n do
    local id, rec = ids[i], recs[i]
    local a, b = lens[#id], lens[#rec]
    if not a then a = #id .. ':'; lens[#id] = a end
    if not b then b = #rec .. ':'; lens[#rec] = b end
    parts[k + 1], parts[k + 2], parts[k + 3], parts[k + 4] = a, id, b, rec
    k = k + 4
  end
  local f, jobs = string.format('%d', first), table.concat(parts)
  redis.call('ZADD', KEYS[6], deadline, f .. ':' .. n)
  redis.call('HSET', KEYS[5], 'b' .. f, jobs)
  if ARGV[5] == 'dispatch' then redis.call('HSET', KEYS[5], 'd' .. f, 1) end
  redis.call('HINCRBY', KEYS[5], 'batched', n)
  local scores = false
  if scored then
    scores = {}
    if lazy then
      for i = 1, n do scores[i] = scoreof[i] or '' end
    else
      for i = 1, n do scores[i] = due[2 * i] end
    end
    scores = table.concat(scores, ' ')
  end
  return {deadline, first, now_s, next, jobs, scores}
end

-- One in-flight member per job; a record moves to its run's token, and a
-- job without one has its due in the member. Numbers are formatted once a
-- batch (the deadline) or once in ten jobs (the tokens' leading digits):
-- Redis would format every number it is given, and string.format costs
-- as much. The loop counts the last digit itself and appends with a
-- counter: a call of math.floor, or a table's length (#t, a search), for
-- each job cost Redis about 5% of the claim.
local zadd, hset, h = {}, {}, 0
local dl = string.format('%d', deadline)
local digits = {'0', '1', '2', '3', '4', '5', '6', '7', '8', '9'}
local ten = math.floor(first / 10)
local d = first - 10 * ten
local tens = ten > 0 and string.format('%d', ten) or ''
for i = 1, n do
  if d == 10 then
    d, ten = 0, ten + 1
    tens = string.format('%d', ten)
  end
  local digit = digits[d + 1]
  d = d + 1
  zadd[2 * i - 1] = dl
  local rec = recs[i]
  if rec then
    local tok = tens .. digit
    zadd[2 * i] = ids[i] .. '|' .. tok
    hset[h + 1], hset[h + 2] = tok, rec
    h = h + 2
  else
    local score
    if lazy then score = scoreof[i] else score = due[2 * i] end
    zadd[2 * i] = ids[i] .. '|' .. tens .. digit .. '@' .. score
  end
end
redis.call('ZADD', KEYS[2], unpack(zadd))
if h > 0 then redis.call('HSET', KEYS[5], unpack(hset)) end
if lazy then return {deadline, first, now_s, next, ids, recs, asked} end
return {deadline, first, now_s, next, due, recs}
