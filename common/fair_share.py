"""The Lua of tenants' fair share, beside ``scripts.py``: the per-tenant indexes the submit
script fills (``TENANTS_LUA``, which SUBMIT includes), a worker's read (``PULL``) and its
hand-back (``GIVE_BACK``). The rule itself, and what is charged and refunded:
``genq.worker.policy.fair_share``.

Keys: ``Keys.tenant_index``, ``active``, ``vtc``, ``reserved``, ``window``, ``bucket``,
``waiting``, ``tenants``, ``doorbell``. Their names hold a tenant, so the scripts build them
from the queue's base ``genq:{Q}`` (the config key, the scripts' first KEY, less ``:config``)
exactly as ``keys.py`` does; a test compares the two. All share the queue's hash tag, so a
script's keys stay in one Redis Cluster slot.
"""

from __future__ import annotations

from genq.common import models
from genq.common.claims import CLAIM_LUA
from genq.common.keys import GROUP, QUEUED
from genq.common.prefixes import AFFINITY_LUA, SCOPED_LUA
from genq.common.wire import BODY_FIELD, NUMBER_LUA

OUTPUT_WEIGHT = 2
"""A generated token weighs this many prompt tokens in a tenant's service (VTC's weights: a
decode step costs more than a prompt token's share of the prefill)."""

READ_RULES = ("fair", "fifo")
"""How ``PULL`` picks among a priority's tenants: ``fair`` (the least weighted tokens served
per unit of weight) or ``fifo`` (the oldest waiting entry, whoever sent it). An order says which
it wants (``WaitingOrder.read_rule``); PULL refuses any other value."""


def weighted_tokens(prompt_tokens: int, generated_tokens: int) -> int:
    """The fair share's cost of a request: what it adds to its tenant's service. The one
    formula; ``WEIGHTED_LUA`` is its twin in the scripts (a test compares them)."""
    return prompt_tokens + OUTPUT_WEIGHT * generated_tokens


WEIGHTED_LUA = f"""
local function weighted(p, g)  -- weighted_tokens() of fair_share.py: one cost, two languages
  return p + {OUTPUT_WEIGHT} * g
end
"""

DOORBELL_MAX = 64
"""The doorbell stream is trimmed (approximately) to this many entries: rings nobody heard."""
DOORBELL_BY = "by"
"""A pass-over ring's field naming its reader (PULL rings; ``worker/runtime/doorbell.py``)."""

PRIORITY_LUA = "{" + ", ".join(f"'{p}'" for p in models.PRIORITIES) + "}"
"""The priorities in stream order, as a Lua table (APPLY's stream numbers index it)."""

