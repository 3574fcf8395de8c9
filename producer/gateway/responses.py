"""OpenAI's Responses API (``/v1/responses``) in genq's terms. Pure: no Redis (the gateway's
``responses_routes.py`` stores the records and submits the requests).

A response is one genq request plus a **record** (``ResponseRecord``): what was asked (the
input items, instructions, options) and the conversation before it. Its id is ``resp_`` + the
request's id, its output message's ``msg_`` + the same, and its status is read from the
request's state each time it is asked for, so a response needs no gateway to become final:

    queued -> queued      running -> in_progress      cancelled -> cancelled
    succeeded -> completed, or incomplete (``max_output_tokens`` reached: finish "length")
    failed, expired -> failed (``error.code`` invalid_prompt for a request's own fault,
                                server_error otherwise; genq's code leads the message)

Create fields: ``model``, ``input`` (a string, or a list of messages: roles user, system,
developer and assistant; content a string or ``input_text``/``output_text`` parts),
``instructions`` (a system message for this response only, as OpenAI's), ``max_output_tokens``,
``temperature``, ``top_p``, ``metadata``, ``text.format`` (``text``, ``json_object``,
``json_schema``: constrained decoding, as ``response_format`` on chat), ``stream``,
``background``, ``store``, ``previous_response_id`` (that response's context, input and output
come first). genq's own ``priority``, ``deadline_in_s`` and ``top_k`` ride along; ``user`` and
``parallel_tool_calls`` (true or false: genq makes at most one call per choice) and the neutral
values of ``truncation``, ``include``, ``service_tier``, ``tools`` and ``tool_choice`` pass;
anything else is a 400 naming it (tools on this door are not built yet: /v1/chat/completions
has them).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from genq.common.errors import INPUT_ERRORS, InvalidRequest
from genq.common.models import Result, Usage
from genq.producer.gateway.batch_lines import check_parallel_tool_calls
from pydantic import BaseModel, ConfigDict, Field

RESPONSE_PREFIX = "resp_"
MESSAGE_PREFIX = "msg_"
INPUT_ROLES = ("user", "system", "developer", "assistant")
"""Roles an input message may have (``developer`` is a system message to the chat template)."""
_PASSING: dict[str, Any] = {
    "truncation": "disabled",
    "include": [],
    "service_tier": "auto",
    "tools": [],
    "tool_choice": "auto",
    "stream_options": None,
}
"""Fields accepted at the value that changes nothing."""
_GENQ_OPTIONS = ("priority", "deadline_in_s", "top_k", "prompt_cache_key")

Status = Literal["queued", "in_progress", "completed", "incomplete", "failed", "cancelled"]
FINAL: frozenset[str] = frozenset({"completed", "incomplete", "failed", "cancelled"})


class ResponseRecord(BaseModel):
    """What genq keeps of a response beside its request's state (JSON in Redis)."""

    model_config = ConfigDict(extra="ignore")

    id: str
    request_id: str
    created_at: int
    model: str
    tenant: str
    queue: str | None = None
    """The queue it was created on (None: a record from before queues were checked)."""
    background: bool = False
    instructions: str | None = None
    input_items: list[dict[str, Any]] = Field(default_factory=list)
    """This response's input as OpenAI's input message items (with ids)."""
    context: list[dict[str, Any]] = Field(default_factory=list)
    """The chat messages before this input: the previous responses' inputs and outputs."""
    metadata: dict[str, str] | None = None
    temperature: float | None = None
    top_p: float | None = None
    max_output_tokens: int | None = None
    text_format: dict[str, Any] = Field(default_factory=lambda: {"type": "text"})
    previous_response_id: str | None = None
    prompt_cache_key: str | None = None
    """Its own, or inherited from the response it continues."""


class CreateArgs(BaseModel):
    """A create body, checked: the request's options and what the record keeps."""

    model: str | None
    input_items: list[dict[str, Any]]
    instructions: str | None
    stream: bool
    background: bool
    store: bool
    previous_response_id: str | None
    metadata: dict[str, str] | None
    text_format: dict[str, Any]
    options: dict[str, Any]
    """``build_request`` arguments other than the messages."""


def request_id_of(response_id: str) -> str | None:
    """The request id inside a response id (None: not one of genq's)."""
    if not response_id.startswith(RESPONSE_PREFIX) or len(response_id) <= len(RESPONSE_PREFIX):
        return None
    return response_id[len(RESPONSE_PREFIX) :]


