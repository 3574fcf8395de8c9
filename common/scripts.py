"""Calling the queue's scripts from Python: APPLY's KEYS and ARGV, and the call itself, on one
Redis or a Redis Cluster. The scripts are Redis' side, in ``genq.common.lua`` (``submit``,
``apply``, with what they answer); this module names them for the clients and the worker.

Callers send them by their hash (``script_calls``: EVALSHA; the source only after NOSCRIPT).
Keys are passed as KEYS where the caller knows them, and built in Lua by the functions
``genq.common.lua.key_names`` generates from ``keys.py`` where a script finds them (a tenant's
index), so every key still comes from ``keys.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from genq.common import script_calls
from genq.common.connection import is_cluster
from genq.common.keys import GROUP, Keys
from genq.common.lua.apply import APPLY, Applied
from genq.common.lua.submit import (
    GROUPS_FIELD,
    INVALID_PREFIX,
    MAX_QUEUE_DEPTH_FIELD,
    PRIORITY_DENIED_PREFIX,
    QUEUE_FULL_PREFIX,
    SUBMIT,
    TENANT_FULL_PREFIX,
)
from genq.common.webhooks import batch_owner_key

__all__ = [
    "APPLY",
    "GROUPS_FIELD",
    "INVALID_PREFIX",
    "MAX_QUEUE_DEPTH_FIELD",
    "PRIORITY_DENIED_PREFIX",
    "QUEUE_FULL_PREFIX",
    "SUBMIT",
    "TENANT_FULL_PREFIX",
    "Applied",
    "ApplyItem",
    "apply",
    "apply_args",
]


ApplyItem = tuple[str, str | None, str, str]
"""(request id, work stream or None, entry id, state JSON) of one request in an APPLY call."""


def apply_args(
    keys: Keys,
    ttl_s: int,
    mode: str,
    items: Sequence[ApplyItem],
    max_attempts: int = 0,
    token: str = "",
    *,
    acknowledge: bool = True,
    unstarted: Sequence[bool] = (),
    hooks: bool = True,
    streams: Sequence[str] = (),
) -> tuple[list[str], list[str | int]]:
    """KEYS and ARGV of one APPLY call. The work streams are among its keys only if an item
    has an entry to acknowledge (so a cancel touches only the request's own slot), and the
    script is to acknowledge them (``acknowledge``; on a cluster the caller does).
    ``unstarted`` (per item, 'final' mode): the caller never started this entry (expired,
    malformed), so the script checks that it owns its id; a started one was checked at its
    start. ``hooks``: a response's final state adds its webhook event to the queue's outbox
    (``Keys.webhook_events``); not on a Redis Cluster, where the outbox (the queue's slot) and
    the request (its own) cannot meet in one script. ``streams``: the work streams of every lane
    the items' entries are in (``keys.Lanes``); default: ``keys``' lane's."""
    hooks = hooks and mode != "running"
    streams = list(streams) or keys.streams()
    ack = acknowledge and any(stream for _, stream, _, _ in items)
    script_keys: list[str] = list(streams) if ack else []
    args: list[str | int] = [GROUP, ttl_s, mode, max_attempts, len(script_keys), token, int(hooks)]
    flags = list(unstarted) or [False] * len(items)
    for (request_id, stream, entry_id, state), check in zip(items, flags, strict=True):
        result, events, attempts, response = keys.request_keys(request_id)
        if hooks and '"batch":"' in state:  # cheap: most requests are no batch line
            response = batch_owner_key(keys, request_id, state) or response
        script_keys += [result, events, attempts, response]
        number = streams.index(stream) + 1 if stream else 0
        args += [-number if check else number, entry_id, state]
    if hooks:
        script_keys.append(keys.webhook_events)
    return script_keys, args


def apply(
    r: Any,
    keys: Keys,
    ttl_s: int,
    mode: str,
    items: Sequence[ApplyItem],
    max_attempts: int = 0,
    pipe: Any = None,
    token: str = "",
    unstarted: Sequence[bool] = (),
    streams: Sequence[str] = (),
) -> list[int]:
    """Run APPLY over ``items`` and return its answer per item; ``pipe``: a pipeline of ``r``
    with the caller's own commands queued already, run in the same round trip (before APPLY's
    calls). On one Redis this is one atomic script call. On a Redis Cluster a
    request's keys and the queue's streams live in different slots, so each request gets its
    own call (atomic for that request) and the entries are acknowledged in a second round trip
    *after* their states are written: a crash in between leaves an entry that is redelivered,
    which APPLY answers 0 (already final) and acknowledges then."""
    pipe = r.pipeline(transaction=False) if pipe is None else pipe
    first, cluster = len(pipe), is_cluster(r)
    if cluster:  # (one call a request: its keys and the streams' are in different slots)
        flags = list(unstarted) or [False] * len(items)
        one: dict[str, Any] = {"acknowledge": False, "hooks": False, "streams": streams}
        calls = [
            apply_args(keys, ttl_s, mode, [item], max_attempts, token, unstarted=[f], **one)
            for item, f in zip(items, flags, strict=True)
        ]
    else:
        calls = [
            apply_args(
                keys, ttl_s, mode, items, max_attempts, token, unstarted=unstarted, streams=streams
            )
        ]
    for script_keys, args in calls:
        script_calls.add(pipe, APPLY, len(script_keys), *script_keys, *args)
    replies = script_calls.execute(pipe)[first:]
    if not cluster:
        return list(replies[0])
    written = [int(x[0]) for x in replies[: len(calls)]]
    _acknowledge(r, items, written, mode)
    return written


def _acknowledge(r: Any, items: Sequence[ApplyItem], written: Sequence[int], mode: str) -> None:
    """Redis Cluster: XACK and XDEL the entries APPLY would have (already final, or just
    written final), a stream's at a time, in one round trip."""
    done: dict[str, list[str]] = {}
    for (_, stream, entry_id, _), w in zip(items, written, strict=True):
        done_here = w in (Applied.ALREADY_FINAL, Applied.DUPLICATE)
        if stream and (done_here or (w == Applied.WRITTEN and mode == "final")):
            done.setdefault(stream, []).append(entry_id)
    if done:
        pipe = r.pipeline(transaction=False)
        for stream, entry_ids in done.items():
            pipe.xack(stream, GROUP, *entry_ids)
            pipe.xdel(stream, *entry_ids)
        pipe.execute()
