"""The write script, ``APPLY``: requests' states, written unless already final.

A final state also appends the final event, and acknowledges and deletes the request's work
entry in the same step, so a final result is written once: a late duplicate (a worker
presumed dead finishing after another worker did) changes nothing, nor does a ``running`` mark
arriving after a cancel; and no entry is acknowledged without its result written. ``running``
also counts the request's attempts (starts): one started ``max_attempts`` times already, every
time by a worker that died before finishing it, is poison and is not started again. An entry
that does not own its id (a second plain XADD with an id already in use) changes nothing: it
is acknowledged as a duplicate. How callers build its KEYS and ARGV:
``genq.common.scripts.apply_args``.
"""

from __future__ import annotations

from enum import IntEnum

from genq.common.lua.compose import script
from genq.common.lua.final_states import FINAL
from genq.common.lua.hook import HOOK
from genq.common.lua.lanes import PRIORITIES
from genq.common.wire import EVENT_DATA_FIELD, EVENT_TYPE_FIELD, FINAL_EVENT


class Applied(IntEnum):
    """APPLY's answer for one request. (Ints on the wire: the script returns them, and callers
    compare them with these members without converting each.)"""

    WRITTEN = 1
    """The state was written (a final one with its event; the entry acknowledged)."""
    ALREADY_FINAL = 0
    """The request was already final: nothing written; its entry was acknowledged."""
    NOT_FOUND = -1
    """``cancel`` found no state (never submitted, or expired)."""
    POISON = -2
    """``running`` found the request started ``max_attempts`` times already: not started."""
    DUPLICATE = -3
    """Another work entry owns the request's id (this one was added later with the same id):
    nothing written; this entry was acknowledged."""


