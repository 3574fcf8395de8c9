"""Fragments: tenants' fair share as the scripts keep it (SUBMIT, the read, the hand-back).

``COST`` is the fair share's one cost formula, ``weighted_tokens``' twin (a test compares
them). ``TENANTS`` reads tenants' settings, and keeps the per-tenant indexes of waiting entries
(``Keys.tenant_index``), the active sets and each lane's backlog list; the rule itself, and what
is charged and refunded: ``genq.worker.policy.fair_share``.
"""

from __future__ import annotations

from genq.common import models
from genq.common.fair_share import OUTPUT_WEIGHT
from genq.common.keys import GROUP, QUEUED
from genq.common.lua.compose import Fragment
from genq.common.lua.lanes import LANES, PRIORITIES
from genq.common.lua.prefix_keys import PREFIX_KEYS
from genq.common.wire import BODY_FIELD

COST = Fragment(
    "cost",
    ("weighted",),
    f"""
local function weighted(p, g)  -- weighted_tokens() of fair_share.py: one cost, two languages
  return p + {OUTPUT_WEIGHT} * g
end
""",
)

TENANTS = Fragment(
    "tenants",
    (
        "tenant_ok",
        "settings",
        "item_id",
        "item_key",
        "raw_key",
        "item_of",
        "waiting_of",
        "index",
        "body_info",
        "sweep",
    ),
    f"""
local function tenant_ok(t)
  return type(t) == 'string' and #t >= 1 and #t <= 64
    and string.match(t, '^[A-Za-z0-9._%-]+$') ~= nil
end
local settings_cache = {{}}
local function settings(t)
  -- weight, tokens per minute, max queued, shares prefixes, max priority (Keys.tenants)
  local c = settings_cache[t]
  if c == nil then
    c = {{1, 0, 0, false, ''}}
    local raw = redis.call('HGET', key_tenants(QBASE), t)
    if raw then
      local ok, d = pcall(cjson.decode, raw)
      if ok and type(d) == 'table' then
        local w = tonumber(d['weight']) or 1
        local mp = d['max_priority']
        c = {{w > 0 and w or 1, tonumber(d['tokens_per_minute']) or 0,
          tonumber(d['max_queued']) or 0, d['share_prefixes'] == true,
          type(mp) == 'string' and mp or ''}}
      end
    end
    settings_cache[t] = c
  end
  return c
end
-- An index item is an entry id, or 'ID KEY': the id and its prefix key, scoped to its tenant
-- (prefixes.py), which the read's affinity looks at ('ID KEY MS' once a read passed it over
-- for another worker holding KEY, at MS).
local function item_id(item) return (string.match(item, '^%S+')) end
local function item_key(item) return string.match(item, '^%S+ (%x+)') end
local function raw_key(body, doc)  -- a body's prefix key: its first field (after its model)
  local raw = string.match(body, '^{{"prefix_key":"(%x+)"')
    or string.match(body, '^{{"model":"[^"]*","prefix_key":"(%x+)"')
  if raw or type(doc) ~= 'table' then return raw end
  local given, cache = doc['prefix_key'], doc['prompt_cache_key']
  if type(given) == 'string' and string.match(given, '^%x+$') then return given end
  if type(cache) == 'string' and #cache > 0 then return cache_key_of(cache) end
  return nil
end
local adapter_lanes = {{}}
local function item_of(id, t, raw)
  -- An entry with no prefix key in a LoRA adapter's lane carries its adapter's key: the read
  -- places it where the adapter is loaded, by the prefixes' rule (prefixes.py: adapter_key).
  if raw then return id .. ' ' .. scoped(t, raw, settings(t)[4], LANE) end
  if LANE == '' then return id end
  if adapter_lanes[LANE] == nil then
    adapter_lanes[LANE] = redis.call('SISMEMBER', key_adapters(QBASE), LANE) == 1
  end
  if adapter_lanes[LANE] then return id .. ' ' .. adapter_key(LANE) end
  return id
end
local function waiting_of(t)  -- a tenant's requests waiting for a worker, in every lane
  local n = 0
  for _, base in ipairs(lanes()) do
    for _, p in ipairs(PRI) do n = n + redis.call('LLEN', key_idx(base, p, t)) end
  end
  return n
end
local function lift(t)
  -- A tenant back from idle gets no credit for its idle time: its count of weighted tokens
  -- served is lifted to the lowest of the active tenants (per unit of weight), as in VTC.
  local seen, lowest = {{}}, nil
  for _, p in ipairs(PRI) do
    for _, other in ipairs(redis.call('SMEMBERS', key_active(BASE, p))) do
      if other ~= t and not seen[other] then
        seen[other] = true
        local v = tonumber(redis.call('ZSCORE', key_vtc(QBASE), other) or '0') / settings(other)[1]
        if lowest == nil or v < lowest then lowest = v end
      end
    end
  end
  if lowest ~= nil then
    local floor = lowest * settings(t)[1]
    if tonumber(redis.call('ZSCORE', key_vtc(QBASE), t) or '0') < floor then
      redis.call('ZADD', key_vtc(QBASE), floor, t)
    end
  end
end
local function index(p, t, ids, front)
  -- These waiting entries' items (``item_of``) of tenant t, priority p, after the others
  -- (``front``: before them, in their order: entries handed back keep their place).
  local active = false
  for _, q in ipairs(PRI) do
    if redis.call('SISMEMBER', key_active(BASE, q), t) == 1 then active = true end
  end
  -- Back from idle: nothing of its waiting here, nor read and not started (reserved); not a
  -- hand-back (its requests only changed hands).
  local held = tonumber(redis.call('ZSCORE', key_reserved(QBASE), t) or '0')
  if not (active or front) and held <= 0 then lift(t) end
  if front then
    local reversed = {{}}
    for k = #ids, 1, -1 do table.insert(reversed, ids[k]) end
    ids = reversed
  end
  for j = 1, #ids, 1000 do  -- unpack's limit
    local slice = {{unpack(ids, j, math.min(j + 999, #ids))}}
    redis.call(front and 'LPUSH' or 'RPUSH', key_idx(BASE, p, t), unpack(slice))
    local ones = {{}}
    for k = 1, #slice do ones[k] = 1 end
    redis.call('RPUSH', key_waiting(BASE), unpack(ones))
  end
  redis.call('SADD', key_active(BASE, p), t)
end
local function body_info(fields)
  -- An entry's tenant ('default': none) and raw prefix key (or nil), from its body.
  for j = 1, #fields, 2 do
    if fields[j] == '{BODY_FIELD}' then
      local ok, d = pcall(cjson.decode, fields[j + 1])
      if ok and type(d) == 'table' then
        return tenant_ok(d['tenant']) and d['tenant'] or '{models.DEFAULT_TENANT}',
          raw_key(fields[j + 1], d)
      end
    end
  end
  return '{models.DEFAULT_TENANT}', nil
end
local function sweep(stream, p, known)
  -- Deliver the stream's undelivered entries to {QUEUED} and index them by tenant: the ones
  -- this call added (``known``: entry id -> {{tenant, raw prefix key}}, for this stream only)
  -- and any a plain XADD added.
  local by_tenant = {{}}
  for _ = 1, 10 do  -- at most 5,000 a call: a long backlog of plain XADDs takes a few calls
    local got = redis.call('XREADGROUP', 'GROUP', '{GROUP}', '{QUEUED}', 'COUNT', 500,
      'STREAMS', stream, '>')
    local entries = got and got[1] and got[1][2] or {{}}
    for _, e in ipairs(entries) do
      local t, raw
      if known[e[1]] then t, raw = known[e[1]][1], known[e[1]][2] else t, raw = body_info(e[2]) end
      by_tenant[t] = by_tenant[t] or {{}}
      table.insert(by_tenant[t], item_of(e[1], t, raw))
    end
    if #entries < 500 then break end
  end
  for t, items in pairs(by_tenant) do index(p, t, items, false) end
end
""",
    (COST, PRIORITIES, LANES, PREFIX_KEYS),
)
