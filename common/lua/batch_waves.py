"""The scripts of wave batches (``genq.producer.gateway.batch_waves``), each one atomic step of
a batch's rounds: ``FEED`` records a wave (if the file's offset is still the one it was read from),
``COMMIT`` drops a written part's lines from Redis (if its plan is still the record's),
``STOP`` stops a batch (cancelled, expired, failed); each finishes the batch when nothing
is left (``FINISH``: its event, and it leaves the running set). A wave batch lives on one
Redis, not a Cluster: these touch its keys and its requests' states together."""

from __future__ import annotations

from genq.common.lua.compose import Fragment, script

FINISH = Fragment(
    "finish a wave batch",
    ("finish_if_done",),
    """
-- The batch REC is finished when nothing is left to feed and every line fed was written out:
-- it leaves RUNNING, and (HOOKS) its webhook event goes to OUTBOX.
local function finish_if_done(rec, running, outbox, hooks)
  local f = redis.call('HMGET', rec, 'feeding', 'fed', 'collected', 'id', 'tenant',
                       'cancelled', 'expired', 'finished_at_ms')
  if f[1] ~= '0' or f[8] or tonumber(f[2] or '0') ~= tonumber(f[3] or '0') then return 0 end
  local now = redis.call('TIME')
  redis.call('HSET', rec, 'finished_at_ms', now[1] * 1000 + math.floor(now[2] / 1000))
  redis.call('SREM', running, f[4])
  if hooks == '1' then
    local kind = 'batch.completed'
    if f[7] == '1' then kind = 'batch.expired' elseif f[6] == '1' then kind = 'batch.cancelled'
    elseif redis.call('HGET', rec, 'failed_reason')
      or tonumber(redis.call('HGET', rec, 'total') or '0') == 0 then
      kind = 'batch.failed'  -- it could not go on, or no line of it was valid
    end
    redis.call('XADD', outbox, '*', 'type', kind, 'id', f[4], 'tenant', f[5] or 'default')
  end
  return 1
end
""",
)

FEED = script(
    "feed a wave",
    """
-- KEYS: record, open hash, rejected list, outbox, running set, done list, then the result
-- key of each request fed. ARGV: the offset the round read from, the new offset, the last
-- line's number, lines fed, 1 if the file ended, hooks, then each request's id and endpoint,
-- then error lines.
local rec, open, rejected, done = KEYS[1], KEYS[2], KEYS[3], KEYS[6]
if redis.call('HGET', rec, 'feeding') ~= '1' then return 0 end
if (redis.call('HGET', rec, 'offset') or '0') ~= ARGV[1] then return 0 end
local n = #KEYS - 6
local final = {succeeded = true, failed = true, cancelled = true, expired = true}
for i = 1, n do
  local id = ARGV[5 + 2 * i]
  redis.call('HSET', open, id, ARGV[6 + 2 * i])
  -- One that ended already (submitted by a round that died before this): queued to be
  -- written out now, as its end could not be.
  local state = redis.call('GET', KEYS[6 + i])
  local status = state and string.match(state, '^{"id":"[^"]*","status":"(%a+)"')
  if status and final[status] then redis.call('RPUSH', done, id) end
end
local refused = #ARGV - 6 - 2 * n
for i = 7 + 2 * n, #ARGV do redis.call('RPUSH', rejected, ARGV[i]) end
redis.call('HSET', rec, 'offset', ARGV[2], 'line', ARGV[3])
redis.call('HINCRBY', rec, 'fed', ARGV[4])
if refused > 0 then  -- refused lines, or (expired) lines never run: failed, in the error file
  redis.call('HINCRBY', rec, 'refused', refused)
  redis.call('HINCRBY', rec, 'total', -refused)
end
if ARGV[5] == '1' then
  redis.call('HSET', rec, 'feeding', 0)
  finish_if_done(rec, KEYS[5], KEYS[4], ARGV[6])
end
return 1
""",
    FINISH,
)

COMMIT = script(
    "commit a written part",
    """
-- KEYS: record, open hash, rejected list, outbox, running set, done list, then the result
-- keys of the requests written out. ARGV: the plan, error lines taken from the
-- rejected list, entries taken from the done list, output lines, error lines, hooks, then the
-- request ids written out.
local rec, open, rejected, done = KEYS[1], KEYS[2], KEYS[3], KEYS[6]
if redis.call('HGET', rec, 'plan') ~= ARGV[1] then return 0 end
for i = 7, #KEYS do redis.call('DEL', KEYS[i]) end
for i = 7, #ARGV do redis.call('HDEL', open, ARGV[i]) end
local taken = tonumber(ARGV[2])
if taken > 0 then redis.call('LTRIM', rejected, taken, -1) end
if tonumber(ARGV[3]) > 0 then redis.call('LTRIM', done, ARGV[3], -1) end
redis.call('HINCRBY', rec, 'parts', 1)
redis.call('HINCRBY', rec, 'collected', #ARGV - 6 + taken)  -- ids written out, lines taken
redis.call('HINCRBY', rec, 'output_lines', ARGV[4])
redis.call('HINCRBY', rec, 'error_lines', ARGV[5])
redis.call('HDEL', rec, 'plan')
finish_if_done(rec, KEYS[5], KEYS[4], ARGV[6])
return 1
""",
    FINISH,
)

STOP = script(
    "stop a wave batch",
    """
-- KEYS: record, outbox, running set. ARGV: 'cancelled', 'expired' or why it failed, now (Unix
-- s), hooks.
local rec = KEYS[1]
if redis.call('HGET', rec, 'finished_at_ms') then return 0 end
if ARGV[1] == 'cancelled' then
  redis.call('HSET', rec, 'cancelled', 1, 'cancelled_at', ARGV[2], 'feeding', 0)
elseif ARGV[1] ~= 'expired' then  -- it cannot go on: ARGV[1] says why
  redis.call('HSET', rec, 'failed_reason', ARGV[1], 'failed_at', ARGV[2], 'feeding', 0)
else
  redis.call('HSET', rec, 'expired', 1, 'expired_at', ARGV[2])
end
finish_if_done(rec, KEYS[3], KEYS[2], ARGV[3])
return 1
""",
    FINISH,
)
