"""A batch's counters, kept where its requests end (#38: a batch's status in constant time).

A batch's record (``Keys.batch``) holds, besides what its submission wrote, what its requests
came to, added by the same script that writes each one's final state (APPLY, and
``genq_cancel``: ``TALLY_LUA``, which the webhook hook runs for a batch's record):

========================  ======================================================================
field                     what it counts
========================  ======================================================================
``counted``               ``1``: this record keeps the counters below (a batch submitted by an
                          older genq, or on a Redis Cluster, has none: its status is read from
                          its requests' states)
``open``                  its requests not yet final (the last one's end adds the batch's event)
``completed``             requests that succeeded
``failed``                requests that failed or expired
``cancelled_requests``    requests that were cancelled (``cancelled`` is the batch's flag)
``input_tokens``          their prompt tokens, summed
``cached_tokens``         of those, the ones an engine's prefix cache held
``output_tokens``         their generated tokens, summed
``ended_at_ms``           when the last of them ended (Unix ms)
========================  ======================================================================

So ``GET /v1/batches/{id}`` reads one hash however many lines the batch has. A request ends
once (APPLY writes a final state over a non-final one only), so nothing is counted twice.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from genq.common.wire import NUMBER_LUA

COUNT_FIELDS = (
    "completed",
    "failed",
    "cancelled_requests",
    "input_tokens",
    "cached_tokens",
    "output_tokens",
    "ended_at_ms",
)
"""The counters ``TALLY_LUA`` keeps on a batch's record."""

TALLY_LUA = (
    NUMBER_LUA
    + """
-- A batch's request became final (STATE): add it to the batch's record OWNER's counters,
-- when the record keeps them (COUNTED is its 'counted' field, ENDED its 'ended_at_ms': the
-- caller read them; batch_counts.py). The counts are kept per record in this script call and
-- written once each by flush_tallies() at its end (and a wave batch's ended ids, queued with
-- queue_done, in one RPUSH): a call ends a worker's whole batch, often many lines of one
-- batch, and a write per line and counter cost Redis more than the rest of their end.
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
      redis.call('RPUSH', owner .. ':done', unpack(t.ids, j, math.min(j + 999, #t.ids)))
    end
  end
  tallies = {}
end
"""
)


def counts_of(record: Mapping[str, str]) -> dict[str, int] | None:
    """The counters of a batch's record, or None if it keeps none (``counted``)."""
    if record.get("counted") != "1":
        return None
    return {f: int(record.get(f) or 0) for f in COUNT_FIELDS}


def usage_object(input_tokens: int, cached_tokens: int, output_tokens: int) -> dict[str, Any]:
    """OpenAI's ``usage`` of a Batch (``openai.types.BatchUsage``)."""
    return {
        "input_tokens": input_tokens,
        "input_tokens_details": {"cached_tokens": cached_tokens},
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": input_tokens + output_tokens,
    }
