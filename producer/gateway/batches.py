"""Batches in Redis: OpenAI Batch API files submitted as one request per line, their status as
OpenAI's Batch object, cancelling, and their output and error files. Used by ``genq batch`` and
by the HTTP gateway's ``/v1/batches``; needs no torch. The lines themselves: ``batch_lines.py``.

A batch is a record (``Keys.batch``), its request ids in input order (``Keys.batch_items``) and
the input lines refused at submission (``Keys.batch_rejected``: they appear in the error file
and count as failed). Its status is computed from its requests' states each time it is read:
nothing has to run for a batch to finish.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from genq.common.batch_counts import usage_object
from genq.common.connection import is_cluster
from genq.common.errors import InvalidRequest, RequestNotFound, ResultTimeout, SubmitFailed
from genq.common.models import DEFAULT_TENANT, Result, tenant_problem
from genq.common.wire import as_text
from genq.producer.client import Client
from genq.producer.gateway import batch_waves
from genq.producer.gateway.batch_lines import (
    BatchLine,
    RejectedLine,
    output_line,
    parse_file,
    rejected_output,
)
from genq.producer.gateway.batch_views import REFUSED_KEPT, BatchView, no_batch, read_batch
from genq.producer.submitting import SUBMIT_CHUNK

COMPLETION_WINDOW = "24h"
"""The only completion window OpenAI offers; genq runs a batch as its queue allows."""
WAIT_ROUND_S = 2.0
"""How long one round of waiting for a batch lasts before progress is reported again."""
REFUSED_MESSAGE_CHARS = 300
"""How much of a refused line's message is kept."""


def output_file_id(batch_id: str) -> str:
    """The id of a batch's output file (its succeeded requests, rendered when read)."""
    return f"{batch_id}-output"


def error_file_id(batch_id: str) -> str:
    """The id of a batch's error file (failed, expired, cancelled and refused lines)."""
    return f"{batch_id}-errors"


@dataclass(frozen=True, kw_only=True)
class SubmittedBatch:
    """What ``submit_batch`` did: the batch id, how many lines were enqueued, and the lines
    refused (invalid, or not enqueued because the queue was full)."""

    id: str
    submitted: int
    rejected: list[RejectedLine] = field(default_factory=list)


def submit_batch(
    client: Client,
    lines: Iterable[str],
    *,
    source: str,
    batch_id: str | None = None,
    priority: str = "normal",
    endpoint: str | None = None,
    metadata: Mapping[str, str] | None = None,
    progress: Callable[[int, int], None] | None = None,
    tenant: str = DEFAULT_TENANT,
) -> SubmittedBatch:
    """Parse an OpenAI batch file, record the batch and enqueue its valid lines (in chunks;
    ``progress(done, total)`` after each). ``source`` is the input's name (a file name, or
    the uploaded file's id). If the queue (or Redis) fills up on the way, the lines not enqueued are
    refused with that reason (they appear in the error file): the batch never waits for
    requests that do not exist. Every request, and the batch, belongs to ``tenant``."""
    problem = tenant_problem(tenant)
    if problem is not None:
        raise InvalidRequest(problem)
    bid = batch_id or batch_waves.new_batch_id()
    good, bad = parse_file(lines, bid, priority, endpoint, tenant)
    url = endpoint or (good[0].url if good else "/v1/completions")
    _record(client, bid, good, bad, source=source, endpoint=url, metadata=metadata, tenant=tenant)
    done = 0
    for start in range(0, len(good), SUBMIT_CHUNK):
        part = good[start : start + SUBMIT_CHUNK]
        try:
            client.submit_prepared([item.prepared for item in part])
        except SubmitFailed as err:  # the queue is full, or Redis is
            why = f"not enqueued: {err}"
            rest = [
                RejectedLine(line=i.line, custom_id=i.custom_id, message=why) for i in good[done:]
            ]
            _refuse_rest(client, bid, rest)
            return SubmittedBatch(id=bid, submitted=done, rejected=bad + rest)
        done += len(part)
        if progress is not None:
            progress(done, len(good))
    return SubmittedBatch(id=bid, submitted=done, rejected=bad)


