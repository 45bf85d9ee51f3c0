-- prelude.lua: helpers prepended to every broker script when it is loaded.
-- Nothing here runs on its own; each script's contract is in its own file.
--
-- Record format (opaque to Lua past the attempts prefix):
--   "<attempts>:<rest>" where attempts counts the claims already made of
--   this run and rest is the Go-encoded type/queue/payload ("" for none).

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

-- split_member parses an in-flight member "id|token".
local function split_member(m)
  return string.match(m, '^(.*)|(%d+)$')
end

-- take_run removes the run record of token tok and returns the claim's
-- attempt number (1 for a run without a record) and the record's rest.
local function take_run(R, tok)
  local rec = redis.call('HGET', R, tok)
  if not rec then return 1, '' end
  redis.call('HDEL', R, tok)
  local a, rest = string.match(rec, '^(%d+):(.*)$')
  if not a then return 1, '' end
  return tonumber(a) + 1, rest
end

-- bury puts id into the dead set with its reason and record.
-- D: dead ZSet (score = Unix ms of death); DI: dead info hash.
local function bury(D, DI, id, now_ms, attempt, rest, reason)
  redis.call('ZADD', D, now_ms, id)
  redis.call('HSET', DI, id, string.len(reason) .. ':' .. reason .. attempt .. ':' .. rest)
end

-- settle_back ends a run that did not finish (its record already taken
-- with take_run): back to the schedule at score, or into the dead set once
-- attempt >= max. If a newer run of the id is already scheduled, that one
-- stands for the same work and this run is dropped.
-- Returns 1 when requeued, 2 when dead, 3 when superseded.
local function settle_back(S, P, D, DI, id, attempt, rest, score, max, now_ms, reason)
  if redis.call('ZSCORE', S, id) then return 3 end
  if attempt >= max then
    bury(D, DI, id, now_ms, attempt, rest, reason)
    return 2
  end
  redis.call('ZADD', S, score, id)
  redis.call('HSET', P, id, attempt .. ':' .. rest)
  return 1
end
