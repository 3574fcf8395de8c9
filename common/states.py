"""The result document: every state genq writes at a request's result key (and in its final
event) is built here, and nowhere else.

A state is a ``Result`` as JSON. Clients parse it with the strict ``Result`` model, so every
end-to-end test checks the shape built here. The builders write the JSON directly (orjson over
plain dicts): building pydantic models cost more than the rest of the worker's per-request work.

Every state starts with ``{"id":"...","status":"..."``: the Lua scripts and the client read the
status there without decoding the whole document (``status_of``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import orjson
from genq.common.models import DEFAULT_TENANT, FINAL_STATUSES, Result

Metadata = Mapping[str, Any]

_STATUS = re.compile(rb'^\{"id":"[^"]*","status":"([a-z]+)"')


def queued(
    *, request_id: str, priority: str, metadata: Metadata, tenant: str = DEFAULT_TENANT
) -> str:
    """The state the submit script writes: waiting for a worker."""
    return orjson.dumps(
        {
            "id": request_id,
            "status": "queued",
            "priority": priority,
            "tenant": tenant,
            "metadata": metadata,
        }
    ).decode()


def with_entry(queued_state: str, entry: str) -> str:
    """A ``queued`` state naming the work entry that owns the id (``PRIORITY/ENTRY_ID``),
    right after its status, as the submit script writes it (on a Redis Cluster the client
    writes the state, and does this)."""
    head = queued_state[: queued_state.index('"status":"queued"') + len('"status":"queued"')]
    return f'{head},"entry":"{entry}"{queued_state[len(head) :]}'


def running(
    *,
    request_id: str,
    priority: str,
    tenant: str,
    metadata: Metadata,
    queued_ms: int,
    started_ms: int,
    worker: str,
) -> str:
    """The state a worker writes when it starts the request."""
    return orjson.dumps(
        {
            "id": request_id,
            "status": "running",
            "priority": priority,
            "tenant": tenant,
            "timings": {"queued_unix_ms": queued_ms, "started_unix_ms": started_ms},
            "worker": worker,
            "metadata": metadata,
        }
    ).decode()


def succeeded(
    request_id: str,
    priority: str,
    tenant: str,
    metadata: Metadata,
    text: str,
    finish_reason: str,
    *,
    prompt_tokens: int,
    completion_tokens: int,
    cached_tokens: int = 0,
    queued_ms: int,
    started_ms: int,
    finished_ms: int,
    generation_ms: int,
    worker: str,
    model: str,
    batch_size: int,
    logprobs: list[dict[str, Any]] | None = None,
    choices: list[dict[str, Any]] | None = None,
    tool_calls: list[dict[str, Any]] | None = None,
    embeddings: list[str] | None = None,
) -> str:
    """The final state of a request that generated its text (``logprobs``: asked for;
    ``choices``: all of them, for ``n`` > 1), or its vectors (``embeddings``, packed). The
    first six may come by position: CPython 3.11 takes a slower path for a call of 16
    keywords or more (the worker's: 0.4 µs less)."""
    state: dict[str, Any] = {
        "id": request_id,
        "status": "succeeded",
        "priority": priority,
        "tenant": tenant,
        "text": text,
        "finish_reason": finish_reason,
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "cached_tokens": cached_tokens,
        },
        "timings": {
            "queued_unix_ms": queued_ms,
            "started_unix_ms": started_ms,
            "finished_unix_ms": finished_ms,
            "queue_wait_ms": max(0, started_ms - queued_ms),
            "generation_ms": generation_ms,
        },
        "worker": worker,
        "model": model,
        "batch_size": batch_size,
        "metadata": metadata,
    }
    # After id and status: every state starts with them (``status_of`` reads them there).
    if logprobs is not None:
        state["logprobs"] = logprobs
    if choices is not None:
        state["choices"] = choices
    if tool_calls is not None:
        state["tool_calls"] = tool_calls
    if embeddings is not None:
        state["embeddings"] = embeddings
    return orjson.dumps(state).decode()


def ended(
    *,
    request_id: str,
    status: str,
    priority: str,
    tenant: str,
    metadata: Metadata,
    code: str,
    message: str,
    queued_ms: int | None,
    started_ms: int | None,
    finished_ms: int,
    worker: str,
) -> str:
    """The final state of a request that did not generate: failed, expired or cancelled, with
    an error a person can act on."""
    wait_ms = None if started_ms is None or queued_ms is None else max(0, started_ms - queued_ms)
    return orjson.dumps(
        {
            "id": request_id,
            "status": status,
            "priority": priority,
            "tenant": tenant,
            "error": {"code": code, "message": message},
            "timings": {
                "queued_unix_ms": queued_ms,
                "started_unix_ms": started_ms,
                "finished_unix_ms": finished_ms,
                "queue_wait_ms": wait_ms,
            },
            "worker": worker,
            "metadata": metadata,
        }
    ).decode()


def cancelled(current: Result, *, finished_ms: int) -> str:
    """The state a client's cancel writes over ``current`` (queued or running): what the
    request had, now ``cancelled``."""
    doc = current.model_dump(mode="json")
    doc.pop("entry", None)  # a queued state's owner: not part of a final state
    doc.update(status="cancelled", error={"code": "cancelled", "message": "cancelled by a client"})
    doc["timings"]["finished_unix_ms"] = finished_ms
    return orjson.dumps(doc).decode()


def status_of(raw: bytes | str) -> str | None:
    """The ``status`` of a stored state, read without validating the rest (None if it has none):
    most states a waiting client finds are not final, and only final ones are decoded in full."""
    data = raw.encode() if isinstance(raw, str) else raw
    m = _STATUS.match(data)
    if m is not None:
        return m.group(1).decode()
    try:  # a state in another layout (written by hand, another client)
        doc = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    status = doc.get("status") if isinstance(doc, dict) else None
    return status if isinstance(status, str) else None


def is_final(raw: bytes | str | None) -> bool:
    """Whether a stored state is final (None: no state)."""
    return raw is not None and status_of(raw) in FINAL_STATUSES