TENANTS_LUA = (
    WEIGHTED_LUA
    + SCOPED_LUA
    + f"""
-- Tenants (SUBMIT and PULL). BASE is the queue's 'genq:{{Q}}' (its config key less ':config');
-- the per-tenant keys are built from it exactly as keys.py builds them (a test compares).
local PRI = {PRIORITY_LUA}
local BASE = string.sub(KEYS[1], 1, #KEYS[1] - #':config')
-- Lanes (keys.py: Keys.lane): QBASE is the queue's base, for what its lanes share (tenants and
-- their accounts); BASE and LANE are the lane being worked on (use_lane), for its work keys.
local QBASE, LANE = BASE, ''
local function lane_base(model)
  return model == '' and QBASE or QBASE .. ':m<' .. model .. '>'
end
local function use_lane(stream)  -- the lane of a work stream ('BASE:PRIORITY') becomes current
  BASE = string.match(stream, '^(.*):%a+$')
  LANE = string.match(BASE, ':m<(.+)>$') or ''
end
local function model_ok(m)  -- models.py: MODEL_NAME_CHARS
  return type(m) == 'string' and #m >= 1 and #m <= 128
    and string.match(m, '^[A-Za-z0-9._/:@+%-]+$') ~= nil
end
local function lanes()  -- every lane's base: the unnamed one, then the named ones
  local out = {{QBASE}}
  for _, m in ipairs(redis.call('SMEMBERS', QBASE .. ':models')) do
    table.insert(out, lane_base(m))
  end
  return out
end
local function tenant_ok(t)
  return type(t) == 'string' and #t >= 1 and #t <= 64
    and string.match(t, '^[A-Za-z0-9._%-]+$') ~= nil
end
local settings_cache = {{}}
local function settings(t)
  -- weight, tokens per minute, max queued, shares prefixes, max priority (genq:{{Q}}:tenants)
  local c = settings_cache[t]
  if c == nil then
    c = {{1, 0, 0, false, ''}}
    local raw = redis.call('HGET', QBASE .. ':tenants', t)
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
    adapter_lanes[LANE] = redis.call('SISMEMBER', QBASE .. ':adapters', LANE) == 1
  end
  if adapter_lanes[LANE] then return id .. ' ' .. adapter_key(LANE) end
  return id
end
local function waiting_of(t)  -- a tenant's requests waiting for a worker, in every lane
  local n = 0
  for _, base in ipairs(lanes()) do
    for _, p in ipairs(PRI) do n = n + redis.call('LLEN', base .. ':idx:' .. p .. ':' .. t) end
  end
  return n
end
local function lift(t)
  -- A tenant back from idle gets no credit for its idle time: its count of weighted tokens
  -- served is lifted to the lowest of the active tenants (per unit of weight), as in VTC.
  local seen, lowest = {{}}, nil
  for _, p in ipairs(PRI) do
    for _, other in ipairs(redis.call('SMEMBERS', BASE .. ':active:' .. p)) do
      if other ~= t and not seen[other] then
        seen[other] = true
        local v = tonumber(redis.call('ZSCORE', QBASE .. ':vtc', other) or '0') / settings(other)[1]
        if lowest == nil or v < lowest then lowest = v end
      end
    end
  end
  if lowest ~= nil then
    local floor = lowest * settings(t)[1]
    if tonumber(redis.call('ZSCORE', QBASE .. ':vtc', t) or '0') < floor then
      redis.call('ZADD', QBASE .. ':vtc', floor, t)
    end
  end
end
local function index(p, t, ids, front)
  -- These waiting entries' items (``item_of``) of tenant t, priority p, after the others
  -- (``front``: before them, in their order: entries handed back keep their place).
  local active = false
  for _, q in ipairs(PRI) do
    if redis.call('SISMEMBER', BASE .. ':active:' .. q, t) == 1 then active = true end
  end
  -- Back from idle: nothing of its waiting here, nor read and not started (reserved); not a
  -- hand-back (its requests only changed hands).
  local held = tonumber(redis.call('ZSCORE', QBASE .. ':reserved', t) or '0')
  if not (active or front) and held <= 0 then lift(t) end
  if front then
    local reversed = {{}}
    for k = #ids, 1, -1 do table.insert(reversed, ids[k]) end
    ids = reversed
  end
  for j = 1, #ids, 1000 do  -- unpack's limit
    local slice = {{unpack(ids, j, math.min(j + 999, #ids))}}
    redis.call(front and 'LPUSH' or 'RPUSH', BASE .. ':idx:' .. p .. ':' .. t, unpack(slice))
    local ones = {{}}
    for k = 1, #slice do ones[k] = 1 end
    redis.call('RPUSH', BASE .. ':waiting', unpack(ones))
  end
  redis.call('SADD', BASE .. ':active:' .. p, t)
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
"""
)

