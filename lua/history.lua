-- history.lua: the helper that writes a history event, written in front of
-- the scripts that write them (the broker's, after prelude.lua, and the
-- run records' begin, complete, settle and takeover).
-- A history is one field of a hash: the schedule's keep a job id's events
-- in the hash of a time bucket (broker_sent.go), a store's keep a run
-- key's events in a bucket beside the key's finished records
-- (idempotency_history.go). Its value is the events, oldest first, each
-- "<Redis TIME ms>\31<kind>\31<a>\31<detail>\30": kind is one letter, a
-- the occurrence's due (the schedule's, in ms) or a run's token (the
-- store's), detail what the event says (the callers keep \30 and \31 out
-- of it). A field keeps its newest events within 1 KB. A nil key (no
-- history kept) writes nothing.
local function hist_event(now_ms, kind, a, detail)
  return string.format('%d', now_ms) .. '\31' .. kind .. '\31' .. a .. '\31' .. detail .. '\30'
end
-- hist_append adds event ev (hist_event's form) to field.
local function hist_append(key, field, ev)
  -- The common case, a field's first event, in one command.
  if redis.call('HSETNX', key, field, ev) == 1 then return end
  local v = redis.call('HGET', key, field) .. ev
  while #v > 1024 do
    local cut = string.find(v, '\30', 1, true)
    if not cut or cut == #v then break end
    v = string.sub(v, cut + 1)
  end
  redis.call('HSET', key, field, v)
end
local function hist_add(key, field, now_ms, kind, a, detail)
  if key then hist_append(key, field, hist_event(now_ms, kind, a, detail)) end
end