def _record(
    client: Client,
    batch_id: str,
    items: Sequence[BatchLine],
    rejected: Sequence[RejectedLine],
    *,
    source: str,
    endpoint: str,
    metadata: Mapping[str, str] | None,
    tenant: str,
) -> None:
    """Remember the batch: its request ids in input order, refused lines, when it was made."""
    keys, ttl_s = client.keys, client.result_ttl_s
    now = int(time.time())
    pipe = client.redis.pipeline(transaction=True)
    pipe.delete(keys.batch_items(batch_id), keys.batch_rejected(batch_id))
    for start in range(0, len(items), SUBMIT_CHUNK):
        ids = [f"{i.prepared.id} {i.url}" for i in items[start : start + SUBMIT_CHUNK]]
        pipe.rpush(keys.batch_items(batch_id), *ids)
    _keep_refused(pipe, keys.batch_rejected(batch_id), batch_id, rejected, room=REFUSED_KEPT)
    # The requests not yet final: APPLY counts it down, and its last adds the batch's
    # webhook event. Set once: the same batch submitted again enqueues nothing twice.
    pipe.hsetnx(keys.batch(batch_id), "open", len(items))
    pipe.hset(
        keys.batch(batch_id),
        mapping={
            "id": batch_id,
            "queue": keys.queue,
            "tenant": tenant,
            "created_at": now,
            "expires_at": now + ttl_s,
            "total": len(items),
            "input": source,
            "endpoint": endpoint,
            "metadata": json.dumps(dict(metadata or {})),
            "cancelled": 0,
            "refused": len(rejected),
            "counted": 1,  # its requests' ends are counted on it (common/batch_counts.py)
            "model": next((i.model for i in items if i.model), ""),
        },
    )
    for key in (keys.batch(batch_id), keys.batch_items(batch_id), keys.batch_rejected(batch_id)):
        pipe.expire(key, ttl_s)
    pipe.zadd(keys.batches, {batch_id: now})
    if not items and not is_cluster(client.redis):  # nothing to run: it failed as it came
        event = {"type": "batch.failed", "id": batch_id, "tenant": tenant}
        pipe.xadd(keys.webhook_events, event)  # type: ignore[arg-type]
    pipe.execute()


def _keep_refused(
    pipe: Any, key: str, batch_id: str, refused: Sequence[RejectedLine], *, room: int
) -> None:
    """Queue the error-file lines of the first ``room`` refused lines, messages cut short."""
    docs = []
    for bad in refused[: max(0, room)]:
        doc = rejected_output(batch_id, bad)
        doc["error"]["message"] = doc["error"]["message"][:REFUSED_MESSAGE_CHARS]
        docs.append(json.dumps(doc))
    if docs:
        pipe.rpush(key, *docs)


def _refuse_rest(client: Client, batch_id: str, rest: Sequence[RejectedLine]) -> None:
    """The queue filled up: drop the lines not enqueued (the last ones) from the batch's
    items, and record them as refused."""
    keys = client.keys
    total: Any = client.redis.hget(keys.batch(batch_id), "total")
    kept = int(total or 0) - len(rest)
    pipe = client.redis.pipeline(transaction=True)
    pipe.ltrim(keys.batch_items(batch_id), 0, kept - 1)
    pipe.hset(keys.batch(batch_id), "total", kept)
    pipe.hincrby(keys.batch(batch_id), "open", -len(rest))  # never enqueued: never final
    pipe.hincrby(keys.batch(batch_id), "refused", len(rest))
    room = REFUSED_KEPT - int(client.redis.llen(keys.batch_rejected(batch_id)))
    _keep_refused(pipe, keys.batch_rejected(batch_id), batch_id, rest, room=room)
    pipe.expire(keys.batch_rejected(batch_id), client.result_ttl_s)
    left = pipe.execute()[2]
    if left == 0 and not is_cluster(client.redis):  # what was enqueued had all ended: its event
        kind = "batch.completed" if kept else "batch.failed"
        tenant = as_text(client.redis.hget(keys.batch(batch_id), "tenant") or DEFAULT_TENANT)
        event = {"type": kind, "id": batch_id, "tenant": tenant}
        client.redis.xadd(keys.webhook_events, event)  # type: ignore[arg-type]