PULL = (
    TENANTS_LUA
    + f"""
-- KEYS: the queue's config, then each lane's streams (high, normal, low), lane by lane
-- ARGV: this consumer, the read rule ('fair' or 'fifo': READ_RULES), the Unix time now in ms
--       (the worker's view of Redis' clock: it needs no TIME), the reader's batch budget in
--       tokens (a limited tenant's burst), then per stream: how many entries at most; then
--       how many in all (0: no cap; a continuous reader: its free slots, taken from the
--       highest priority first, so that it never holds a low request a high one still
--       waiting would have to pass); then the probe: per priority, up to so many more from
--       tenants the reader holds none of there (0: none; a static reader with a fair order:
--       a tenant that arrived behind another's backlog is read before its next batch, not
--       after it); the affinity's wait in ms (0: none, read in order) and load factor x 100
--       (prefixes.py); and the 'PRIORITY|TENANT' pairs it holds
-- A worker's read: per priority, the waiting entries of the active tenants, fairly: each next entry
-- is the oldest of the tenant with the least weighted tokens per unit of weight, served (vtc: what
-- workers started) and reserved (what they read and have not started yet) (VTC; 'fifo': the oldest
-- waiting entry, whoever sent it) among those under their tokens-per-minute, claimed from {QUEUED}
-- for this consumer (claims.py: ``claim``). Each is charged at once, by an upper bound from its
-- body (PROMPT_EST = the body's bytes: a prompt has no more tokens than bytes; and its
-- max_new_tokens, times its choices ``n``: 'charge' below, ``policy.fair_share.charge`` in Python):
-- weighted PROMPT_EST + 2 x max_new_tokens to the tenant's reserved, PROMPT_EST + max_new_tokens to
-- its last minute and to its token bucket; the worker corrects the estimate once it has tokenized
-- the prompt, moves it from reserved to vtc when it starts the request, and refunds what was not
-- used when the request ends. (Reserved apart from served: a tenant back from idle is lifted to the
-- lowest served, not to what others merely hold, which a hand-back returns.) A tenant with a
-- tokens-per-minute N is read only while its bucket (refilled at N a minute, holding at most min(N,
-- the batch budget)) is above 0: in any 60 s it takes at most N plus one batch's tokens, evenly,
-- not in a burst at each minute's turn. Entries a plain XADD added are swept into the indexes
-- first. Returns XREADGROUP's shape.
local me, fifo = ARGV[1], ARGV[2] == 'fifo'
if ARGV[2] ~= 'fifo' and ARGV[2] ~= 'fair' then
  return redis.error_reply('ERR genq PULL: unknown read rule ' .. tostring(ARGV[2]))
end
local now_ms, burst = tonumber(ARGV[3]), tonumber(ARGV[4])
local now_s = math.floor(now_ms / 1000)
{AFFINITY_LUA}{CLAIM_LUA}
local NS = #KEYS - 1  -- the work streams: 3 per lane
local A = 5 + NS  -- ARGV[A]: the cap in all; the rooms per stream (ARGV[5 .. 4 + NS]) before it
AFF_WAIT_MS = tonumber(ARGV[A + 2] or '0') or 0
AFF_FACTOR = (tonumber(ARGV[A + 3] or '150') or 150) / 100
local function head(p, t)  -- fifo: the tenant's oldest waiting entry's id, as {{ms, seq}}
  local item = redis.call('LINDEX', BASE .. ':idx:' .. p .. ':' .. t, 0)
  if not item then return {{0, 0}} end
  local ms, seq = string.match(item, '^(%d+)-(%d+)')
  return {{tonumber(ms), tonumber(seq)}}
end
{NUMBER_LUA}
local function charge(body)  -- policy.fair_share.charge's twin (a test compares the two)
  local m = number_of(body, '"max_new_tokens":', '"max_new_tokens":%s*(%d+)')
    or {models.DEFAULT_MAX_NEW_TOKENS}
  local n = number_of(body, '"n":', '"n":%s*(%d+)')  -- n choices: n x as many
  if n then m = m * math.min(n, {models.MAX_CHOICES_PER_REQUEST}) end
  return #body, m
end
local function trim_window(t)  -- drop the seconds of t's last minute that are past
  local key = QBASE .. ':window:' .. t
  local flat = redis.call('HKEYS', key)
  for j = 1, #flat do
    if tonumber(flat[j]) <= now_s - 60 then redis.call('HDEL', key, flat[j]) end
  end
end
local buckets = {{}}
local function bucket(t, per_minute)  -- the tokens t may still take now
  if buckets[t] == nil then
    local cap = math.min(per_minute, burst)
    local v = redis.call('HMGET', QBASE .. ':bucket:' .. t, 'level', 'at_ms')
    local level, at = tonumber(v[1]) or cap, tonumber(v[2]) or now_ms
    buckets[t] = math.min(cap, level + math.max(0, now_ms - at) * per_minute / 60000)
  end
  return buckets[t]
end
local function body_of(fields)
  for j = 1, #fields, 2 do
    if fields[j] == '{BODY_FIELD}' then return fields[j + 1] end
  end
  return ''
end
local function affordable(stream, id, t, limit)
  -- Whether t's bucket holds this entry's whole charge (or is full: one request bigger than
  -- the bucket still goes, alone): served tokens never run past the limit plus the bucket.
  local found = redis.call('XRANGE', stream, id, id)
  if #found == 0 then return true end  -- gone: nothing to charge
  local est, max_new = charge(body_of(found[1][2]))
  local level = bucket(t, limit)
  return level >= est + max_new or level >= math.min(limit, burst)
end
local function backlog(p, t)
  return redis.call('LLEN', BASE .. ':idx:' .. p .. ':' .. t)
end
local function better(p, t, per, best, best_v)  -- per: {{service per weight, 0}} or {{ms, seq}}
  if best_v == nil then return true end
  if per[1] ~= best_v[1] then return per[1] < best_v[1] end
  if fifo then return per[2] < best_v[2] end
  -- A tie (a tenant just lifted to the lowest) goes to the one with fewer waiting.
  return backlog(p, t) < backlog(p, best)
end
local out, charged, popped, held_back = {{}}, {{}}, {{}}, {{}}
local total = tonumber(ARGV[A] or '0')
local probe_each = tonumber(ARGV[A + 1] or '0')
local held = {{}}
for j = A + 4, #ARGV do held[ARGV[j]] = true end
local taken = 0
local stalled = {{}}  -- per lane: a higher priority's turn waits for its holders: read nothing
-- lower in that lane
local function take(s, p, score, got, room, given)
  -- Up to room entries in got, tenant by tenant from score (each one's service so far).
  local active = BASE .. ':active:' .. p
  while #got < room do
    local best, best_v = nil, nil
    for t, v in pairs(score) do
      local c = settings(t)
      if c[2] > 0 and bucket(t, c[2]) <= 0 then
        held_back[t] = true
      else
        local per = fifo and head(p, t) or {{v / c[1], 0}}
        if better(p, t, per, best, best_v) then best, best_v = t, per end
      end
    end
    if best == nil then break end  -- none, or every active tenant is over its limit
    local idx = BASE .. ':idx:' .. p .. ':' .. best
    local picked, left = pick_items(idx, 1)
    local item = picked[1]
    local id = item and item_id(item)
    local limit = settings(best)[2]
    if not id and left then
      -- Its turn, and its next entries wait for the workers holding their prefixes: this
      -- reader takes nothing more at this priority or below rather than serve another tenant
      -- (or a lower priority) out of turn; the bound hands them over if their holders lag.
      stalled[BASE] = true
      break
    elseif not id then
      redis.call('SREM', active, best)
      score[best] = nil
    elseif limit > 0 and not affordable(KEYS[s], id, best, limit) then
      unpicked(idx, item)  -- it waits for its bucket to refill
      score[best] = nil
      held_back[best] = true
    else
      popped[BASE] = (popped[BASE] or 0) + 1
      -- Only an entry still pending (a cancelled one is until acknowledged), with its fields.
      local found = claim(KEYS[s], me, {{id}})
      if #found > 0 and found[1] then
        table.insert(got, found[1])
        given[best] = true
        local est, max_new = charge(body_of(found[1][2]))
        score[best] = score[best] + weighted(est, max_new)
        if buckets[best] ~= nil then buckets[best] = buckets[best] - est - max_new end
        local c = charged[best] or {{0, 0}}
        charged[best] = {{c[1] + weighted(est, max_new), c[2] + est + max_new}}
      end
    end
  end
end
-- Priority by priority, each lane's stream of it (KEYS[1 + 3 x lane + rank]).
for s_order = 0, NS - 1 do
  local s = 2 + (s_order % (NS / 3)) * 3 + math.floor(s_order / (NS / 3))
  local room, p = tonumber(ARGV[3 + s]), PRI[(s - 2) % 3 + 1]
  local probe = probe_each
  use_lane(KEYS[s])
  if total > 0 then room = math.min(room, total - taken) end  -- higher priorities first
  if stalled[BASE] then room, probe = 0, 0 end
  if room > 0 or probe > 0 then
    sweep(KEYS[s], p, {{}})
    local active = BASE .. ':active:' .. p
    local score = {{}}
    for _, t in ipairs(redis.call('SMEMBERS', active)) do
      score[t] = tonumber(redis.call('ZSCORE', QBASE .. ':vtc', t) or '0')
        + tonumber(redis.call('ZSCORE', QBASE .. ':reserved', t) or '0')
    end
    local got, given = {{}}, {{}}
    local only = next(score)
    if room > 0 and only ~= nil and next(score, only) == nil and settings(only)[2] <= 0 then
      -- One tenant, no limit (the common case): its next ids, claimed in one call.
      local idx = BASE .. ':idx:' .. p .. ':' .. only
      local items, left = pick_items(idx, room)
      local ids = {{}}
      for j, item in ipairs(items) do ids[j] = item_id(item) end
      if #ids > 0 then
        popped[BASE] = (popped[BASE] or 0) + #ids
        local w, tok = 0, 0
        for _, e in ipairs(claim(KEYS[s], me, ids)) do
          if e then
            table.insert(got, e)
            local est, max_new = charge(body_of(e[2]))
            w, tok = w + weighted(est, max_new), tok + est + max_new
          end
        end
        local c = charged[only] or {{0, 0}}
        charged[only] = {{c[1] + w, c[2] + tok}}
      end
      if #ids < room and not left then redis.call('SREM', active, only) end
      if left and #ids < room then stalled[BASE] = true end
      score = {{}}
    elseif room > 0 then
      take(s, p, score, got, room, given)
    end
    if probe > 0 then
      -- The probe: up to that many more from tenants this reader holds none of in this
      -- priority and got none of just now (they arrived behind another's backlog).
      local others = {{}}
      for t, v in pairs(score) do
        if not (held[p .. '|' .. t] or given[t]) then others[t] = v end
      end
      take(s, p, others, got, #got + probe, given)
    end
    if #got > 0 then table.insert(out, {{KEYS[s], got}}) end
    taken = taken + #got
  end
end
for t, c in pairs(charged) do  -- once per tenant: the service and the last minute
  redis.call('ZINCRBY', QBASE .. ':reserved', c[1], t)
  trim_window(t)
  redis.call('HINCRBY', QBASE .. ':window:' .. t, now_s, c[2])
  redis.call('EXPIRE', QBASE .. ':window:' .. t, 120)
end
for t, level in pairs(buckets) do
  redis.call('HSET', QBASE .. ':bucket:' .. t, 'level', tostring(level), 'at_ms', now_ms)
  if held_back[t] then redis.call('HSET', QBASE .. ':bucket:' .. t, 'held_back_ms', now_ms) end
  redis.call('EXPIRE', QBASE .. ':bucket:' .. t, 120)
end
for base, n in pairs(popped) do redis.call('LPOP', base .. ':waiting', n) end
for base in pairs(PASSED) do  -- wake an idle worker of the lane: the holder, if it is idle
  redis.call('XADD', base .. ':doorbell', 'MAXLEN', '~', {DOORBELL_MAX}, '*', 'n', 1,
    '{DOORBELL_BY}', me)
end
return out
"""
)
"""A worker's read (see the comment at its top). Its per-tenant keys: ``Keys.tenant_index``,
``active``, ``vtc``, ``window``, ``waiting``."""

