"""The dead-letter stream: what the worker puts there (``genq dlq list | retry | purge`` and the
dashboard read and act on it with ``genq.producer.gateway.dead_letters``).

Two kinds of entries land there, each with the reason:

- entries with no usable request id (nothing to fail: acknowledged and recorded);
- poison requests: started ``max_attempts`` times, every time by a worker that died. They also end
  ``failed``; ``retry`` puts them back in their stream (and resets their state to ``queued``).

Fields of a dead-letter entry: ``stream``, ``entry_id``, ``request_id`` (may be empty),
``error``, ``fields`` (the original entry's fields as JSON), ``worker``, ``at_unix_ms``.

Bounded in bytes as well as in entries (``DEAD_LETTER_MAX_ENTRIES``): an entry that is not a
request keeps at most ``MAX_JUNK_FIELDS_CHARS`` characters of its fields (the first fields, the
last one cut, and a note of what was left out), so junk entries of any size fill the stream to
~160 MB at most; a poison request is kept whole (``genq dlq retry`` puts it back), and the
request limits bound its size.
"""

from __future__ import annotations

import json
from typing import Any

from genq.common.keys import DEAD_LETTER_MAX_ENTRIES, Keys
from genq.common.wire import as_text
from genq.worker.runtime.clock import now_ms

MAX_JUNK_FIELDS_CHARS = 16_000
"""Most characters of field names and values kept from an entry that is not a request."""
SHOWN = "replace"
"""Bytes that are not UTF-8, shown with replacement characters: a dead letter records any entry."""
CUT_NOTE = "genq:cut"
"""The field that says what was left out of a dead-lettered entry's fields."""


def dead_letter_fields(
    *,
    stream: str,
    entry_id: str,
    fields: dict[Any, Any],
    error: str,
    worker: str,
    request_id: str | None = None,
) -> dict[str, str | int]:
    """The fields of the dead-letter entry recording ``fields`` (a work entry). Those of an
    entry with no request id are cut to ``MAX_JUNK_FIELDS_CHARS`` in all."""
    shown = {as_text(k, SHOWN): as_text(v, SHOWN) for k, v in fields.items()}
    if request_id is None:
        shown = _cut(shown, MAX_JUNK_FIELDS_CHARS)
    return {
        "stream": stream,
        "entry_id": entry_id,
        "request_id": request_id or "",
        "error": error,
        "fields": json.dumps(shown),
        "worker": worker,
        "at_unix_ms": now_ms(),  # Redis' clock, as everything a worker records
    }


def _cut(fields: dict[str, str], budget: int) -> dict[str, str]:
    """The first fields of ``fields`` that fit in ``budget`` characters (the last one cut),
    with a note of what was left out if anything was."""
    kept: dict[str, str] = {}
    left = budget
    for name, value in fields.items():
        if left <= 0:
            break
        kept[name[:left]] = value[: max(0, left - len(name))]
        left -= len(name) + len(value)
    total = sum(len(k) + len(v) for k, v in fields.items())
    if total > budget:
        kept[CUT_NOTE] = (
            f"cut to {budget} of {total} characters ({len(kept)} of {len(fields)} fields kept)"
        )
    return kept


def add_to_pipeline(pipe: Any, keys: Keys, record: dict[str, str | int]) -> None:
    """Queue the XADD of ``record`` to the dead-letter stream on ``pipe``."""
    pipe.xadd(keys.dead_letter, record, maxlen=DEAD_LETTER_MAX_ENTRIES, approximate=True)