def parse_create(body: Mapping[str, Any], request_id: str = "") -> CreateArgs:
    """A ``POST /v1/responses`` body, checked (InvalidRequest says what is wrong); its input
    items without an id of their own get ``msg_REQUESTID_N``."""
    body = dict(body)
    for key, neutral in _PASSING.items():
        if key in body and body[key] in (neutral, None):
            del body[key]
    body.pop("user", None)
    check_parallel_tool_calls(body.pop("parallel_tool_calls", None))
    model = body.pop("model", None)
    if model is not None and not isinstance(model, str):
        raise InvalidRequest("'model' must be a string")
    instructions = body.pop("instructions", None)
    if instructions is not None and not isinstance(instructions, str):
        raise InvalidRequest("'instructions' must be a string")
    items = input_items(body.pop("input", None), request_id)
    stream, background = bool(body.pop("stream", False)), bool(body.pop("background", False))
    store = body.pop("store", True) is not False
    if background and not store:
        raise InvalidRequest("a background response must be stored: leave 'store' true")
    previous = body.pop("previous_response_id", None)
    if previous is not None and (not isinstance(previous, str) or request_id_of(previous) is None):
        raise InvalidRequest(f"'previous_response_id' {previous!r} is not a response id")
    metadata = body.pop("metadata", None)
    if metadata is not None and not (
        isinstance(metadata, dict) and all(isinstance(v, str) for v in metadata.values())
    ):
        raise InvalidRequest("'metadata' must be an object of strings")
    text = body.pop("text", None) or {}
    if not isinstance(text, dict) or set(text) - {"format", "verbosity"}:
        raise InvalidRequest("'text' takes 'format' (text, json_object or json_schema)")
    text_format = text.get("format") or {"type": "text"}
    options: dict[str, Any] = {}
    response_format = response_format_of(text_format)
    if response_format is not None:
        options["response_format"] = response_format
    for ours, theirs in (("max_new_tokens", "max_output_tokens"), ("temperature",) * 2):
        if body.get(theirs) is not None:
            options[ours] = body.pop(theirs)
    for key in ("top_p", *_GENQ_OPTIONS):
        if body.get(key) is not None:
            options[key] = body.pop(key)
    left = sorted(k for k, v in body.items() if v is not None)
    if left:
        raise InvalidRequest(f"unsupported body fields {left} on /v1/responses")
    return CreateArgs(
        model=model,
        input_items=items,
        instructions=instructions,
        stream=stream,
        background=background,
        store=store,
        previous_response_id=previous,
        metadata=metadata,
        text_format=text_format,
        options=options,
    )


