"""The Lua scripts that make genq's state changes atomic. Shared by the client and the worker.

Each runs inside Redis as one step, so there is no window between a check and a write:

- ``SUBMIT``: create the queue's consumer groups if this is its first submission; refuse the
  whole call if the queue is full; for each request whose id has no live state yet, set its
  ``queued`` state and add its entry, which owns the id (the queued state names it); an
  id that already has a state is not enqueued again (one request, not two).
- ``APPLY``: write requests' states unless they are already final; a final state also appends
  the final event, and acknowledges and deletes the request's work entry in the same step. A
  final result is therefore written once: a late duplicate (a worker presumed dead finishing
  after another worker did) changes nothing, nor does a ``running`` mark arriving after a
  cancel; and no entry is acknowledged without its result written. ``running`` also counts
  the request's attempts (starts): one started ``max_attempts`` times already, every time by a
  worker that died before finishing it, is poison and is not started again. An entry that
  does not own its id (a second plain XADD with an id already in use) changes nothing: it is
  acknowledged as a duplicate.

Callers send them by their hash (``script_calls``: EVALSHA; the source only after NOSCRIPT).

Keys are passed as KEYS (never built in Lua), so every key still comes from ``keys.py``.
The same Lua is also loaded as a Redis Functions library (``functions.py``) for clients in
other languages.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import IntEnum
from typing import Any

from genq.common import script_calls
from genq.common.connection import is_cluster
from genq.common.fair_share import DOORBELL_MAX, PRIORITY_LUA, TENANTS_LUA
from genq.common.keys import GROUP, QUEUED, Keys
from genq.common.models import DEFAULT_TENANT
from genq.common.states import IS_FINAL_LUA
from genq.common.webhooks import HOOK_LUA, batch_owner_key
from genq.common.wire import BODY_FIELD, EVENT_DATA_FIELD, EVENT_TYPE_FIELD, FINAL_EVENT, ID_FIELD

QUEUE_FULL_PREFIX = "GENQ_QUEUE_FULL"
"""Start of the error SUBMIT returns when the queue is full (the client raises QueueFull)."""
INVALID_PREFIX = "GENQ_INVALID"
"""Start of the error SUBMIT returns for a call it cannot take (a bad id, priority or body)."""
TENANT_FULL_PREFIX = "GENQ_TENANT_FULL"
"""Start of the error SUBMIT returns when a tenant has ``max_queued`` requests waiting."""
PRIORITY_DENIED_PREFIX = "GENQ_PRIORITY_DENIED"
"""Start of the error SUBMIT returns for a request above its tenant's ``max_priority``."""
MAX_QUEUE_DEPTH_FIELD = "max_queue_depth"
"""The field of the queue's config hash holding its maximum depth (0 or absent: no limit)."""
GROUPS_FIELD = "groups"
"""The field of the queue's config hash set once the submit script made the consumer groups."""


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


