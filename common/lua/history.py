"""The history script, ``HISTORY``: a worker's increments added to the current 5-s bucket of
Redis' clock, and the backlog sampled (``genq.common.history``)."""

from __future__ import annotations

from genq.common.lua.compose import script

HISTORY = script(
    "history",
    """
-- KEYS: the queue's waiting list, and its registry of named lanes (the depth sampled is the
--       length of the waiting lists of every lane: keys.py, ``Keys.lane``)
-- ARGV: the history key prefix, seconds per bucket, bucket TTL, the caller's Unix seconds (if
--       this user may not run TIME), then FIELD INCREMENT pairs
-- Adds the increments to the bucket of Redis' clock now and raises its depth_max.
local ok, t = pcall(redis.call, 'TIME')
if not ok then t = {ARGV[4]} end
local key = ARGV[1] .. math.floor(tonumber(t[1]) / tonumber(ARGV[2]))
for i = 5, #ARGV, 2 do redis.call('HINCRBY', key, ARGV[i], ARGV[i + 1]) end
local depth = redis.call('LLEN', KEYS[1])
local base = base_of_waiting(KEYS[1])
for _, m in ipairs(redis.call('SMEMBERS', KEYS[2] or '')) do
  depth = depth + redis.call('LLEN', key_waiting(key_lane(base, m)))
end
local top = tonumber(redis.call('HGET', key, 'depth_max') or '-1')
if depth > top then redis.call('HSET', key, 'depth_max', depth) end
redis.call('EXPIRE', key, ARGV[3])
return depth
""",
)
"""A worker's heartbeat added to the history (see the comment at its top)."""
