"""Fragment: the webhook hook, run where a state becomes final (APPLY and ``genq_cancel``): a
response's event, or a batch's once its last request ended (``genq.common.webhooks``)."""

from __future__ import annotations

from genq.common.lua.compose import Fragment
from genq.common.lua.tally import TALLY

HOOK = Fragment(
    "webhook hook",
    ("any_record", "hook"),
    """
local function any_record(first, step, n)
  -- Whether any of the n keys KEYS[first], KEYS[first + step], ... exists, in one EXISTS a
  -- thousand keys (unpack's limit). Most writes end no response's and no batch's request:
  -- then none of them looks for its record (a call each: ~10% of APPLY's time).
  local found = 0
  for j = 0, n - 1, 1000 do
    local slice = {}
    for i = j, math.min(j + 999, n - 1) do slice[#slice + 1] = KEYS[first + step * i] end
    found = found + redis.call('EXISTS', unpack(slice))
  end
  return found > 0
end
-- A request became final: if OWNER is a response's record (a string), add that response's
-- event to OUTBOX, its type from the final STATE; if OWNER is a batch's record (a hash with
-- 'open', the requests not yet final), add it to the batch's counters, count one down, and at
-- zero add the batch's event. (genq writes these records and states: their fields are where
-- it put them.) Returns true for a line of a wave batch: its result is read from the batch's
-- output file, so the caller writes no final event stream for it (no one waits on one). The
-- caller runs flush_tallies() at its end: the counts are written once a call.
local function hook(outbox, owner, state)
  -- A batch's record (a hash): the fields this needs, in one call (waves, open, then tally's);
  -- a response's record is a string (WRONGTYPE); no record: all nil.
  local f = redis.pcall('HMGET', owner, 'waves', 'open', 'counted', 'ended_at_ms')
  if f.err then
    local record = redis.call('GET', owner)
    local status = string.match(state, '^{"id":"[^"]*","status":"(%a+)"')
    local event = 'response.failed'
    if status == 'succeeded' then
      event = string.find(state, '"finish_reason":"length"', 1, true) and 'response.incomplete'
        or 'response.completed'
    elseif status == 'cancelled' then
      event = 'response.cancelled'
    end
    local id = string.match(record, '^{"id":"([^"]*)"') or ''
    local tenant = string.match(record, '"tenant":"([^"]*)"') or 'default'
    redis.call('XADD', outbox, '*', 'type', event, 'id', id, 'tenant', tenant)
  elseif f[1] == '1' then
    -- A wave batch: counted, and its id queued to be written out (key_batch_done); its event
    -- comes when its output is written (batch_waves).
    tally(owner, state, f[3], f[4])
    local id = string.match(state, '^{"id":"([^"]*)"')
    if id then queue_done(owner, id) end
    return true
  elseif f[2] then
    tally(owner, state, f[3], f[4])
    if redis.call('HINCRBY', owner, 'open', -1) ~= 0 then return false end
    local g = redis.call('HMGET', owner, 'id', 'tenant', 'cancelled')
    local event = g[3] == '1' and 'batch.cancelled' or 'batch.completed'
    redis.call('XADD', outbox, '*', 'type', event, 'id', g[1] or '', 'tenant', g[2] or 'default')
  end
  return false
end
""",
    (TALLY,),
)
