"""The dead-letter stream of a queue, for people: list, retry, purge (``genq dlq`` and the
dashboard). What workers put there, and why, is in ``genq.worker.runtime.dead_letter``; the
fields of an entry: ``stream``, ``entry_id``, ``request_id`` (may be empty), ``error``,
``fields`` (the original entry's fields as JSON), ``worker``, ``at_unix_ms``."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from genq.common import states
from genq.common.connection import is_cluster
from genq.common.keys import DEAD_LETTER_MAX_ENTRIES, Keys
from genq.common.models import DEFAULT_TENANT, tenant_problem
from genq.common.wire import as_text

SHOWN = "replace"
"""Bytes that are not UTF-8, shown with replacement characters: a dead letter records any entry."""


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


def list_dead(r: Any, keys: Keys, count: int = 100) -> list[DeadLetter]:
    """The oldest ``count`` dead-letter entries."""
    return from_rows(r.xrange(keys.dead_letter, count=count))


def from_rows(rows: Any) -> list[DeadLetter]:
    """The entries of an XRANGE reply (``list_dead``'s, or a pipeline's)."""
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


def retry_dead(r: Any, keys: Keys, dlq_ids: list[str] | None, result_ttl_s: int) -> list[str]:
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


def purge_dead(r: Any, keys: Keys) -> int:
    """Delete every dead-letter entry; return how many there were."""
    n = int(r.xlen(keys.dead_letter))
    r.delete(keys.dead_letter)
    return n
