-- prelude.lua: helpers prepended to every broker script when it is loaded
-- (after history.lua).
-- Nothing here runs on its own; each script's contract is in its own file.
--
-- Record format (opaque to Lua past its prefix):
--   "<attempts>@<due>:<rest>" where attempts counts the claims already made
--   of this run, due is the score the occurrence was first scheduled at (its
--   identity: a retry's backoff moves the job's score, never its due), and
--   rest is the Go-encoded type/queue/payload ("" for none). A record without
--   "@<due>" (written by an older version) gets one at its next claim. A
--   due with a leading zero ("0…", "-0…") belongs to a job kept at another
--   score (see moved below); a claim reads any other first attempt's score
--   from its due. A retry waiting on the schedule (settle_back) also keeps
--   the score it was put back at, "<attempts>@<due>~<score>:<rest>": a claim
--   that finds the member at another score knows that a producer added it
--   again (a plain ZADD, which only moves the member) and starts a new
--   occurrence. Every other writer drops the "~<score>" (run_attempt).

-- wrongtype returns "key type" for the first key in kt ({key, type, ...})
-- that exists with another type, or nil. Scripts call it before writing,
-- since a script does not roll back what it wrote before an error.
local function wrongtype(kt)
  for i = 1, #kt, 2 do
    local got = redis.call('TYPE', kt[i])['ok']
    if got ~= 'none' and got ~= kt[i + 1] then
      return kt[i] .. ' ' .. got
    end
  end
  return nil
end

-- read runs a reading command on key. If key holds another type it
-- returns nil and an error reply naming the key, like wrongtype's; a script
-- that reads a key before its first write needs no TYPE check for it.
local function read(cmd, key, ...)
  local r = redis.pcall(cmd, key, ...)
  if type(r) == 'table' and r.err then
    if string.find(r.err, 'WRONGTYPE', 1, true) then
      return nil, redis.error_reply('ZCLAIM_WRONGTYPE ' .. key .. ' ' .. redis.call('TYPE', key)['ok'])
    end
    return nil, r
  end
  return r
end

-- clock reads Redis TIME: now in Unix ms (whole), in score units (ups =
-- units per second: 1 for seconds with fractions, 1000 for ms) and in Unix µs.
local function clock(ups)
  local t = redis.call('TIME')
  local s, us = tonumber(t[1]), tonumber(t[2])
  local now_ms = s * 1000 + math.floor(us / 1000)
  local now
  if ups == 1000 then now = s * 1000 + us / 1000 else now = s + us / 1000000 end
  return now_ms, now, s * 1000000 + us
end

