"""The dead-letter stream: what the worker puts there, and ``genq dlq list | retry | purge``.

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
from dataclasses import dataclass
from typing import Any

import redis
from genq.common import states
from genq.common.connection import is_cluster
from genq.common.keys import DEAD_LETTER_MAX_ENTRIES, Keys
from genq.common.models import DEFAULT_TENANT, tenant_problem
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


@dataclass(kw_only=True)
class DeadLetter:
    """One dead-letter entry, as ``genq dlq list`` shows it."""

    dlq_id: str
    stream: str
    entry_id: str
    request_id: str
    error: str
    fields: dict[str, str]
    worker: str
    at_unix_ms: int

    @property
    def tenant(self) -> str:
        """The tenant its body names (``default`` if none, or no body to read)."""
        try:
            body = json.loads(self.fields.get("body", "{}"))
        except ValueError:
            return DEFAULT_TENANT
        tenant = body.get("tenant") if isinstance(body, dict) else None
        return (
            tenant if isinstance(tenant, str) and tenant_problem(tenant) is None else DEFAULT_TENANT
        )


def list_dead(r: redis.Redis, keys: Keys, count: int = 100) -> list[DeadLetter]:
    """The oldest ``count`` dead-letter entries."""
    rows: Any = r.xrange(keys.dead_letter, count=count)
    out = []
    for dlq_id, f in rows:
        g = {as_text(k, SHOWN): as_text(v, SHOWN) for k, v in f.items()}
        out.append(
            DeadLetter(
                dlq_id=as_text(dlq_id),
                stream=g.get("stream", ""),
                entry_id=g.get("entry_id", ""),
                request_id=g.get("request_id", ""),
                error=g.get("error", ""),
                fields=json.loads(g.get("fields", "{}")),
                worker=g.get("worker", ""),
                at_unix_ms=int(g.get("at_unix_ms", "0") or 0),
            )
        )
    return out


def retry_dead(
    r: redis.Redis, keys: Keys, dlq_ids: list[str] | None, result_ttl_s: int
) -> list[str]:
    """Put dead-letter entries (all if ``dlq_ids`` is None) back into their work streams, reset
    their requests' state to ``queued`` (a new final event will follow), and remove them from
    the dead-letter stream. Returns the new work entry ids."""
    wanted = None if dlq_ids is None else set(dlq_ids)
    retried = []
    for d in list_dead(r, keys, count=DEAD_LETTER_MAX_ENTRIES * 2):
        if wanted is not None and d.dlq_id not in wanted:
            continue
        if d.stream not in keys.streams():
            continue  # not a work stream of this queue: leave it for a person to look at
        # One transaction on one Redis; on a cluster the state and the stream are in
        # different slots, so the commands go in order without one.
        pipe = r.pipeline(transaction=not is_cluster(r))
        if d.request_id:
            queued = states.queued(
                request_id=d.request_id,
                priority=keys.priority_of(d.stream),
                metadata={},
                tenant=d.tenant,
            )
            pipe.set(keys.result(d.request_id), queued, ex=result_ttl_s)
            pipe.delete(keys.events(d.request_id))  # its old final event is no longer final
        pipe.xadd(d.stream, dict[Any, Any](d.fields))
        pipe.xdel(keys.dead_letter, d.dlq_id)
        replies = pipe.execute()
        retried.append(as_text(replies[-2]))
    return retried


def purge_dead(r: redis.Redis, keys: Keys) -> int:
    """Delete every dead-letter entry; return how many there were."""
    n = int(r.xlen(keys.dead_letter))
    r.delete(keys.dead_letter)
    return n