SUBMIT = (
    TENANTS_LUA
    + f"""
-- KEYS: config, the unnamed lane's streams high, normal, low, then per request its state key
--       (on a Redis Cluster: the queue's submitted marker for the id)
-- ARGV: ttl_s, then per request: id, priority (high, normal or low), body JSON, queued state
--       JSON ('' to build it here from the body)
-- Returns per request the new entry's id, or 0 if the id already has a state (not enqueued
-- again). Errors, for the whole call (nothing enqueued): {QUEUE_FULL_PREFIX} DEPTH LIMIT, or
-- {INVALID_PREFIX} why, or {TENANT_FULL_PREFIX} TENANT WAITING LIMIT (that tenant's max_queued),
-- or {PRIORITY_DENIED_PREFIX} TENANT PRIORITY HIGHEST (above that tenant's max_priority).
-- The queued state records the entry that owns the id ("entry": "PRIORITY/ENTRY_ID", right
-- after the status): another entry with the id is a duplicate. Each new entry is delivered to
-- {QUEUED} at once and its id appended to its tenant's index (TENANTS_LUA: ``sweep``).
-- A request that names a model (its body's first field, or any field of a body this script
-- decodes) goes to that model's lane (keys.py: ``Keys.lane``), whose groups it makes at the
-- lane's first request; the queue's depth limit counts every lane.
local ttl = tonumber(ARGV[1])
local n = (#ARGV - 1) / 4
if n < 1 or n % 1 ~= 0 or #KEYS ~= 4 + n or not ttl or ttl < 1 then
  return redis.error_reply('{INVALID_PREFIX} expected KEYS config, high, normal, low, then '
    .. 'the state key of each request; ARGV ttl_s, then id, priority, body, queued state '
    .. 'per request')
end
local STREAM = {{high = 2, normal = 3, low = 4}}
local queued, tenant_of, raw_of, model_of = {{}}, {{}}, {{}}, {{}}
for i = 1, n do  -- everything is checked before anything is written: all or nothing
  local a = 2 + (i - 1) * 4
  local id, priority, body = ARGV[a], ARGV[a + 1], ARGV[a + 2]
  local doc = nil
  if not STREAM[priority] then
    return redis.error_reply('{INVALID_PREFIX} request ' .. i .. ': priority must be high, '
      .. 'normal or low')
  end
  queued[i] = ARGV[a + 3]
  if queued[i] == '' then  -- a call from another language: check what the Python client checks
    if #id > 128 or not string.match(id, '^[A-Za-z0-9_.:%-]+$') then
      return redis.error_reply('{INVALID_PREFIX} request ' .. i .. ': the id must be 1-128 '
        .. 'letters, digits, _ . : or -')
    end
    local ok
    ok, doc = pcall(cjson.decode, body)
    if not ok or type(doc) ~= 'table' or string.sub(body, 1, 1) ~= '{{' then
      return redis.error_reply('{INVALID_PREFIX} request ' .. i .. ': the body must be a JSON '
        .. 'object')
    end
    local tenant = doc['tenant'] == nil and '{DEFAULT_TENANT}' or doc['tenant']
    if type(tenant) ~= 'string' or #tenant > 64 or not string.match(tenant, '^[A-Za-z0-9._%-]+$')
    then
      return redis.error_reply('{INVALID_PREFIX} request ' .. i .. ': the tenant must be 1-64 '
        .. 'letters, digits, . _ or -')
    end
    if doc['model'] ~= nil and not model_ok(doc['model']) then
      return redis.error_reply('{INVALID_PREFIX} request ' .. i .. ': the model must be 1-128 '
        .. 'letters, digits, . _ - / : @ or +')
    end
    model_of[i] = doc['model']
    local meta = type(doc['metadata']) == 'table' and cjson.encode(doc['metadata']) or '{{}}'
    queued[i] = '{{"id":"' .. id .. '","status":"queued","priority":"' .. priority
      .. '","tenant":"' .. tenant .. '","metadata":' .. meta .. '}}'
  end
  -- The client's queued state names the tenant before anything the request wrote (metadata):
  -- found as plain text first (a pattern's search from each place took 5 µs a request).
  local at = string.find(queued[i], '"tenant":"', 1, true)
  tenant_of[i] = at and string.match(queued[i], '^([^"]*)"', at + 10) or '{DEFAULT_TENANT}'
  raw_of[i] = raw_key(body, doc)
  model_of[i] = model_of[i] or string.match(body, '^{{"model":"([^"]*)"') or ''
  if not tenant_ok(tenant_of[i]) then
    return redis.error_reply('{INVALID_PREFIX} request ' .. i .. ': the tenant must be 1-64 '
      .. 'letters, digits, . _ or -')
  end
end
-- A request naming the queue's default model waits where the nameless ones do: its workers
-- read that lane (and, for what came before the default was set, their own).
local default_model = nil
for i = 1, n do
  if model_of[i] ~= '' then
    default_model = default_model or redis.call('HGET', KEYS[1], 'default_model') or ''
    if model_of[i] == default_model then model_of[i] = '' end
  end
end
local function stream_of(i, priority)
  if model_of[i] == '' then return KEYS[STREAM[priority]] end
  return lane_base(model_of[i]) .. ':' .. priority
end
-- The consumer groups exist from a lane's first submission, so a queue no worker has served
-- yet already shows its lag (XINFO GROUPS): an autoscaler at zero workers sees the work.
local seen_lane = {{}}
for i = 1, n do
  local m = model_of[i]
  if seen_lane[m] == nil then
    seen_lane[m] = true
    local config = m == '' and KEYS[1] or lane_base(m) .. ':config'
    if not redis.call('HGET', config, '{GROUPS_FIELD}') then
      for _, p in ipairs(PRI) do
        redis.pcall('XGROUP', 'CREATE', stream_of(i, p), '{GROUP}', '0', 'MKSTREAM')
      end
      redis.call('HSET', config, '{GROUPS_FIELD}', '1')
      if m ~= '' then redis.call('SADD', QBASE .. ':models', m) end
    end
  end
end
local max_depth = tonumber(redis.call('HGET', KEYS[1], '{MAX_QUEUE_DEPTH_FIELD}') or '0') or 0
if max_depth > 0 then  -- the whole queue's: every lane's streams
  local depth, fresh = 0, 0
  for i = 1, n do  -- what this call adds: requests whose id has no state yet
    if redis.call('EXISTS', KEYS[4 + i]) == 0 then fresh = fresh + 1 end
  end
  for _, base in ipairs(lanes()) do
    for _, p in ipairs(PRI) do depth = depth + redis.call('XLEN', base .. ':' .. p) end
  end
  if fresh > 0 and depth + fresh > max_depth then
    return redis.error_reply('{QUEUE_FULL_PREFIX} ' .. depth .. ' ' .. max_depth)
  end
end
local RANK = {{high = 3, normal = 2, low = 1}}
for i = 1, n do  -- a tenant's highest priority (genq tenants set --max-priority)
  local t, priority = tenant_of[i], ARGV[2 + (i - 1) * 4 + 1]
  local highest = settings(t)[5]
  if RANK[highest] and RANK[priority] > RANK[highest] then
    return redis.error_reply('{PRIORITY_DENIED_PREFIX} ' .. t .. ' ' .. priority .. ' ' .. highest)
  end
end
local fresh_of = {{}}  -- per tenant with a max_queued: its requests this call adds
for i = 1, n do
  local t = tenant_of[i]
  if settings(t)[3] > 0 and redis.call('EXISTS', KEYS[4 + i]) == 0 then
    fresh_of[t] = (fresh_of[t] or 0) + 1
  end
end
for t, fresh in pairs(fresh_of) do
  local waiting, limit = waiting_of(t), settings(t)[3]
  if waiting + fresh > limit then
    return redis.error_reply('{TENANT_FULL_PREFIX} ' .. t .. ' ' .. waiting .. ' ' .. limit)
  end
end
local out, known, touched = {{}}, {{}}, {{}}
for i = 1, n do
  local a = 2 + (i - 1) * 4
  local id, priority = ARGV[a], ARGV[a + 1]
  local stream = stream_of(i, priority)
  -- The entry first (its id goes into the state), then the state if the id has none; else the
  -- entry goes again. One script: nobody sees the entry in between.
  local entry = redis.call('XADD', stream, '*', '{ID_FIELD}', id, '{BODY_FIELD}', ARGV[a + 2])
  local head = '{{"id":"' .. id .. '","status":"queued"'
  local q = queued[i]
  if string.sub(q, 1, #head) == head then
    q = head .. ',"entry":"' .. priority .. '/' .. entry .. '"' .. string.sub(q, #head + 1)
  end
  if redis.call('SET', KEYS[4 + i], q, 'NX', 'EX', ttl) then
    out[i] = entry
    -- Keyed by stream, then id: the three streams hand out ids independently, so two of
    -- them can give the same id in one millisecond (a request indexed under another's tenant).
    known[stream] = known[stream] or {{}}
    known[stream][entry] = {{tenant_of[i], raw_of[i]}}
    touched[stream] = priority
  else
    redis.call('XDEL', stream, entry)
    out[i] = 0
  end
end
local bells = {{}}
for stream, p in pairs(touched) do
  use_lane(stream)
  sweep(stream, p, known[stream] or {{}})
  bells[BASE] = true
end
-- Wake an idle worker of each lane (it blocks on the doorbell): only where workers made it.
for base in pairs(bells) do
  if redis.call('EXISTS', base .. ':doorbell') == 1 then
    redis.call('XADD', base .. ':doorbell', 'MAXLEN', '~', {DOORBELL_MAX}, '*', 'n', n)
  end
end
return out
"""
)


