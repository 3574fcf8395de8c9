"""Fragment: a batch's counters, kept where its requests end (``genq.common.batch_counts``)."""

from __future__ import annotations

from genq.common.lua.compose import Fragment
from genq.common.lua.numbers import NUMBER

TALLY = Fragment(
    "tally",
    ("COUNTERS", "tally", "queue_done", "flush_tallies"),
    """
-- A batch's request became final (STATE): add it to the batch's record OWNER's counters,
-- when the record keeps them (COUNTED is its 'counted' field, ENDED its 'ended_at_ms': the
-- caller read them). The counts are kept per record in this script call and written once
-- each by flush_tallies() at its end (and a wave batch's ended ids, queued with queue_done,
-- in one RPUSH): a call ends a worker's whole batch, often many lines of one batch, and a
-- write per line and counter cost Redis more than the rest of their end.
local tallies = {}
local COUNTERS = {'completed', 'failed', 'cancelled_requests', 'input_tokens', 'output_tokens',
                  'cached_tokens'}
local function tally_of(owner, ended)
  local t = tallies[owner]
  if not t then
    t = {ended = tonumber(ended or '0') or 0, ids = {}}
    for _, f in ipairs(COUNTERS) do t[f] = 0 end
    t.last = t.ended
    tallies[owner] = t
  end
  return t
end
local function tally(owner, state, counted, ended)
  if counted ~= '1' then return end
  local status = string.match(state, '^{"id":"[^"]*","status":"(%a+)"')
  if not status then return end
  local t = tally_of(owner, ended)
  local field = 'failed'
  if status == 'succeeded' then field = 'completed'
  elseif status == 'cancelled' then field = 'cancelled_requests' end
  t[field] = t[field] + 1
  -- The numbers are found by their keys, not by decoding the whole document: a quote in a
  -- state's text is escaped (a backslash before it), and a batch line's metadata is genq's
  -- own (custom_id, batch), so each key found is the state's.
  for name, key in pairs({input_tokens = '"prompt_tokens":', output_tokens =
                          '"completion_tokens":', cached_tokens = '"cached_tokens":'}) do
    local n = number_of(state, key, key .. '(%d+)')  -- (the key has no magic character)
    if n and n > 0 then t[name] = t[name] + n end
  end
  local at = number_of(state, '"finished_unix_ms":', '"finished_unix_ms":(%d+)')
  if at and at > t.last then t.last = at end
end
local function queue_done(owner, id)  -- (after tally: it made the record's entry)
  table.insert(tally_of(owner, nil).ids, id)
end
local function flush_tallies()
  for owner, t in pairs(tallies) do
    for _, f in ipairs(COUNTERS) do
      if t[f] > 0 then redis.call('HINCRBY', owner, f, t[f]) end
    end
    if t.last > t.ended then
      redis.call('HSET', owner, 'ended_at_ms', string.format('%.0f', t.last))
    end
    for j = 1, #t.ids, 1000 do  -- (unpack's limit)
      redis.call('RPUSH', key_batch_done(owner), unpack(t.ids, j, math.min(j + 999, #t.ids)))
    end
  end
  tallies = {}
end
""",
    (NUMBER,),
)
