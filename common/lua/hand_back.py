"""The hand-back: a worker gives back entries it read and will not start soon
(``GIVE_BACK``), and takes entries an older genq handed back (``TAKE_BACK``)."""

from __future__ import annotations

from genq.common.fair_share import DOORBELL_MAX
from genq.common.keys import GROUP, QUEUED
from genq.common.lua.compose import script
from genq.common.lua.tenants import TENANTS

GIVE_BACK = script(
    "give back",
    f"""
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
  if weighted ~= 0 then redis.call('ZINCRBY', key_reserved(QBASE), -weighted, t) end
  if tokens ~= 0 then
    redis.call('HINCRBY', key_window(QBASE, t), now_s, -tokens)
    redis.call('EXPIRE', key_window(QBASE, t), 120)
    redis.call('HINCRBYFLOAT', key_bucket(QBASE, t), 'level', tokens)
    redis.call('EXPIRE', key_bucket(QBASE, t), 120)
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
    redis.call('XADD', key_doorbell(base), 'MAXLEN', '~', {DOORBELL_MAX}, '*', 'n',
      (#ARGV - 2) / 5)
  end
end
return (#ARGV - 2) / 5
""",
    TENANTS,
)
"""A worker hands back what it read and will not start soon (see the comment at its top)."""

TAKE_BACK = script(
    "take back",
    """
-- KEYS: the work streams to take from
-- ARGV: group, the consumer that holds handed-back entries, this consumer, then per stream:
--       how many entries at most
-- Claims entries other workers handed back (JUSTID: no delivery counted; their ids, hence
-- their age, unchanged), atomically, so no two workers take the same one. Returns
-- XREADGROUP's shape: {{stream, {{id, {field, value, ...}}, ...}}, ...}.
local group, returned, me = ARGV[1], ARGV[2], ARGV[3]
local out = {}
for i = 1, #KEYS do
  local n = tonumber(ARGV[3 + i])
  local rows = n > 0 and redis.call('XPENDING', KEYS[i], group, '-', '+', n, returned) or {}
  if #rows > 0 then
    local claim = {KEYS[i], group, me, 0}
    for _, row in ipairs(rows) do table.insert(claim, row[1]) end
    table.insert(claim, 'JUSTID')  -- unpack() spreads a table only as the last argument
    local entries = {}
    for _, id in ipairs(redis.call('XCLAIM', unpack(claim))) do
      local found = redis.call('XRANGE', KEYS[i], id, id)
      if #found > 0 then table.insert(entries, found[1]) end
    end
    if #entries > 0 then table.insert(out, {KEYS[i], entries}) end
  end
end
return out
""",
)
"""Entries an older genq handed back (pending for ``RETURNED``), claimed by a reader."""