APPLY = (
    IS_FINAL_LUA
    + f"""
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
local PRIORITY = {PRIORITY_LUA}
{HOOK_LUA}
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
-- No record of any request here (most calls): no hook at all (HOOK_LUA: any_record).
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
  local entry = check and s > 0 and PRIORITY[(s - 1) % 3 + 1] .. '/' .. eid or ''
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
"""
)


ApplyItem = tuple[str, str | None, str, str]
"""(request id, work stream or None, entry id, state JSON) of one request in an APPLY call."""


def apply_args(
    keys: Keys,
    ttl_s: int,
    mode: str,
    items: Sequence[ApplyItem],
    max_attempts: int = 0,
    token: str = "",
    *,
    acknowledge: bool = True,
    unstarted: Sequence[bool] = (),
    hooks: bool = True,
    streams: Sequence[str] = (),
) -> tuple[list[str], list[str | int]]:
    """KEYS and ARGV of one APPLY call. The work streams are among its keys only if an item
    has an entry to acknowledge (so a cancel touches only the request's own slot), and the
    script is to acknowledge them (``acknowledge``; on a cluster the caller does).
    ``unstarted`` (per item, 'final' mode): the caller never started this entry (expired,
    malformed), so the script checks that it owns its id; a started one was checked at its
    start. ``hooks``: a response's final state adds its webhook event to the queue's outbox
    (``Keys.webhook_events``); not on a Redis Cluster, where the outbox (the queue's slot) and
    the request (its own) cannot meet in one script. ``streams``: the work streams of every lane
    the items' entries are in (``keys.Lanes``); default: ``keys``' lane's."""
    hooks = hooks and mode != "running"
    streams = list(streams) or keys.streams()
    ack = acknowledge and any(stream for _, stream, _, _ in items)
    script_keys: list[str] = list(streams) if ack else []
    args: list[str | int] = [GROUP, ttl_s, mode, max_attempts, len(script_keys), token, int(hooks)]
    flags = list(unstarted) or [False] * len(items)
    for (request_id, stream, entry_id, state), check in zip(items, flags, strict=True):
        result, events, attempts, response = keys.request_keys(request_id)
        if hooks and '"batch":"' in state:  # cheap: most requests are no batch line
            response = batch_owner_key(keys, request_id, state) or response
        script_keys += [result, events, attempts, response]
        number = streams.index(stream) + 1 if stream else 0
        args += [-number if check else number, entry_id, state]
    if hooks:
        script_keys.append(keys.webhook_events)
    return script_keys, args


