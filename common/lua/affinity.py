"""Fragment: the read's affinity, which of a tenant's waiting items this reader takes: its own
prefixes first, no other worker's within the bound, cold adapters only with a free slot
(``genq.common.prefixes``: the rule and its constants)."""

from __future__ import annotations

from genq.common.lua.compose import Fragment
from genq.common.lua.lanes import LANES
from genq.common.lua.prefix_keys import PREFIX_KEYS
from genq.common.lua.tenants import TENANTS
from genq.common.prefixes import WINDOW

AFFINITY = Fragment(
    "affinity",
    ("ME", "NOW_MS", "AFF_WAIT_MS", "AFF_FACTOR", "PASSED", "pick_items", "unpicked"),
    f"""
-- Affinity (prefixes.py): which of a tenant's waiting items this reader takes. The read sets
-- ME (this consumer), NOW_MS, AFF_WAIT_MS (0: off, plain LPOP) and AFF_FACTOR from its ARGV.
local ME, NOW_MS, AFF_WAIT_MS, AFF_FACTOR = '', 0, 0, 1.5
-- Lanes (their BASE) where this call passed items over for the first time: the read rings
-- their doorbells once (an idle holder blocks on it, and would not read for seconds).
local PASSED = {{}}
local loads = nil
local function load_view()
  -- The live workers' loads (genq:{{Q}}:load, published with their heartbeats; a worker is
  -- live while its stats hash is, which its claim keeper renews even during a long batch),
  -- and their mean. A dead worker's entry is dropped here.
  if loads == nil then
    loads = {{live = {{}}, mean = 0}}
    local flat, n, sum = redis.call('HGETALL', key_load(QBASE)), 0, 0
    for j = 1, #flat, 2 do
      if redis.call('EXISTS', key_worker(QBASE, flat[j])) == 1 then
        loads.live[flat[j]] = tonumber(flat[j + 1]) or 0
        n, sum = n + 1, sum + (tonumber(flat[j + 1]) or 0)
      else
        redis.call('HDEL', key_load(QBASE), flat[j])
      end
    end
    loads.mean = n > 0 and sum / n or 0
  end
  return loads
end
local function available(w)  -- live, and not above the load bound
  local v = load_view()
  local held = v.live[w]
  return held ~= nil and held <= v.mean * AFF_FACTOR + 1
end
-- LoRA adapters: an item of an adapter's lane whose key is the adapter's (adapter_key) is
-- taken while nobody holds the adapter only by a reader with a free adapter slot (its
-- --max-loras less the adapters it holds, told by HOLD's '#N': genq:{{Q}}:slots), a slot each
-- new adapter it takes: adapters spread over the fleet instead of every worker loading all.
local lane_adapter, free_slots, slot_of = {{}}, nil, {{}}
local function adapter_item(k)  -- whether key k is the current lane's adapter's
  if LANE == '' then return false end
  lane_adapter[LANE] = lane_adapter[LANE] or adapter_key(LANE)
  return k == lane_adapter[LANE]
end
local function has_slot(k)  -- this reader may load adapter key k (and counts the slot)
  if slot_of[k] then return true end
  if free_slots == nil then
    free_slots = tonumber(redis.call('HGET', key_slots(QBASE), ME) or '') or math.huge
  end
  if free_slots <= 0 then return false end
  free_slots, slot_of[k] = free_slots - 1, true
  return true
end
local seen = {{}}  -- per index: {{its first items this call read, all with no key; whole list?}}
local function pick_items(idx, n)
  -- Up to n items of the index idx for this reader, and whether it left some for another
  -- worker: first those whose key this reader holds (unless it is above the load bound), then
  -- those with no key, and those no available worker holds when the reader has none of its
  -- own in sight, then those passed over for AFF_WAIT_MS or more (anyone with room). An item
  -- another available worker holds waits for it: the first reader to pass it over marks when
  -- (its third field), and from then on the bound runs (delay scheduling: measured from the
  -- pass-over, not from the submission, so a backlog is not "late" merely for being long).
  if AFF_WAIT_MS <= 0 then return redis.call('LPOP', idx, n) or {{}}, false end
  local sight = math.max({WINDOW}, n)  -- how far this pick looks
  local known = seen[idx]
  if known and (known[2] or known[1] >= sight) then
    -- This call read that far already and found no key, and the index only lost items from
    -- its front since: the pick below would take the first n (the reads of a tenant's
    -- entries one by one, ``take``, read the window once).
    local out = redis.call('LPOP', idx, n) or {{}}
    known[1] = known[1] - #out
    return out, false
  end
  local ask = sight + {WINDOW}  -- and a window more, for the picks after this one
  local items = redis.call('LRANGE', idx, 0, ask - 1)
  local keyed = false  -- an item with a key holds a space ('ID KEY'); work with no prefix has none
  for j = 1, math.min(#items, sight) do
    if string.find(items[j], ' ', 1, true) then keyed = true break end
  end
  if not keyed then  -- nothing in sight has a prefix: the first n, in order (as below, cheaper)
    local out = {{unpack(items, 1, math.min(n, #items))}}
    if #out > 0 then redis.call('LPOP', idx, #out) end
    local clear = #items  -- how many of the items read have no key
    for j = sight + 1, #items do
      if string.find(items[j], ' ', 1, true) then clear = j - 1 break end
    end
    seen[idx] = {{clear - #out, clear == #items and #items < ask}}
    return out, false
  end
  seen[idx] = nil
  if #items > sight then items = {{unpack(items, 1, sight)}} end
  local late, mine, free, cold, left = {{}}, {{}}, {{}}, {{}}, false
  local me_ok = nil  -- looked up at the first keyed item (keyless work needs no load view)
  for j, it in ipairs(items) do
    local k = item_key(it)
    local since = tonumber(string.match(it, '^%S+ %x+ (%d+)$'))
    if k == nil then table.insert(free, j)
    elseif since and NOW_MS - since >= AFF_WAIT_MS then table.insert(late, j)
    else
      local holders = redis.call('HGET', key_holders(QBASE), k)
      local ours, other = false, false
      for w in string.gmatch(holders or '', '%S+') do
        if w == ME then ours = true elseif available(w) then other = true end
      end
      if ours and me_ok == nil then me_ok = available(ME) or load_view().live[ME] == nil end
      if ours and me_ok then table.insert(mine, j)
      elseif not other then table.insert(cold, j)
      else
        left = true
        if not since then  -- passed over for the first time: the bound starts now
          items[j] = item_id(it) .. ' ' .. k .. ' ' .. NOW_MS
          redis.call('LSET', idx, j - 1, items[j])
          PASSED[BASE] = true
        end
      end
    end
  end
  -- Prefixes nobody holds: taken by a reader with none of its own in sight; one that has its
  -- own work leaves them (marked passed over: within the bound, a reader without work of its
  -- own takes them, after it anyone with room), so workers keep to their prefixes instead of
  -- each taking a little of every new one.
  for _, j in ipairs(cold) do
    local k = item_key(items[j])
    local ok
    if adapter_item(k) then ok = has_slot(k) else ok = #mine == 0 end
    if ok then table.insert(free, j)
    else
      left = true
      local it = items[j]
      if not string.match(it, '^%S+ %x+ %d+$') then
        items[j] = it .. ' ' .. NOW_MS
        redis.call('LSET', idx, j - 1, items[j])
        PASSED[BASE] = true
      end
    end
  end
  table.sort(free)
  local chosen = {{}}
  for _, group in ipairs({{mine, free, late}}) do
    for _, j in ipairs(group) do
      if #chosen < n then table.insert(chosen, j) end
    end
  end
  table.sort(chosen)  -- in their order: the oldest first
  local out, prefix = {{}}, true
  for c, j in ipairs(chosen) do
    out[c] = items[j]
    if j ~= c then prefix = false end
  end
  if prefix then
    if #out > 0 then redis.call('LPOP', idx, #out) end
  else
    for _, it in ipairs(out) do redis.call('LREM', idx, 1, it) end
  end
  return out, left and #out < n
end
local function unpicked(idx, item)  -- an item picked, put back in front of its index
  redis.call('LPUSH', idx, item)
  seen[idx] = nil
end
""",
    (LANES, PREFIX_KEYS, TENANTS),
)