def input_items(value: Any, request_id: str = "") -> list[dict[str, Any]]:
    """``input`` as OpenAI's input message items (ids added where missing)."""
    if isinstance(value, str):
        value = [{"role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise InvalidRequest("'input' must be a string or a non-empty list of messages")
    return [_input_item(i, m, request_id) for i, m in enumerate(value)]


def _input_item(index: int, m: Any, request_id: str) -> dict[str, Any]:
    if not isinstance(m, dict) or m.get("type", "message") != "message":
        kind = m.get("type") if isinstance(m, dict) else type(m).__name__
        raise InvalidRequest(f"input item {index}: only messages are supported, not {kind!r}")
    role = m.get("role")
    if role not in INPUT_ROLES:
        raise InvalidRequest(f"input item {index}: 'role' must be one of {list(INPUT_ROLES)}")
    content = m.get("content")
    if isinstance(content, str):
        text = content
    elif isinstance(content, list):
        parts = [p for p in content if isinstance(p, dict)]
        kinds = {p.get("type") for p in parts}
        if len(parts) != len(content) or not kinds <= {"input_text", "output_text"}:
            raise InvalidRequest(f"input item {index}: only text content is supported")
        texts = [p.get("text") for p in parts]
        if not all(isinstance(t, str) for t in texts):
            raise InvalidRequest(f"input item {index}: each text part's 'text' must be a string")
        text = "".join(str(t) for t in texts)
    else:
        raise InvalidRequest(f"input item {index}: 'content' must be a string or a list of parts")
    part = "output_text" if role == "assistant" else "input_text"
    out_part: dict[str, Any] = {"type": part, "text": text}
    if role == "assistant":
        out_part["annotations"] = []
    item_id = m.get("id") if isinstance(m.get("id"), str) else None
    return {
        "id": item_id or f"{MESSAGE_PREFIX}{request_id or 'in'}_{index}",
        "type": "message",
        "role": role,
        "status": "completed",
        "content": [out_part],
    }


def response_format_of(fmt: Any) -> dict[str, Any] | None:
    """``text.format`` as genq's ``response_format`` (None: free text)."""
    if not isinstance(fmt, dict):
        raise InvalidRequest("'text.format' must be an object with a 'type'")
    kind = fmt.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema":
        schema = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
        return {"type": "json_schema", "json_schema": schema}
    raise InvalidRequest(
        f"'text.format' type {kind!r} is not one of 'text', 'json_object', 'json_schema'"
    )


def messages_of(item: Mapping[str, Any]) -> dict[str, Any]:
    """An input item as a chat message (``developer`` speaks as ``system``)."""
    role = "system" if item["role"] == "developer" else item["role"]
    return {"role": role, "content": "".join(p["text"] for p in item["content"])}


def conversation(
    instructions: str | None, context: list[dict[str, Any]], items: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """The chat messages a response's request generates from."""
    head = [] if instructions is None else [{"role": "system", "content": instructions}]
    return [*head, *context, *(messages_of(i) for i in items)]


def context_after(previous: ResponseRecord, result: Result) -> list[dict[str, Any]]:
    """The context a response continuing ``previous`` starts with: its context, input and
    output (its instructions are its own, as OpenAI's)."""
    if status_of(result) not in ("completed", "incomplete"):
        raise InvalidRequest(
            f"previous response {previous.id} is {status_of(result)}: only a completed one "
            "can be continued"
        )
    said = [messages_of(i) for i in previous.input_items]
    return [*previous.context, *said, {"role": "assistant", "content": result.text or ""}]


def status_of(result: Result | None) -> Status:
    """A response's status, from its request's state (None: not written yet, queued)."""
    if result is None or result.status == "queued":
        return "queued"
    if result.status == "running":
        return "in_progress"
    if result.status == "succeeded":
        return "incomplete" if result.finish_reason == "length" else "completed"
    if result.status == "cancelled":
        return "cancelled"
    return "failed"


def output_message(record: ResponseRecord, text: str, status: str) -> dict[str, Any]:
    """The response's output message item."""
    part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
    return {
        "id": MESSAGE_PREFIX + record.request_id,
        "type": "message",
        "role": "assistant",
        "status": status,
        "content": [part] if text or status != "in_progress" else [],
    }


def response_object(record: ResponseRecord, result: Result | None) -> dict[str, Any]:
    """OpenAI's Response object of a record and its request's state."""
    status = status_of(result)
    done = result is not None and result.status == "succeeded"
    output = [output_message(record, result.text or "", "completed")] if done and result else []
    return {
        "id": record.id,
        "object": "response",
        "created_at": record.created_at,
        "status": status,
        "background": record.background,
        "model": (result.model if result is not None and result.model else record.model),
        "output": output,
        "error": _error(result) if status == "failed" and result is not None else None,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "instructions": record.instructions,
        "metadata": record.metadata or {},
        "temperature": record.temperature,
        "top_p": record.top_p,
        "max_output_tokens": record.max_output_tokens,
        "previous_response_id": record.previous_response_id,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "text": {"format": record.text_format},
        "truncation": "disabled",
        "usage": _usage(result.usage) if done and result else None,
        "completed_at": _finished_s(result) if status in FINAL else None,
    }


def _finished_s(result: Result | None) -> int | None:
    ms = None if result is None else result.timings.finished_unix_ms
    return None if ms is None else ms // 1000


def _error(result: Result) -> dict[str, str]:
    err = result.error
    code = err.code if err else result.status
    message = err.message if err else f"the request ended {result.status}"
    ours = "invalid_prompt" if code in INPUT_ERRORS else "server_error"
    return {"code": ours, "message": f"{code}: {message}"}


def _usage(usage: Usage) -> dict[str, Any]:
    return {
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {"cached_tokens": usage.cached_tokens, "cache_write_tokens": 0},
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
    }


def items_page(
    items: list[dict[str, Any]], *, order: str, limit: int, after: str | None
) -> dict[str, Any]:
    """``GET /v1/responses/{id}/input_items``: OpenAI's list page (``order`` asc or desc)."""
    if order not in ("asc", "desc"):
        raise InvalidRequest("'order' is 'asc' or 'desc'")
    if not 1 <= limit <= 100:
        raise InvalidRequest("'limit' is 1-100")
    ordered = items if order == "asc" else items[::-1]
    if after is not None:
        ids = [i["id"] for i in ordered]
        if after not in ids:
            raise InvalidRequest(f"'after' {after!r} is not an item of this response")
        ordered = ordered[ids.index(after) + 1 :]
    page = ordered[:limit]
    return {
        "object": "list",
        "data": page,
        "first_id": page[0]["id"] if page else None,
        "last_id": page[-1]["id"] if page else None,
        "has_more": len(ordered) > limit,
    }