def batch_status(client: Client, batch_id: str, *, tenant: str | None = None) -> dict[str, Any]:
    """The batch as OpenAI's Batch object (``openai.types.Batch`` validates it), plus genq's
    ``queue``: read from its record's counters, however many lines it has. With ``tenant``:
    only a batch of that tenant (see ``read_batch``)."""
    return status_object(read_batch(client, batch_id, tenant=tenant, states=False))


def status_object(view: BatchView) -> dict[str, Any]:
    """OpenAI's Batch object of a batch read with ``read_batch``."""
    rec = view.record
    created = int(rec.get("created_at", 0))
    cancelled = rec.get("cancelled") == "1"
    expired = rec.get("expired") == "1"
    finished = view.finished
    if not view.lines or (finished and rec.get("failed_reason")):
        status = "failed"
    elif finished:
        status = "expired" if expired else "cancelled" if cancelled else "completed"
    elif expired:
        status = "finalizing"  # what ran is written out; the rest goes to the error file
    else:
        status = "cancelling" if cancelled else "in_progress"
    ended_at = (view.ended_ms or created * 1000) // 1000
    metadata = json.loads(rec.get("metadata") or "{}") or None
    return {
        "id": view.id,
        "object": "batch",
        "endpoint": rec.get("endpoint", "/v1/completions"),
        "errors": _errors(view) if status == "failed" else None,
        "input_file_id": rec.get("input", ""),
        "completion_window": rec.get("completion_window", COMPLETION_WINDOW),
        "status": status,
        "output_file_id": output_file_id(view.id) if finished and view.completed else None,
        "error_file_id": error_file_id(view.id) if finished and view.failed else None,
        "created_at": created,
        "in_progress_at": created if view.lines else None,
        "expires_at": int(rec.get("expires_at", 0)) or None,
        "finalizing_at": ended_at if finished and view.lines else None,
        "completed_at": ended_at if status == "completed" else None,
        "failed_at": (int(rec.get("failed_at", 0)) or created) if status == "failed" else None,
        "expired_at": int(rec.get("expired_at", 0)) or None,
        "cancelling_at": int(rec.get("cancelled_at", 0)) or None,
        "cancelled_at": ended_at if status == "cancelled" else None,
        "request_counts": {
            "total": view.total,
            "completed": view.completed,
            "failed": view.failed,
        },
        "metadata": metadata,
        "model": rec.get("model") or None,
        "usage": usage_object(*view.usage),
        "queue": rec.get("queue"),
    }


def _errors(view: BatchView) -> dict[str, Any]:
    """OpenAI's ``errors`` of a batch that failed: none of its lines could be enqueued, or (a
    wave batch) it could not go on."""
    why = view.record.get("failed_reason")
    if why:
        return {"object": "list", "data": [{"code": "batch_failed", "message": why, "line": None}]}
    data = [
        {"code": "invalid_request", "message": r["error"]["message"], "line": None}
        for r in view.rejected[:100]
    ]
    if not data:
        data = [{"code": "empty_file", "message": "the input file has no lines", "line": None}]
    return {"object": "list", "data": data}


def cancel_batch(client: Client, batch_id: str, *, tenant: str | None = None) -> int:
    """Cancel every request of the batch that is not final yet (a wave batch: and feed no
    more of it); return how many. With ``tenant``: only a batch of that tenant (see
    ``read_batch``)."""
    view = read_batch(client, batch_id, tenant=tenant, states=False)
    if view.waves:
        return batch_waves.cancel(client, batch_id)
    view = read_batch(client, batch_id, tenant=tenant)
    client.redis.hset(
        client.keys.batch(batch_id), mapping={"cancelled": 1, "cancelled_at": int(time.time())}
    )
    n = 0
    for (rid, _), state in zip(view.items, view.states, strict=True):
        if state is not None and not state.is_final:
            with contextlib.suppress(RequestNotFound):  # expired meanwhile: nothing to cancel
                n += client.cancel(rid)
    return n


