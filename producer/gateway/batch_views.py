"""A batch as read from Redis (``BatchView``): its record, and either the counters its
requests' ends keep on it (a status in constant time: ``common/batch_counts.py``) or its
requests with their states (its output files, a cancel, a wait)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from genq.common.batch_counts import counts_of
from genq.common.connection import is_cluster
from genq.common.errors import RequestNotFound
from genq.common.models import DEFAULT_TENANT, FINAL_STATUSES, Result
from genq.common.wire import as_text
from genq.producer.client import Client
from genq.producer.submitting import SUBMIT_CHUNK
from genq.producer.waiting import parse_stored

REFUSED_KEPT = 100
"""Refused input lines kept one by one (``Keys.batch_rejected``): the first ones, with their
messages cut short; the rest are only counted (the record's ``refused``). A file of junk lines
costs Redis ~30 KB, not a record per line (a 1 MB file of junk used to become 110 MB)."""


@dataclass(frozen=True, kw_only=True)
class BatchView:
    """A batch as read from Redis: its record, and either its counters (``counts``: what its
    requests came to, kept on the record where they end) or its requests (id, endpoint) in
    input order with their current states; and the refused lines' error-file lines."""

    id: str
    record: dict[str, str]
    items: list[tuple[str, str]]
    states: list[Result | None]
    rejected: list[dict[str, Any]]
    """The error-file lines of the refused input lines kept (the first ``REFUSED_KEPT``)."""
    counts: dict[str, int] | None = None
    """The record's counters (``common/batch_counts.py``) when read instead of the states
    (``read_batches(..., states=False)``); None: computed from ``states``."""

    @property
    def refused(self) -> int:
        """How many input lines were refused in all (kept or only counted)."""
        return max(len(self.rejected), int(self.record.get("refused") or 0))

    @property
    def lines(self) -> int:
        """How many of its lines became requests."""
        return int(self.record.get("total") or len(self.items))

    @property
    def completed(self) -> int:
        if self.counts is not None:
            return self.counts["completed"]
        return sum(1 for s in self.states if s is not None and s.status == "succeeded")

    @property
    def failed(self) -> int:
        if self.counts is not None:
            return self.counts["failed"] + self.counts["cancelled_requests"] + self.refused
        ended = sum(1 for s in self.states if s is not None and s.status in FINAL_STATUSES)
        return ended - self.completed + self.refused

    @property
    def total(self) -> int:
        return self.lines + self.refused

    @property
    def waves(self) -> bool:
        """Whether it runs in waves from the file store (``batch_waves.py``)."""
        return self.record.get("waves") == "1"

    @property
    def finished(self) -> bool:
        if self.waves:  # every line it will run has ended and is written out
            return bool(self.record.get("finished_at_ms"))
        return self.completed + self.failed == self.total

    @property
    def ended_ms(self) -> int | None:
        """When its last request ended (Unix ms), or None."""
        if self.counts is not None:
            return self.counts["ended_at_ms"] or None
        ends = [s.timings.finished_unix_ms for s in self.states if s is not None and s.is_final]
        return max((e for e in ends if e is not None), default=None)

    @property
    def usage(self) -> tuple[int, int, int]:
        """Its requests' prompt tokens, of those cached, and generated tokens, summed."""
        if self.counts is not None:
            c = self.counts
            return c["input_tokens"], c["cached_tokens"], c["output_tokens"]
        done = [s.usage for s in self.states if s is not None and s.is_final]
        return (
            sum(u.prompt_tokens for u in done),
            sum(u.cached_tokens for u in done),
            sum(u.completion_tokens for u in done),
        )


def read_batch(
    client: Client, batch_id: str, *, tenant: str | None = None, states: bool = True
) -> BatchView:
    """The batch's record, requests and their states now (``states``: False, its counters
    instead where its record keeps them: one hash, however many lines); RequestNotFound if
    there is none, if it is another queue's, or (with ``tenant``) if it belongs to another
    tenant: the same error, no hint it exists."""
    found = read_batches(client, [batch_id], states=states)
    owner = found[0].record.get("tenant", DEFAULT_TENANT) if found else None
    if owner is None or (tenant is not None and owner != tenant):
        raise no_batch(batch_id)
    if found[0].record.get("queue", client.keys.queue) != client.keys.queue:
        raise no_batch(batch_id)  # another queue's batch: not this queue's to show
    return found[0]


def read_batches(
    client: Client, batch_ids: Sequence[str], *, states: bool = True
) -> list[BatchView]:
    """Several batches as ``read_batch`` reads one, in a round trip (``states`` False, and
    their records keep counters: not on a Redis Cluster, where their requests' ends cannot
    reach them) or three, however many (those that no longer exist are left out)."""
    keys = client.keys
    pipe = client.redis.pipeline(transaction=False)
    for batch_id in batch_ids:
        pipe.hgetall(keys.batch(batch_id))
    read = [
        (b, {as_text(k): as_text(v) for k, v in (info or {}).items()})
        for b, info in zip(batch_ids, pipe.execute(), strict=True)
    ]
    # Refused lines kept one by one: a wave batch's are in its error file instead.
    older = [b for b, rec in read if rec and rec.get("waves") != "1"]
    pipe = client.redis.pipeline(transaction=False)
    for batch_id in older:
        pipe.lrange(keys.batch_rejected(batch_id), 0, REFUSED_KEPT - 1)
    kept = dict(zip(older, pipe.execute() if older else [], strict=True))
    records = [(b, rec, kept.get(b, [])) for b, rec in read if rec]
    counted = not states and not is_cluster(client.redis)
    counts = {b: counts_of(rec) if counted else None for b, rec, _ in records}
    items = _items(client, [b for b, _, _ in records if counts[b] is None])
    wanted = [keys.result(rid) for b, _, _ in records for rid, _ in items.get(b, [])]
    found = iter(_states(client, wanted))
    return [
        BatchView(
            id=batch_id,
            record=record,
            items=items.get(batch_id, []),
            states=[next(found) for _ in items.get(batch_id, [])],
            rejected=[json.loads(r) for r in raw_rejected],
            counts=counts[batch_id],
        )
        for batch_id, record, raw_rejected in records
    ]


def _items(client: Client, batch_ids: Sequence[str]) -> dict[str, list[tuple[str, str]]]:
    """Each batch's requests (id, endpoint), in input order (one round trip)."""
    if not batch_ids:
        return {}
    pipe = client.redis.pipeline(transaction=False)
    for batch_id in batch_ids:
        pipe.lrange(client.keys.batch_items(batch_id), 0, -1)
    out = {}
    for batch_id, raw_items in zip(batch_ids, pipe.execute(), strict=True):
        lines = (as_text(r).partition(" ") for r in raw_items)
        out[batch_id] = [(rid, url) for rid, _, url in lines]
    return out


def _states(client: Client, wanted: Sequence[str]) -> list[Result | None]:
    """The states at these result keys (one round trip)."""
    if not wanted:
        return []
    pipe = client.redis.pipeline(transaction=False)
    if is_cluster(client.redis):  # each request's key in its own slot
        for key in wanted:
            pipe.get(key)
        raws = pipe.execute()
    else:
        for start in range(0, len(wanted), SUBMIT_CHUNK):
            pipe.mget(wanted[start : start + SUBMIT_CHUNK])
        raws = [raw for chunk in pipe.execute() for raw in chunk]
    return [parse_stored(raw) for raw in raws]


def no_batch(batch_id: str) -> RequestNotFound:
    return RequestNotFound(f"no batch {batch_id!r} (never submitted, or expired)")
