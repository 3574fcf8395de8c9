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

TALLY_LUA = """
-- A batch's request became final (STATE): add it to the batch's record OWNER's counters,
-- when the record keeps them (COUNTED is its 'counted' field, ENDED its 'ended_at_ms': the
-- caller read them; batch_counts.py).
local function tally(owner, state, counted, ended)
  if counted ~= '1' then return end
  local ok, doc = pcall(cjson.decode, state)
  if not ok or type(doc) ~= 'table' then return end
  local field = 'failed'
  if doc.status == 'succeeded' then field = 'completed'
  elseif doc.status == 'cancelled' then field = 'cancelled_requests' end
  redis.call('HINCRBY', owner, field, 1)
  local usage = type(doc.usage) == 'table' and doc.usage or {}
  for name, key in pairs({input_tokens = 'prompt_tokens', output_tokens = 'completion_tokens',
                          cached_tokens = 'cached_tokens'}) do
    local n = tonumber(usage[key])
    if n and n > 0 then redis.call('HINCRBY', owner, name, n) end
  end
  local t = type(doc.timings) == 'table' and tonumber(doc.timings.finished_unix_ms) or nil
  if t and t > tonumber(ended or '0') then
    redis.call('HSET', owner, 'ended_at_ms', string.format('%.0f', t))
  end
end
"""


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