def apply(
    r: Any,
    keys: Keys,
    ttl_s: int,
    mode: str,
    items: Sequence[ApplyItem],
    max_attempts: int = 0,
    pipe: Any = None,
    token: str = "",
    unstarted: Sequence[bool] = (),
    streams: Sequence[str] = (),
) -> list[int]:
    """Run APPLY over ``items`` and return its answer per item; ``pipe``: a pipeline of ``r``
    with the caller's own commands queued already, run in the same round trip (before APPLY's
    calls). On one Redis this is one atomic script call. On a Redis Cluster a
    request's keys and the queue's streams live in different slots, so each request gets its
    own call (atomic for that request) and the entries are acknowledged in a second round trip
    *after* their states are written: a crash in between leaves an entry that is redelivered,
    which APPLY answers 0 (already final) and acknowledges then."""
    pipe = r.pipeline(transaction=False) if pipe is None else pipe
    first, cluster = len(pipe), is_cluster(r)
    if cluster:  # (one call a request: its keys and the streams' are in different slots)
        flags = list(unstarted) or [False] * len(items)
        one: dict[str, Any] = {"acknowledge": False, "hooks": False, "streams": streams}
        calls = [
            apply_args(keys, ttl_s, mode, [item], max_attempts, token, unstarted=[f], **one)
            for item, f in zip(items, flags, strict=True)
        ]
    else:
        calls = [
            apply_args(
                keys, ttl_s, mode, items, max_attempts, token, unstarted=unstarted, streams=streams
            )
        ]
    for script_keys, args in calls:
        script_calls.add(pipe, APPLY, len(script_keys), *script_keys, *args)
    replies = script_calls.execute(pipe)[first:]
    if not cluster:
        return list(replies[0])
    written = [int(x[0]) for x in replies[: len(calls)]]
    _acknowledge(r, items, written, mode)
    return written


def _acknowledge(r: Any, items: Sequence[ApplyItem], written: Sequence[int], mode: str) -> None:
    """Redis Cluster: XACK and XDEL the entries APPLY would have (already final, or just
    written final), a stream's at a time, in one round trip."""
    done: dict[str, list[str]] = {}
    for (_, stream, entry_id, _), w in zip(items, written, strict=True):
        done_here = w in (Applied.ALREADY_FINAL, Applied.DUPLICATE)
        if stream and (done_here or (w == Applied.WRITTEN and mode == "final")):
            done.setdefault(stream, []).append(entry_id)
    if done:
        pipe = r.pipeline(transaction=False)
        for stream, entry_ids in done.items():
            pipe.xack(stream, GROUP, *entry_ids)
            pipe.xdel(stream, *entry_ids)
        pipe.execute()