def output_files(view: BatchView) -> tuple[list[dict[str, Any]], list[dict[str, Any]], int]:
    """The output-file lines (succeeded) and error-file lines (the rest, refused lines
    included) of the requests final now, in input order; and how many are not final yet."""
    ok: list[dict[str, Any]] = []
    errors: list[dict[str, Any]] = []
    waiting = 0
    for (rid, url), state in zip(view.items, view.states, strict=True):
        if state is None or not state.is_final:
            waiting += 1
            continue
        (ok if state.status == "succeeded" else errors).append(output_line(rid, url, state))
    unlisted = view.refused - len(view.rejected)
    if unlisted > 0:
        message = (
            f"{unlisted} more input lines were refused at submission; only the first "
            f"{len(view.rejected)} are listed, one by one"
        )
        more = {"code": "invalid_request", "message": message}
        line = {"id": f"batch_req_{view.id}-more", "custom_id": None, "response": None}
        return ok, [*errors, *view.rejected, {**line, "error": more}], waiting
    return ok, errors + view.rejected, waiting


def wait_for_batch(
    client: Client,
    batch_id: str,
    timeout_s: float | None = None,
    progress: Callable[[BatchView], None] | None = None,
) -> BatchView:
    """Wait until every request of the batch is final or ``timeout_s`` passed (reporting
    ``progress`` every round); return the batch as it is then (some may not be final)."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        view = read_batch(client, batch_id)
        if progress is not None:
            progress(view)
        left = None if deadline is None else deadline - time.monotonic()
        if view.finished or (left is not None and left <= 0):
            return view
        pending = [
            rid for (rid, _), s in zip(view.items, view.states, strict=True) if not _final(s)
        ]
        wait_s = WAIT_ROUND_S if left is None else max(0.001, min(WAIT_ROUND_S, left))
        with contextlib.suppress(ResultTimeout):  # a round's wait is over: report, go on
            client.results(pending[:SUBMIT_CHUNK], timeout=wait_s)


def _final(state: Result | None) -> bool:
    return state is not None and state.is_final


def list_batches(
    client: Client, *, after: str | None, limit: int, tenant: str | None = None
) -> tuple[list[str], bool]:
    """The queue's batch ids, newest first, after the batch ``after`` (a page of ``limit``);
    and whether more follow. With ``tenant``, only that tenant's (``after`` another tenant's
    batch: RequestNotFound, as for an unknown one). Batches past their TTL are dropped from the
    index here."""
    r, keys = client.redis, client.keys
    r.zremrangebyscore(keys.batches, "-inf", int(time.time()) - client.result_ttl_s)
    start = 0
    if after is not None:
        rank: Any = r.zrevrank(keys.batches, after)
        owner: Any = r.hget(keys.batch(after), "tenant")
        if rank is None or (tenant is not None and as_text(owner or DEFAULT_TENANT) != tenant):
            raise no_batch(after)
        start = rank + 1
    names: list[str] = []
    page = max(limit + 1, 100)
    while len(names) <= limit:  # a tenant's batches among everyone's: read on until a page fills
        ids: Any = r.zrevrange(keys.batches, start, start + page - 1)
        if not ids:
            break
        start += len(ids)
        batch_ids = [as_text(i) for i in ids]
        if tenant is None:
            names += batch_ids
            continue
        pipe = r.pipeline(transaction=False)
        for b in batch_ids:
            pipe.hget(keys.batch(b), "tenant")
        owners = pipe.execute()
        names += [
            b
            for b, o in zip(batch_ids, owners, strict=True)
            if as_text(o or DEFAULT_TENANT) == tenant
        ]
    return names[:limit], len(names) > limit
