"""The submit script, ``SUBMIT``: requests enqueued all or nothing, one per id.

It creates a lane's consumer groups at its first submission; refuses the whole call if the
queue is full, a tenant is at its ``max_queued`` or above its ``max_priority``; and for each
request whose id has no live state yet, sets its ``queued`` state and adds its entry, which
owns the id (the queued state names it). An id that already has a state is not enqueued again.
"""

from __future__ import annotations

from genq.common.fair_share import DOORBELL_MAX
from genq.common.keys import GROUP, QUEUED
from genq.common.lua.compose import script
from genq.common.lua.lanes import LANES
from genq.common.lua.tenants import TENANTS
from genq.common.models import DEFAULT_TENANT
from genq.common.wire import BODY_FIELD, ID_FIELD

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

SUBMIT = script(
    "submit",
    f"""
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
-- {QUEUED} at once and its id appended to its tenant's index (``sweep``).
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
  return key_stream(lane_base(model_of[i]), priority)
end
-- The consumer groups exist from a lane's first submission, so a queue no worker has served
-- yet already shows its lag (XINFO GROUPS): an autoscaler at zero workers sees the work.
local seen_lane = {{}}
for i = 1, n do
  local m = model_of[i]
  if seen_lane[m] == nil then
    seen_lane[m] = true
    local config = m == '' and KEYS[1] or key_lane_config(lane_base(m))
    if not redis.call('HGET', config, '{GROUPS_FIELD}') then
      for _, p in ipairs(PRI) do
        redis.pcall('XGROUP', 'CREATE', stream_of(i, p), '{GROUP}', '0', 'MKSTREAM')
      end
      redis.call('HSET', config, '{GROUPS_FIELD}', '1')
      if m ~= '' then redis.call('SADD', key_models(QBASE), m) end
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
    for _, p in ipairs(PRI) do depth = depth + redis.call('XLEN', key_stream(base, p)) end
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
  if not bells[BASE] or RANK[p] > RANK[bells[BASE]] then bells[BASE] = p end
end
-- Wake an idle worker of each lane (it blocks on the doorbell): only where workers made it.
-- The ring says the highest priority it brings (``p``): a static batch below it stops.
for base, p in pairs(bells) do
  if redis.call('EXISTS', key_doorbell(base)) == 1 then
    redis.call('XADD', key_doorbell(base), 'MAXLEN', '~', {DOORBELL_MAX}, '*', 'n', n, 'p', p)
  end
end
return out
""",
    LANES,
    TENANTS,
)
"""Requests enqueued (see the comment at its top)."""
