"""The read, ``PULL``: a worker's next requests, fairly among tenants, placed by prefix, within
its room (see the comment at its top). The rule and what it charges:
``genq.worker.policy.fair_share``; the affinity's: ``genq.common.prefixes``."""

from __future__ import annotations

from genq.common import models
from genq.common.fair_share import DOORBELL_BY, DOORBELL_MAX
from genq.common.keys import QUEUED
from genq.common.lua.affinity import AFFINITY
from genq.common.lua.claims import CLAIM
from genq.common.lua.compose import script
from genq.common.lua.numbers import NUMBER
from genq.common.lua.tenants import TENANTS
from genq.common.wire import BODY_FIELD

PULL = script(
    "read",
    f"""
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
-- for this consumer (``claim``). Each is charged at once, by an upper bound from its
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
ME, NOW_MS = me, now_ms
local NS = #KEYS - 1  -- the work streams: 3 per lane
local A = 5 + NS  -- ARGV[A]: the cap in all; the rooms per stream (ARGV[5 .. 4 + NS]) before it
AFF_WAIT_MS = tonumber(ARGV[A + 2] or '0') or 0
AFF_FACTOR = (tonumber(ARGV[A + 3] or '150') or 150) / 100
local function head(p, t)  -- fifo: the tenant's oldest waiting entry's id, as {{ms, seq}}
  local item = redis.call('LINDEX', key_idx(BASE, p, t), 0)
  if not item then return {{0, 0}} end
  local ms, seq = string.match(item, '^(%d+)-(%d+)')
  return {{tonumber(ms), tonumber(seq)}}
end
local function charge(body)  -- policy.fair_share.charge's twin (a test compares the two)
  local m = number_of(body, '"max_new_tokens":', '"max_new_tokens":%s*(%d+)')
    or {models.DEFAULT_MAX_NEW_TOKENS}
  local n = number_of(body, '"n":', '"n":%s*(%d+)')  -- n choices: n x as many
  if n then m = m * math.min(n, {models.MAX_CHOICES_PER_REQUEST}) end
  return #body, m
end
local function trim_window(t)  -- drop the seconds of t's last minute that are past
  local key = key_window(QBASE, t)
  local flat = redis.call('HKEYS', key)
  for j = 1, #flat do
    if tonumber(flat[j]) <= now_s - 60 then redis.call('HDEL', key, flat[j]) end
  end
end
local buckets = {{}}
local function bucket(t, per_minute)  -- the tokens t may still take now
  if buckets[t] == nil then
    local cap = math.min(per_minute, burst)
    local v = redis.call('HMGET', key_bucket(QBASE, t), 'level', 'at_ms')
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
  return redis.call('LLEN', key_idx(BASE, p, t))
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
  local active = key_active(BASE, p)
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
    local idx = key_idx(BASE, p, best)
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
    local active = key_active(BASE, p)
    local score = {{}}
    for _, t in ipairs(redis.call('SMEMBERS', active)) do
      score[t] = tonumber(redis.call('ZSCORE', key_vtc(QBASE), t) or '0')
        + tonumber(redis.call('ZSCORE', key_reserved(QBASE), t) or '0')
    end
    local got, given = {{}}, {{}}
    local only = next(score)
    if room > 0 and only ~= nil and next(score, only) == nil and settings(only)[2] <= 0 then
      -- One tenant, no limit (the common case): its next ids, claimed in one call.
      local idx = key_idx(BASE, p, only)
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
  redis.call('ZINCRBY', key_reserved(QBASE), c[1], t)
  trim_window(t)
  redis.call('HINCRBY', key_window(QBASE, t), now_s, c[2])
  redis.call('EXPIRE', key_window(QBASE, t), 120)
end
for t, level in pairs(buckets) do
  redis.call('HSET', key_bucket(QBASE, t), 'level', tostring(level), 'at_ms', now_ms)
  if held_back[t] then redis.call('HSET', key_bucket(QBASE, t), 'held_back_ms', now_ms) end
  redis.call('EXPIRE', key_bucket(QBASE, t), 120)
end
for base, n in pairs(popped) do redis.call('LPOP', key_waiting(base), n) end
for base in pairs(PASSED) do  -- wake an idle worker of the lane: the holder, if it is idle
  redis.call('XADD', key_doorbell(base), 'MAXLEN', '~', {DOORBELL_MAX}, '*', 'n', 1,
    '{DOORBELL_BY}', me)
end
return out
""",
    TENANTS,
    AFFINITY,
    CLAIM,
    NUMBER,
)
"""A worker's read (see the comment at its top)."""
