"""The holdings script, ``HOLD``: which prefixes (and adapters) a worker holds, and its free
adapter slots, where the read's affinity finds them (``genq.common.prefixes``)."""

from __future__ import annotations

from genq.common.lua.compose import script
from genq.common.prefixes import HOLDINGS_TTL_S, MAX_HOLDERS

HOLD = script(
    "hold",
    f"""
-- KEYS: the queue's config key (genq:{{Q}}:config: the base of the others)
-- ARGV: this worker, then keys: '+KEY' it holds now, '-KEY' it no longer holds; '#N': it
--       has N free adapter slots (genq:{{Q}}:slots)
-- Which prefixes (and adapters) this worker holds (genq:{{Q}}:holders: key -> its holders,
-- the most recent first, at most {MAX_HOLDERS}). Its load goes with its heartbeat
-- (genq:{{Q}}:load).
local base = base_of_config(KEYS[1])
local me = ARGV[1]
local function hold(op, k)
  local list = {{}}
  if op == '+' then table.insert(list, me) end
  for w in string.gmatch(redis.call('HGET', key_holders(base), k) or '', '%S+') do
    if w ~= me and #list < {MAX_HOLDERS} then table.insert(list, w) end
  end
  if #list > 0 then
    redis.call('HSET', key_holders(base), k, table.concat(list, ' '))
  else
    redis.call('HDEL', key_holders(base), k)
  end
end
for j = 2, #ARGV do
  local op, k = string.sub(ARGV[j], 1, 1), string.sub(ARGV[j], 2)
  if op == '#' then
    redis.call('HSET', key_slots(base), me, k)
    redis.call('EXPIRE', key_slots(base), {HOLDINGS_TTL_S})
  else
    hold(op, k)
  end
end
redis.call('EXPIRE', key_holders(base), {HOLDINGS_TTL_S})
return #ARGV - 1
""",
)
"""A worker's holdings changed (see the comment at its top)."""
