"""The snapshot script, ``SNAPSHOT``: the whole queue in one read-only call
(``genq.common.snapshot`` reads its answer)."""

from __future__ import annotations

from genq.common.lua.compose import script
from genq.common.lua.lanes import PRIORITIES

SNAPSHOT = script(
    "snapshot",
    """#!lua flags=no-writes
-- KEYS: the high, normal, low streams, the dead letters, tenants' settings, served, the
--       active sets of high, normal, low (all of the unnamed lane), the named lanes' registry,
--       the queue's config
-- ARGV: group, returned consumer, queued consumer, worker key prefix, window prefix, bucket
--       prefix, index prefixes of high, normal, low, history prefix, buckets, bucket seconds,
--       the caller's Unix ms (used only if this user may not run TIME)
-- Returns JSON: {now_ms, streams, lanes, default_model, workers, tenants, dead_letter, memory,
-- history}: streams are the unnamed lane's, lanes each named lane's streams and backlog.
-- no-writes: Redis runs it even when full (maxmemory reached), when an operator most needs it.
-- (genq bench --scenario dashboard finds it in the SLOWLOG by its first 128 characters.)
local group, returned, queued = ARGV[1], ARGV[2], ARGV[3]
local ok_time, t = pcall(redis.call, 'TIME')
if not ok_time then
  local ms = tonumber(ARGV[13])
  t = {tostring(math.floor(ms / 1000)), tostring((ms % 1000) * 1000)}
end
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local function kv(list)
  local m = {}
  for i = 1, #list, 2 do m[list[i]] = list[i + 1] end
  return m
end
local out = {now_ms = now, streams = {}, workers = {}, tenants = {}, history = {}, lanes = {}}
local names = {}
local function read_stream(key)
  local s = {length = redis.call('XLEN', key), consumers = {}}
  if redis.call('EXISTS', key) == 1 then
    for _, g in ipairs(redis.call('XINFO', 'GROUPS', key)) do
      local gm = kv(g)
      if gm['name'] == group then
        s.group = true
        s.pending, s.lag = gm['pending'], gm['lag']
        local nxt = redis.call('XRANGE', key, '(' .. gm['last-delivered-id'], '+', 'COUNT', 1)
        if nxt[1] then s.next_id = nxt[1][1] end
        for _, c in ipairs(redis.call('XINFO', 'CONSUMERS', key, group)) do
          local cm = kv(c)
          local row = {name = cm['name'], pending = cm['pending'], idle = cm['idle']}
          if cm['name'] == returned or cm['name'] == queued then
            local first = redis.call('XPENDING', key, group, '-', '+', 1, cm['name'])
            if first[1] then row.first_id = first[1][1] end
          else
            names[cm['name']] = true
          end
          table.insert(s.consumers, row)
        end
      end
    end
  end
  return s
end
for i = 1, 3 do out.streams[i] = read_stream(KEYS[i]) end
local qbase = lane_of_stream(KEYS[1])
local bases = {{'', qbase}}  -- {model, base} of each lane, the unnamed one first
for _, m in ipairs(redis.call('SMEMBERS', KEYS[10])) do
  table.insert(bases, {m, key_lane(qbase, m)})
end
out.default_model = redis.call('HGET', KEYS[11], 'default_model')
out.unnamed_waiting = redis.call('LLEN', key_waiting(qbase))
for j = 2, #bases do
  local base = bases[j][2]
  out.lanes[bases[j][1]] = {waiting = redis.call('LLEN', key_waiting(base)), streams = {
    read_stream(key_stream(base, PRI[1])), read_stream(key_stream(base, PRI[2])),
    read_stream(key_stream(base, PRI[3]))}}
end
local tenants = {}
for name, _ in pairs(names) do
  local h = redis.call('HGETALL', ARGV[4] .. name)
  out.workers[name] = h
  local running = kv(h)['in_flight_by_tenant']
  if running then
    local ok, doc = pcall(cjson.decode, running)
    if ok and type(doc) == 'table' then
      for tenant, _ in pairs(doc) do tenants[tenant] = true end
    end
  end
end
local settings = redis.call('HGETALL', KEYS[5])
local served = redis.call('HGETALL', KEYS[6])
out.settings, out.served = settings, served
for i = 1, #settings, 2 do tenants[settings[i]] = true end
for i = 1, #served, 2 do tenants[string.match(served[i], '^[^:]*')] = true end
for _, b in ipairs(bases) do
  for _, p in ipairs(PRI) do
    for _, m in ipairs(redis.call('SMEMBERS', key_active(b[2], p))) do tenants[m] = true end
  end
end
for tenant, _ in pairs(tenants) do
  local oldest = false  -- its oldest waiting entry's id's milliseconds (an index holds entry ids)
  local waiting = 0  -- in every lane
  for _, b in ipairs(bases) do
    for _, p in ipairs(PRI) do
      local idx = key_idx(b[2], p, tenant)
      local head = redis.call('LINDEX', idx, 0)
      local at = head and tonumber(string.match(head, '^(%d+)'))
      if at and (not oldest or at < oldest) then oldest = at end
      waiting = waiting + redis.call('LLEN', idx)
    end
  end
  out.tenants[tenant] = {
    oldest = oldest,
    waiting = waiting,
    window = redis.call('HGETALL', ARGV[5] .. tenant),
    held_back = redis.call('HGET', ARGV[6] .. tenant, 'held_back_ms'),
  }
end
out.dead_letter = redis.call('XLEN', KEYS[4])
local ok, info = pcall(redis.call, 'INFO', 'memory')
if ok then out.memory = info end
local n, width = tonumber(ARGV[11]), tonumber(ARGV[12])
local last = math.floor(tonumber(t[1]) / width) - 1  -- the last whole bucket
for b = last - n + 1, last do
  table.insert(out.history, {b, redis.call('HGETALL', ARGV[10] .. b)})
end
return cjson.encode(out)
""",
    PRIORITIES,
)
"""The queue at one instant (see the comment at its top)."""
