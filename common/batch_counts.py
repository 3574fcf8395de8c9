"""A batch's counters, kept where its requests end (a batch's status in constant time).

A batch's record (``Keys.batch``) holds, besides what its submission wrote, what its requests
came to, added by the same script that writes each one's final state (APPLY, and
``genq_cancel``: the ``tally`` fragment of ``genq.common.lua``, which the webhook hook runs for a
batch's record):

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
"""The counters the scripts' ``tally`` keeps on a batch's record."""


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