APPLY = script(
    "apply",
    f"""
-- KEYS: S work streams (high, normal, low, lane by lane; S = ARGV[5] is 3 per lane, or 0 when
--       the caller acknowledges entries itself, as on a Redis Cluster), then per request:
--       state key, event key, attempts key, owner record key (its response's, or its
--       batch's when it is a batch line and ARGV[7] is 1, else its response's: it may not
--       exist); then, if ARGV[7] is 1, the webhook outbox stream
-- ARGV: group, ttl_s, mode ('running', 'final' or 'cancel'), max attempts, S, start token
--       (running: unique per start), H (1: the outbox is the last key), then per request: its
--       entry's work stream (1 high, 2 normal, 3 low; 0: no entry; negative: the caller never
--       started this entry, so it must prove it owns the id before it may end it; a lane's
--       streams follow the lane before it: 4 is the second lane's high), entry id,
--       state JSON
-- A final state written for a /v1/responses response adds that response's event to the
-- outbox, once; for a batch's last open request, the batch's: the webhooks' source.
-- Per request, returns an Applied answer: WRITTEN, ALREADY_FINAL (its entry is then
-- acknowledged and deleted: nothing more to do), NOT_FOUND ('cancel' found no state), POISON
-- ('running' found it started max attempts times already: nothing written) or DUPLICATE
-- (another entry owns the id: nothing written; this entry acknowledged and deleted).
local group, ttl, mode, max_attempts = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4])
local ns, token = tonumber(ARGV[5]), ARGV[6]
local outbox = ARGV[7] == '1' and KEYS[#KEYS] or nil
-- The attempts key holds "STARTS ENTRY TOKEN": how many times workers started the request, the
-- work entry that owns its id (set by SUBMIT, or by the first start of an entry added with a
-- plain XADD) and the last start's token. ("STARTS TOKEN", with no entry, before genq 0.2.)
-- An entry is named PRIORITY/ID: entry ids are unique within one stream only.
-- ENTRY is '-' while no entry owns the id (a request started with no entry, in tests).
local function attempts(raw)
  local starts, rest = string.match(raw or '0 - -', '^(%d+) (.*)$')
  rest = rest or ''
  local slot, token = string.match(rest, '^(%S+) (.*)$')
  local owner = slot and string.match(slot, '^%a+/%d+%-%d+$') and slot or nil
  if not owner and slot ~= '-' then token = rest end  -- "STARTS TOKEN"
  return tonumber(starts) or 0, owner, token
end
local out = {{}}
local done = {{}}  -- per work stream, the entries to acknowledge and delete
local n_items = (#KEYS - ns - (outbox and 1 or 0)) / 4
-- No record of any request here (most calls): no hook at all (``any_record``).
if outbox and not any_record(ns + 4, 4, n_items) then outbox = nil end
-- The common paths cost few commands: the new state (and a start's attempts) is written with
-- SET ... GET, which answers the old one, and the old one is put back in the rare cases that
-- must not change it (already final: kept, with its TTL renewed; poison: left as it was).
for i = 1, n_items do
  local k = ns + 4 * (i - 1)
  local res, ev, att, record = KEYS[k + 1], KEYS[k + 2], KEYS[k + 3], KEYS[k + 4]
  local a = 5 + 3 * i
  local s, eid, state = tonumber(ARGV[a]), ARGV[a + 1], ARGV[a + 2]
  -- Whether this entry must prove it owns the id: at every start, and when ending an entry
  -- the caller never started (s < 0: expired, malformed); one it started was checked then.
  local check = mode == 'running' or s < 0
  s = math.abs(s)
  local entry = check and s > 0 and PRI[(s - 1) % 3 + 1] .. '/' .. eid or ''
  check = check and entry ~= '' and mode ~= 'cancel'
  local starts, owner, last = 0, nil, nil
  local slot = entry ~= '' and entry or '-'
  local prior = false  -- 'running': the attempts key's value before this start (false: none)
  if mode == 'running' then
    -- Written blind as a first start's (the common case), its old value read back by the same
    -- command; put right below where there was one, or where nothing starts.
    prior = redis.call('SET', att, '1 ' .. slot .. ' ' .. token, 'EX', ttl, 'GET')
    if prior then starts, owner, last = attempts(prior) end  -- none: 0, nil, nil as above
  elseif check then
    starts, owner, last = attempts(redis.call('GET', att))
  end
  local current
  if mode == 'running' then
    current = redis.call('SET', res, state, 'KEEPTTL', 'GET')
  elseif mode == 'cancel' then
    current = redis.call('GET', res)
  else
    current = redis.call('SET', res, state, 'EX', ttl, 'GET')
  end
  if check and not owner and current then
    owner = string.match(current, '^{{"id":"[^"]*","status":"queued","entry":"([^"]+)"')
  end
  local ack = false
  if check and owner and owner ~= entry then
    -- Another entry owns this id (this one came later, with a plain XADD of the same id): it
    -- must not replace, end or cancel that request. Put back what was there; acknowledged.
    if not current then
      redis.call('DEL', res)
    elseif mode == 'running' then
      redis.call('SET', res, current, 'KEEPTTL')
    else
      redis.call('SET', res, current, 'EX', ttl)
    end
    out[i] = {Applied.DUPLICATE:d}
    ack = true
  elseif mode == 'running' then
    if is_final(current) then
      redis.call('SET', res, current, 'KEEPTTL')
      out[i] = {Applied.ALREADY_FINAL:d}
      ack = true
    elseif last ~= token and starts >= max_attempts then
      if current then redis.call('SET', res, current, 'KEEPTTL') else redis.call('DEL', res) end
      out[i] = {Applied.POISON:d}
    else
      -- A start is counted once even if this call is sent again (a client library that
      -- resends a pipeline after a lost reply, or a cluster failover): its token is kept.
      if last ~= token then starts = starts + 1 end
      if starts ~= 1 then  -- (the blind write above said 1)
        redis.call('SET', att, starts .. ' ' .. slot .. ' ' .. token, 'EX', ttl)
      end
      if not current then redis.call('EXPIRE', res, ttl) end
      out[i] = {Applied.WRITTEN:d}
    end
  else
    if is_final(current) then
      if mode ~= 'cancel' then redis.call('SET', res, current, 'EX', ttl) end
      out[i] = {Applied.ALREADY_FINAL:d}
    elseif mode == 'cancel' and not current then
      out[i] = {Applied.NOT_FOUND:d}
    else
      if mode == 'cancel' then redis.call('SET', res, state, 'EX', ttl) end
      redis.call('DEL', att)
      if not (outbox and hook(outbox, record, state)) then  -- a wave batch's line: none
        redis.call('XADD', ev, '*',
          '{EVENT_TYPE_FIELD}', '{FINAL_EVENT}', '{EVENT_DATA_FIELD}', state)
        redis.call('EXPIRE', ev, ttl)
      end
      out[i] = {Applied.WRITTEN:d}
    end
    ack = out[i] >= {Applied.ALREADY_FINAL:d}
  end
  if mode == 'running' and out[i] ~= {Applied.WRITTEN:d} then  -- nothing started: as it was
    if prior then redis.call('SET', att, prior, 'KEEPTTL') else redis.call('DEL', att) end
  end
  if ack and s > 0 and ns > 0 then
    done[s] = done[s] or {{}}
    table.insert(done[s], eid)
  end
end
flush_tallies()
for s, eids in pairs(done) do  -- one XACK and one XDEL per stream (in slices: unpack's limit)
  for j = 1, #eids, 1000 do
    local slice = {{unpack(eids, j, math.min(j + 999, #eids))}}
    redis.call('XACK', KEYS[s], group, unpack(slice))
    redis.call('XDEL', KEYS[s], unpack(slice))
  end
end
return out
""",
    PRIORITIES,
    FINAL,
    HOOK,
)
"""States written (see the comment at its top)."""
