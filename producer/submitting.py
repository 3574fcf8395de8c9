"""Submitting and cancelling: the calls of the submit and APPLY scripts a client makes, and
what their answers mean. Shared by the sync and async clients.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import redis
from genq.common import states
from genq.common.errors import PriorityDenied, QueueFull, RequestNotFound, SubmitFailed
from genq.common.keys import Keys
from genq.common.models import host_now_ms
from genq.common.scripts import (
    PRIORITY_DENIED_PREFIX,
    QUEUE_FULL_PREFIX,
    TENANT_FULL_PREFIX,
    Applied,
    apply_args,
)
from genq.common.wire import as_text
from genq.producer.building import Prepared
from genq.producer.waiting import parse_stored

#: Requests per SUBMIT script call: each call is atomic, and short enough not to stall Redis.
SUBMIT_CHUNK = 500


def submit_calls(
    keys: Keys, requests: Sequence[Prepared], ttl_s: int, cluster: bool = False
) -> list[tuple[list[str], list[str | int]]]:
    """The (KEYS, ARGV) of the SUBMIT script calls that enqueue ``requests``, in chunks. On a
    Redis Cluster the per-id keys are the queue-slot marker (see ``Keys.submitted``), and the
    queued states and owners are written after (``queued_writes``)."""
    calls: list[tuple[list[str], list[str | int]]] = []
    for start in range(0, len(requests), SUBMIT_CHUNK):
        chunk = requests[start : start + SUBMIT_CHUNK]
        per_id = keys.submitted if cluster else keys.result
        script_keys = [keys.config, *keys.streams()] + [per_id(r.id) for r in chunk]
        args: list[str | int] = [ttl_s]
        for r in chunk:
            args += [r.id, r.priority, r.body, r.queued]
        calls.append((script_keys, args))
    return calls


def queued_writes(
    keys: Keys, requests: Sequence[Prepared], replies: Sequence[Any]
) -> list[tuple[str, str]]:
    """Redis Cluster only: (result key, queued state JSON naming the entry that owns the id) of
    each request the SUBMIT calls enqueued, for the client to SET NX (a worker may have written
    a newer state already)."""
    out: list[tuple[str, str]] = []
    for i, reply in enumerate(replies):
        if isinstance(reply, Exception):
            continue
        chunk = requests[i * SUBMIT_CHUNK : (i + 1) * SUBMIT_CHUNK]
        for r, entry in zip(chunk, reply, strict=True):
            if entry:  # SUBMIT: the new entry's id, or 0 if not enqueued
                entry_id = as_text(entry)
                owned = states.with_entry(r.queued, f"{r.priority}/{entry_id}")
                out.append((keys.result(r.id), owned))
    return out


def cancel_call(
    keys: Keys, request_id: str, raw: bytes | str | None, ttl_s: int, *, cluster: bool = False
) -> tuple[list[str], list[str | int]] | None:
    """KEYS and ARGV of the APPLY call that cancels a request whose state is ``raw``; None if
    it is already final. Raises RequestNotFound if it has no state. A cancelled response adds
    its webhook event, except on a Redis Cluster (``apply_args``)."""
    current = parse_stored(raw)
    if current is None:
        raise RequestNotFound(f"no request {request_id!r} in Redis (never submitted, or expired)")
    if current.is_final:
        return None
    state = states.cancelled(current, finished_ms=host_now_ms())
    return apply_args(keys, ttl_s, "cancel", [(request_id, None, "", state)], hooks=not cluster)


def cancel_outcome(request_id: str, reply: Any) -> bool:
    """Whether the APPLY call of ``cancel_call`` cancelled the request."""
    if reply[0] == Applied.NOT_FOUND:
        raise RequestNotFound(f"no request {request_id!r} in Redis (expired meanwhile)")
    return bool(reply[0] == Applied.WRITTEN)


def submit_outcome(requests: Sequence[Prepared], replies: Sequence[Any]) -> list[str]:
    """The ids of ``requests`` after the SUBMIT calls answered ``replies`` (one per chunk).
    If Redis refused a chunk, raise QueueFull (the queue's limit) or SubmitFailed (anything
    else: out of memory, ...), saying which requests went in (``submitted``) and which did not:
    each chunk is all or nothing, and the others may have gone in."""
    done: list[str] = []
    missed: list[str] = []
    first: Exception | None = None
    for i, reply in enumerate(replies):
        ids = [r.id for r in requests[i * SUBMIT_CHUNK : (i + 1) * SUBMIT_CHUNK]]
        if isinstance(reply, Exception):
            first = first or reply
            missed += ids
        else:
            done += ids
    if first is None:
        return done
    if PRIORITY_DENIED_PREFIX in str(first):
        tenant, priority, highest = str(first).split()[-3:]
        raise PriorityDenied(
            f"tenant {tenant!r} may not submit priority {priority!r}: its highest is "
            f"{highest!r} (genq tenants set {tenant} --max-priority)"
        )
    went_in = f"{len(done)} of {len(requests)} were enqueued (the error's .submitted)"
    if TENANT_FULL_PREFIX in str(first):
        tenant, waiting, limit = str(first).split()[-3:]
        raise QueueFull(
            f"tenant {tenant!r} has {waiting} requests waiting, its limit is {limit} "
            f"(max_queued); {went_in}. Retry later, or raise it with genq tenants set "
            f"{tenant} --max-queued N",
            submitted=done,
            not_submitted=missed,
        )
    if QUEUE_FULL_PREFIX in str(first):
        _, depth, limit = str(first).split()[-3:]
        raise QueueFull(
            f"queue is full: {depth} requests waiting or running, its limit is {limit} "
            f"(max_queue_depth); {went_in}. Retry later, or raise the limit with genq worker "
            "--max-queue-depth",
            submitted=done,
            not_submitted=missed,
        )
    hint = (
        " Redis is out of memory (maxmemory, noeviction): free memory or raise maxmemory, "
        "then submit the rest again."
        if isinstance(first, redis.exceptions.OutOfMemoryError)
        else ""
    )
    raise SubmitFailed(
        f"Redis refused the submit ({first}); {went_in}.{hint}",
        submitted=done,
        not_submitted=missed,
    ) from first