GIVE_BACK = (
    TENANTS_LUA
    + f"""
-- KEYS: the queue's config, then each lane's streams (high, normal, low), lane by lane
-- ARGV: rings, the Unix second now, then per entry: its stream (KEYS[1 + s]), entry id,
--       tenant, and the weighted and plain tokens it was charged when read
-- Gives entries this worker read and did not start back to the waiting: pending for {QUEUED}
-- again (JUSTID: delivery counts unchanged), at the front of their tenant's index so they keep
-- their place, their charge taken off reserved (the next read charges them again); then rings
-- the doorbell of each lane it gave entries back to ``rings`` times, which wakes as many idle
-- workers.
local rings, now_s = tonumber(ARGV[1]), tonumber(ARGV[2])
local groups, order = {{}}, {{}}
for a = 3, #ARGV, 5 do
  local s, id, t = tonumber(ARGV[a]), ARGV[a + 1], ARGV[a + 2]
  local weighted, tokens = tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4])
  redis.call('XCLAIM', KEYS[1 + s], '{GROUP}', '{QUEUED}', 0, id, 'JUSTID')
  use_lane(KEYS[1 + s])
  local key = s .. ' ' .. t
  if groups[key] == nil then
    groups[key] = {{s, t, {{}}}}
    table.insert(order, key)
  end
  local found, raw = redis.call('XRANGE', KEYS[1 + s], id, id), nil
  if #found > 0 then raw = select(2, body_info(found[1][2])) end
  table.insert(groups[key][3], item_of(id, t, raw))  -- with its prefix key, as SUBMIT made it
  if weighted ~= 0 then redis.call('ZINCRBY', QBASE .. ':reserved', -weighted, t) end
  if tokens ~= 0 then
    redis.call('HINCRBY', QBASE .. ':window:' .. t, now_s, -tokens)
    redis.call('EXPIRE', QBASE .. ':window:' .. t, 120)
    redis.call('HINCRBYFLOAT', QBASE .. ':bucket:' .. t, 'level', tokens)
    redis.call('EXPIRE', QBASE .. ':bucket:' .. t, 120)
  end
end
local bells = {{}}
for _, key in ipairs(order) do
  local g = groups[key]
  use_lane(KEYS[1 + g[1]])
  index(PRI[(g[1] - 1) % 3 + 1], g[2], g[3], true)
  bells[BASE] = true
end
for base in pairs(bells) do
  for _ = 1, rings do
    redis.call('XADD', base .. ':doorbell', 'MAXLEN', '~', {DOORBELL_MAX}, '*', 'n',
      (#ARGV - 2) / 5)
  end
end
return (#ARGV - 2) / 5
"""
)
"""A worker hands back what it read and will not start soon (see the comment at its top)."""
