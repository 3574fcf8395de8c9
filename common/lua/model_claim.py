"""The model claim, ``CLAIM_MODEL``: a worker of a pool claims a model before it loads it, so
that two workers never both load the model one of them can serve (``worker/runtime/
model_pool.py``). A model is held as an adapter is: the holders hash, under its adapter key."""

from __future__ import annotations

from genq.common.lua.compose import script
from genq.common.prefixes import HOLDINGS_TTL_S, MAX_HOLDERS

CLAIM_MODEL = script(
    "model_claim",
    f"""
-- KEYS: the queue's config key (genq:{{Q}}:config: the base of the others)
-- ARGV: this worker, the model's key in the holders hash, how many holders its backlog
--       needs (0: any number: it starved)
-- Claim the model: when fewer live workers than that hold it (or load it) now, this one is
-- added at the front of its holders (dead ones dropped: they have no stats hash) and the
-- answer is 1; else nothing changes and the answer is 0. One script: two workers that look
-- at once never both take the one place.
local base = base_of_config(KEYS[1])
local me, k, need = ARGV[1], ARGV[2], tonumber(ARGV[3])
local live = {{}}
for w in string.gmatch(redis.call('HGET', key_holders(base), k) or '', '%S+') do
  if w ~= me and redis.call('EXISTS', key_worker(base, w)) == 1 then
    table.insert(live, w)
  end
end
if need > 0 and #live >= need then return 0 end
local list = {{me}}
for _, w in ipairs(live) do
  if #list < {MAX_HOLDERS} then table.insert(list, w) end
end
redis.call('HSET', key_holders(base), k, table.concat(list, ' '))
redis.call('EXPIRE', key_holders(base), {HOLDINGS_TTL_S})
return 1
""",
)
"""A pool's worker claims a model before it loads it (see the comment at its top)."""