-- notify publishes an earlier due time on channel ch ("s|<channel>":
-- with SPUBLISH, to the node of the channel's slot, on Redis Cluster). The notice only
-- wakes dispatchers sooner (they look within MaxWait anyway), so a user
-- that may not publish (an ACL without the channel) does not fail the
-- writes before it. Returns false when the notice was refused.
local function notify(ch, score)
  local cmd = 'PUBLISH'
  if string.sub(ch, 1, 2) == 's|' then cmd, ch = 'SPUBLISH', string.sub(ch, 3) end
  local r = redis.pcall(cmd, ch, score)
  return not (type(r) == 'table' and r.err)
end

-- split_member parses an in-flight member "id|token" or "id|token@due",
-- the second for a job without a record, whose occurrence's due rides in
-- the member; it returns id, token and due ('' for none).
local function split_member(m)
  local id, tok, due = string.match(m, '^(.*)|(%d+)@([^|@]*)$')
  if id then return id, tok, due end
  id, tok = string.match(m, '^(.*)|(%d+)$')
  return id, tok, ''
end

-- run_attempt returns the attempt number of a claim whose record was rec
-- (1 for none or an unreadable one), the occurrence's due score ('' when
-- the record has none; without a retry's "~<score>") and the record's rest.
local function run_attempt(rec)
  local a, due, rest = string.match(rec or '', '^(%d+)@([^:~]*)[^:]*:(.*)$')
  if not a then
    due = ''
    a, rest = string.match(rec or '', '^(%d+):(.*)$')
  end
  if not a then return 1, '', '' end
  return tonumber(a) + 1, due, rest
end

-- take_run removes the run record of token tok and returns the claim's
-- attempt number, the occurrence's due (the record's, else mdue, the
-- member's) and the record's rest (run_attempt).
local function take_run(R, tok, mdue)
  local rec = redis.call('HGET', R, tok)
  if rec then redis.call('HDEL', R, tok) end
  local a, due, rest = run_attempt(rec)
  if due == '' then due = mdue or '' end
  return a, due, rest
end

-- A batch lease (a dispatcher's claim, settled as one, or Broker.Claim's,
-- settled job by job: see settled_places below) is a member
-- "first:n" of the batches ZSet, scored by its deadline, where first is
-- the token of its first job and n the number of jobs; the run records
-- hash keeps the jobs under "b" .. first, each as
-- "<len>:<id><len>:<record>" (an empty record for a job that had none),
-- and the count of jobs held in batch leases under "batched" (while any is).
-- A dispatcher's batch lease is also marked under "d" .. first: its jobs
-- come back due at once when it expires (recover.lua).

-- batch_entry reads the entry of a batch lease's jobs blob that starts at
-- pos: its id, its record and where the next entry starts; nil when no
-- whole entry starts there.
local function batch_entry(blob, pos)
  local l1 = string.match(blob, '^(%d+):', pos)
  if not l1 then return nil end
  local s1 = pos + #l1 + 1
  local e1 = s1 + tonumber(l1) - 1
  local l2 = e1 < #blob and string.match(blob, '^(%d+):', e1 + 1)
  if not l2 then return nil end
  local s2 = e1 + #l2 + 2
  local e2 = s2 + tonumber(l2) - 1
  if e2 > #blob then return nil end
  return string.sub(blob, s1, e1), string.sub(blob, s2, e2), e2 + 1
end

-- parse_batch splits a batch lease's jobs blob into two arrays, ids and
-- records. A damaged blob ends the list early; the part that cannot be
-- read comes back third (nil when the whole blob was read).
local function parse_batch(blob)
  local ids, recs = {}, {}
  local pos = 1
  while pos <= #blob do
    local id, rec, nxt = batch_entry(blob, pos)
    if not id then break end
    ids[#ids + 1], recs[#recs + 1], pos = id, rec, nxt
  end
  if pos <= #blob then return ids, recs, string.sub(blob, pos) end
  return ids, recs, nil
end

-- The claims of one Broker.Claim call share a batch lease and are settled
-- one by one (part.lua): while any is, the run records hash keeps under
-- "s" .. first one byte a place, "1" for a job already settled, and
-- "batched" counts only the jobs not settled. settled_places returns the
-- bytes of lease first (n jobs) as an array (49 for settled), or nil when
-- none is settled; places_string turns such an array back into the field.
local function settled_places(R, first, n)
  local mask = redis.call('HGET', R, 's' .. first)
  if mask then return {string.byte(mask, 1, n)} end
  return nil
end
-- unsettled counts the places of a lease of n jobs not settled in p
-- (settled_places' array, or nil for none settled).
local function unsettled(p, n)
  local left = n
  for j = 1, p and n or 0 do
    if p[j] == 49 then left = left - 1 end
  end
  return left
end
local function places_string(p, n)
  for j = 1, n do
    if p[j] ~= 49 then p[j] = 48 end
  end
  return string.char(unpack(p, 1, n))
end

-- take_batch removes batch lease m ("first:n") and its jobs' records, and
-- returns its jobs as two arrays, ids and records (empty unless jobs is
-- true); nil when m is not held (its lease was lost). A damaged record
-- ends the list early: the part that cannot be read comes back third,
-- with the lease's first token fourth, for the dead set (bury_damaged).
-- Fifth come the lease's settled places (settled_places; read only with
-- jobs): jobs that are in the arrays but were settled already; sixth,
-- with jobs, whether it was a dispatcher's lease ("d" .. first).
local function take_batch(B, R, m, jobs)
  if redis.call('ZREM', B, m) == 0 then return nil end
  local first, n = string.match(m, '^(%d+):(%d+)$')
  if not first then return {}, {}, m, '0' end
  local blob = jobs and redis.call('HGET', R, 'b' .. first) or ''
  n = tonumber(n)
  local places = jobs and settled_places(R, first, n)
  local dispatch = jobs and redis.call('HEXISTS', R, 'd' .. first) == 1
  redis.call('HDEL', R, 'b' .. first, 's' .. first, 'd' .. first)
  if redis.call('HINCRBY', R, 'batched', -unsettled(places, n)) == 0 then redis.call('HDEL', R, 'batched') end
  local ids, recs, damaged = parse_batch(blob)
  return ids, recs, damaged, damaged and first, places, dispatch
end

-- record joins a record's parts (see the top of this file).
local function record(attempts, due, rest)
  return attempts .. '@' .. due .. ':' .. rest
end

-- moved marks the due of a record whose job keeps its occurrence at
-- another score (revived, moved) with a leading zero ("-0" for a negative
-- one): the same number to every reader, and a claim takes the score of
-- a first attempt from its record only when the due begins with 1 to 9.
local function moved(due)
  local c = string.sub(due, 1, 1)
  if c == '0' then return due end
  if c == '-' then
    if string.sub(due, 2, 2) == '0' then return due end
    return '-0' .. string.sub(due, 2)
  end
  return '0' .. due
end

-- H is the schedule's history for a script that writes it
-- (broker_sent.go): the hash of the time bucket now (H.key; nil: the
-- script writes none), when it expires (H.exp, Unix ms), and the score
-- units per second (H.ups). hist adds an event of id to it (history.lua),
-- with the occurrence's due, a score ('' when unknown), in ms.
local H = {}
-- hist_due is due, a score, in ms ('' when it is none).
local function hist_due(due)
  local d = tonumber(due)
  if not d then return '' end
  return string.format('%d', math.floor(d * 1000 / H.ups + 0.5))
end
local function hist(id, kind, due, detail)
  if not H.key then return end
  if not H.ms then
    local t = redis.call('TIME')
    H.ms = t[1] * 1000 + math.floor(t[2] / 1000)
  end
  hist_add(H.key, id, H.ms, kind, hist_due(due), detail)
  H.written = true
end

-- hist_end sets the expiry of the bucket a script wrote events into.
local function hist_end()
  if H.written then redis.call('PEXPIREAT', H.key, H.exp) end
end

-- bury puts id into the dead set with its reason and record.
-- D: dead ZSet (score = Unix ms of death); DI: dead info hash.
local function bury(D, DI, id, now_ms, attempt, due, rest, reason)
  redis.call('ZADD', D, now_ms, id)
  redis.call('HSET', DI, id, string.len(reason) .. ':' .. reason .. record(attempt, due, rest))
  hist(id, 'd', due, reason)
end

-- bury_damaged keeps the unreadable part of a batch lease's record in the
-- dead set, as the entry "zclaim:damaged-batch:<first token>", rather than
-- drop the jobs it held.
local function bury_damaged(D, DI, first, damaged, now_ms)
  bury(D, DI, 'zclaim:damaged-batch:' .. first, now_ms, 0, '', '', 'damaged batch record; unread: ' .. damaged)
end

-- settle_back ends a run that did not finish (its record already taken
-- with take_run): back to the schedule at score, keeping the occurrence's
-- due and the score itself ("~<score>", see the top of this file), or into
-- the dead set once attempt >= max. If a newer run of the id is already
-- scheduled, that one stands for the same work and this run is dropped.
-- why says in the history why it went back (H).
-- Returns 1 when requeued, 2 when dead, 3 when superseded.
local function settle_back(S, P, D, DI, id, attempt, due, rest, score, max, now_ms, reason, why)
  if redis.call('ZSCORE', S, id) then return 3 end
  if attempt >= max then
    bury(D, DI, id, now_ms, attempt, due, rest, reason)
    return 2
  end
  redis.call('ZADD', S, score, id)
  hist(id, 'r', due, why or '')
  -- A run without a due (an older version's) gets its score as its due
  -- at the next claim, and keeps no score of its own.
  if due ~= '' then due = due .. '~' .. string.format('%.17g', score) end
  redis.call('HSET', P, id, record(attempt, due, rest))
  return 1
end
