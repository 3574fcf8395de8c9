"""Batch files the way users already have them: OpenAI Batch API JSON Lines in, OpenAI-style
output lines (keyed by ``custom_id``) out. Used by ``genq batch submit | status | results |
cancel``; needs no torch.

Input line: ``{"custom_id": "...", "method": "POST", "url": "/v1/completions" or
"/v1/chat/completions", "body": {...}}``. Body fields understood: ``prompt`` (completions) or
``messages`` (chat), ``max_tokens`` / ``max_completion_tokens``, ``temperature``, ``top_p``,
``seed``, ``stop``; ``model``, ``user``, ``n`` = 1 and ``stream`` = false are accepted and
ignored; anything else is an error for that line (it would change the output, and silently
ignoring it would mislead). Every line becomes one request with id ``BATCH-LINE``, so submitting
the same file again under the same batch id enqueues nothing twice.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from genq.common.errors import InvalidRequest, RequestNotFound
from genq.common.models import FINAL_STATUSES, Request, Result
from genq.producer.building import build_request
from genq.producer.client import Client
from genq.producer.files import LineError
from genq.producer.submitting import SUBMIT_CHUNK
from genq.producer.waiting import parse_stored

ENDPOINTS = {"/v1/completions": "text_completion", "/v1/chat/completions": "chat.completion"}
_IGNORED = {"model", "user"}


@dataclass(frozen=True, kw_only=True)
class BatchLine:
    """One valid input line."""

    line: int
    custom_id: str
    url: str
    request: Request


def new_batch_id() -> str:
    """A fresh batch id (usable in request ids and key names)."""
    return "batch_" + uuid.uuid4().hex[:20]


def parse_line(n: int, text: str, batch_id: str, priority: str = "normal") -> BatchLine:
    """Line ``n`` of an OpenAI batch file as a request; raise InvalidRequest saying why not."""
    try:
        item = json.loads(text)
    except ValueError as err:
        raise InvalidRequest(f"not valid JSON: {err}") from None
    if not isinstance(item, dict):
        raise InvalidRequest("a line must be a JSON object")
    custom_id, url, body = item.get("custom_id"), item.get("url"), item.get("body")
    if not isinstance(custom_id, str) or not custom_id:
        raise InvalidRequest("'custom_id' must be a non-empty string")
    if item.get("method", "POST") != "POST":
        raise InvalidRequest("'method' must be POST")
    if url not in ENDPOINTS:
        raise InvalidRequest(f"'url' must be one of {sorted(ENDPOINTS)}, got {url!r}")
    if not isinstance(body, dict):
        raise InvalidRequest("'body' must be a JSON object")
    body = dict(body)
    if body.pop("n", 1) != 1:
        raise InvalidRequest("only n = 1 is supported")
    if body.pop("stream", False):
        raise InvalidRequest("stream = true is not supported in a batch")
    for key in _IGNORED:
        body.pop(key, None)
    args: dict[str, Any] = {}
    if url == "/v1/completions":
        prompt = body.pop("prompt", None)
        if not isinstance(prompt, str):
            raise InvalidRequest("a /v1/completions body needs 'prompt' as one string")
        args["prompt"] = prompt
    else:
        args["messages"] = body.pop("messages", None)
        if not isinstance(args["messages"], list):
            raise InvalidRequest("a /v1/chat/completions body needs 'messages' as a list")
        args["messages"] = [_text_message(m) for m in args["messages"]]
    max_tokens = body.pop("max_completion_tokens", body.pop("max_tokens", None))
    if max_tokens is not None:
        args["max_new_tokens"] = max_tokens
    for key in ("temperature", "top_p", "seed", "stop"):
        if key in body:
            args[key] = body.pop(key)
    if body:
        raise InvalidRequest(f"unsupported body fields {sorted(body)}")
    request = build_request(
        **args,
        priority=priority,
        request_id=f"{batch_id}-{n}",
        metadata={"custom_id": custom_id, "batch": batch_id},
    )
    return BatchLine(line=n, custom_id=custom_id, url=url, request=request)


def _text_message(m: Any) -> dict[str, Any]:
    if not isinstance(m, dict):
        raise InvalidRequest("each message must be an object with 'role' and 'content'")
    content = m.get("content")
    if isinstance(content, list):  # OpenAI's content parts: text parts only
        texts = [p.get("text") for p in content if isinstance(p, dict) and p.get("type") == "text"]
        if len(texts) != len(content):
            raise InvalidRequest("only text message content is supported")
        content = "".join(t or "" for t in texts)
    return {"role": m.get("role"), "content": content}


def parse_file(
    lines: Iterable[str], batch_id: str, priority: str = "normal"
) -> tuple[list[BatchLine], list[LineError]]:
    """Every line of a batch file: the valid ones, and each invalid one with its number."""
    good: list[BatchLine] = []
    bad: list[LineError] = []
    seen: set[str] = set()
    for n, text in enumerate(lines, start=1):
        if not text.strip():
            continue
        try:
            item = parse_line(n, text, batch_id, priority)
            if item.custom_id in seen:
                raise InvalidRequest(f"custom_id {item.custom_id!r} appears twice")
            seen.add(item.custom_id)
            good.append(item)
        except InvalidRequest as err:
            bad.append(LineError(line=n, message=str(err)))
    return good, bad


def record_batch(client: Client, batch_id: str, items: list[BatchLine], source: str) -> None:
    """Remember the batch (its request ids, in input order, and when it was made)."""
    keys = client.keys
    pipe = client.redis.pipeline(transaction=True)
    pipe.delete(keys.batch_items(batch_id))
    for start in range(0, len(items), SUBMIT_CHUNK):
        ids = [f"{i.request.id} {i.url}" for i in items[start : start + SUBMIT_CHUNK]]
        pipe.rpush(keys.batch_items(batch_id), *ids)
    pipe.hset(
        keys.batch(batch_id),
        mapping={
            "queue": keys.queue,
            "created_at": int(time.time()),
            "total": len(items),
            "input": source,
            "cancelled": 0,
        },
    )
    pipe.expire(keys.batch(batch_id), client.result_ttl_s)
    pipe.expire(keys.batch_items(batch_id), client.result_ttl_s)
    pipe.execute()


def batch_items(client: Client, batch_id: str) -> list[tuple[str, str]]:
    """(request id, endpoint) of every request of the batch, in input order."""
    raw: Any = client.redis.lrange(client.keys.batch_items(batch_id), 0, -1)
    if not raw and not client.redis.exists(client.keys.batch(batch_id)):
        raise RequestNotFound(f"no batch {batch_id!r} (never submitted, or expired)")
    out = []
    for r in raw:
        rid, url = (r.decode() if isinstance(r, bytes) else r).split(" ", 1)
        out.append((rid, url))
    return out


def _states(client: Client, ids: list[str]) -> list[Result | None]:
    out: list[Result | None] = []
    for start in range(0, len(ids), SUBMIT_CHUNK):
        raws: Any = client.redis.mget(
            [client.keys.result(i) for i in ids[start : start + SUBMIT_CHUNK]]
        )
        out += [parse_stored(r) for r in raws]
    return out


def batch_status(client: Client, batch_id: str) -> dict[str, Any]:
    """OpenAI-style status: ``status`` and ``request_counts`` (total, completed, failed)."""
    items = batch_items(client, batch_id)
    info: Any = client.redis.hgetall(client.keys.batch(batch_id))
    meta = {k.decode(): v.decode() for k, v in info.items()}
    states = _states(client, [rid for rid, _ in items])
    completed = sum(1 for s in states if s is not None and s.status == "succeeded")
    failed = sum(1 for s in states if s is not None and s.status in FINAL_STATUSES) - completed
    finished = completed + failed == len(items)
    cancelled = meta.get("cancelled") == "1"
    status = (
        ("cancelled" if cancelled else "completed")
        if finished
        else ("cancelling" if cancelled else "in_progress")
    )
    return {
        "id": batch_id,
        "object": "batch",
        "status": status,
        "queue": meta.get("queue"),
        "input_file": meta.get("input"),
        "created_at": int(meta.get("created_at", 0)),
        "request_counts": {"total": len(items), "completed": completed, "failed": failed},
    }


def cancel_batch(client: Client, batch_id: str) -> int:
    """Cancel every request of the batch that is not final yet; return how many."""
    items = batch_items(client, batch_id)
    client.redis.hset(client.keys.batch(batch_id), "cancelled", 1)
    n = 0
    for (rid, _), state in zip(items, _states(client, [r for r, _ in items]), strict=True):
        if state is not None and not state.is_final and client.cancel(rid):
            n += 1
    return n


def output_lines(
    client: Client, batch_id: str, timeout_s: float | None = None
) -> Iterator[tuple[bool, dict[str, Any]]]:
    """(succeeded?, OpenAI-style output line) per request, in input order, waiting for each
    to be final (up to ``timeout_s``)."""
    items = batch_items(client, batch_id)
    for start in range(0, len(items), SUBMIT_CHUNK):
        part = items[start : start + SUBMIT_CHUNK]
        results = client.results([rid for rid, _ in part], timeout=timeout_s)
        for (rid, url), res in zip(part, results, strict=True):
            yield res.status == "succeeded", _output(rid, url, res)


def _output(rid: str, url: str, res: Result) -> dict[str, Any]:
    custom_id = res.metadata.get("custom_id")
    line: dict[str, Any] = {"id": f"batch_req_{rid}", "custom_id": custom_id}
    if res.status != "succeeded":
        err = res.error
        line["response"] = None
        line["error"] = {
            "code": err.code if err else res.status,
            "message": err.message if err else res.status,
        }
        return line
    usage = {
        "prompt_tokens": res.usage.prompt_tokens,
        "completion_tokens": res.usage.completion_tokens,
        "total_tokens": res.usage.prompt_tokens + res.usage.completion_tokens,
    }
    created = (res.timings.finished_unix_ms or 0) // 1000
    choice: dict[str, Any] = {"index": 0, "finish_reason": res.finish_reason}
    if ENDPOINTS[url] == "chat.completion":
        choice["message"] = {"role": "assistant", "content": res.text}
    else:
        choice["text"] = res.text
    body = {
        "id": rid,
        "object": ENDPOINTS[url],
        "created": created,
        "model": res.worker,
        "choices": [choice],
        "usage": usage,
    }
    line["response"] = {"status_code": 200, "request_id": rid, "body": body}
    line["error"] = None
    return line
