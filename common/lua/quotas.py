"""The quota script, ``QUOTA_CLAIM``: a tenant's place among what it keeps through gateways,
taken only within its limits (``genq.producer.gateway.quotas``)."""

from __future__ import annotations

from genq.common.lua.compose import script

QUOTA_CLAIM = script(
    "quota claim",
    """
-- KEYS[1]: one tenant's kept things of one kind (Keys.stored)
-- ARGV: now (unix s), expires_at, member, most (0: no limit), most_bytes (0: none), bytes, ttl_s
-- Returns {'ok', count} (added), or {'count', count} / {'bytes', total} (refused: nothing added)
local now, most, most_bytes = tonumber(ARGV[1]), tonumber(ARGV[4]), tonumber(ARGV[5])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local n = redis.call('ZCARD', KEYS[1])
if most > 0 and n >= most then return {'count', n} end
if most_bytes > 0 then
  local total = 0
  for _, m in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
    total = total + (tonumber(string.match(m, ':(%d+)$')) or 0)
  end
  if total + tonumber(ARGV[6]) > most_bytes then return {'bytes', total} end
end
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[3])
redis.call('EXPIRE', KEYS[1], ARGV[7])
return {'ok', n + 1}
""",
)
"""One thing kept, if the tenant's limits allow it (see the comment at its top)."""
