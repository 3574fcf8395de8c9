"""The lines of OpenAI Batch API files: input lines into requests, results into output lines.
Pure: no Redis (``batches.py`` keeps batches in Redis; the HTTP gateway reuses both).

Input line: ``{"custom_id": "...", "method": "POST", "url": "/v1/completions",
"/v1/chat/completions" or "/v1/embeddings", "body": {...}}``. An embeddings body is read as
``POST /v1/embeddings`` reads it (``embedding_bodies.py``), its vectors base64 in the output
line unless the line asks for ``encoding_format: float``. Completion and chat body fields
understood: ``prompt`` (completions) or ``messages`` (chat), ``max_tokens`` /
``max_completion_tokens``, ``temperature``, ``top_p``, ``seed``, ``stop``, ``n`` (1-16
choices), ``frequency_penalty``, ``presence_penalty``, ``logit_bias``, vLLM's ``top_k``,
``min_p``, ``repetition_penalty``, ``min_tokens`` and ``ignore_eos``, structured outputs
(``response_format``, vLLM's ``structured_outputs`` and ``guided_*``:
``structured_outputs.py``), and genq's own ``priority`` and ``deadline_in_s``; ``model`` (the
model or adapter to run the line: only its workers take it), ``user``, and ``stream`` = false
are accepted; anything else is an error for that line (it would change the output, and silently
ignoring it would mislead). Every line becomes one request with id ``BATCH-LINE``, so
submitting the same file again under the same batch id enqueues nothing twice.

Without ``max_tokens``, a completion gets OpenAI's default of 16 tokens; a chat completion gets
genq's default (``DEFAULT_MAX_NEW_TOKENS``), since OpenAI's is "up to the context".
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson
from genq.common.errors import InvalidRequest
from genq.common.models import DEFAULT_TENANT, Result
from genq.producer.building import (
    Prepared,
    PromptTemplate,
    build_embedding,
    build_request,
    prepare,
)
from genq.producer.gateway import embedding_bodies
from genq.producer.gateway.completion_bodies import CHAT, COMPLETIONS, OBJECTS, response_body
from genq.producer.gateway.embedding_bodies import EMBEDDINGS, ENCODING_KEY
from genq.producer.gateway.structured_outputs import FIELDS, response_format_arg

ENDPOINTS = {**OBJECTS, EMBEDDINGS: "list"}
"""The URLs a batch line may name, and each one's response ``object``."""
COMPLETIONS_DEFAULT_MAX_TOKENS = 16
"""OpenAI's default ``max_tokens`` for /v1/completions."""
_SAMPLING = (
    "temperature",
    "top_p",
    "top_k",
    "seed",
    "stop",
    "min_p",
    "frequency_penalty",
    "presence_penalty",
    "repetition_penalty",
    "logit_bias",
    "min_tokens",
    "ignore_eos",
    "priority",
    "deadline_in_s",
    "tools",
    "tool_choice",
    "prompt_cache_key",
)
_NEUTRAL: dict[str, Any] = {
    "echo": False,
    "best_of": 1,
    # vLLM's extras, as its clients (and `vllm bench serve`) send them by default.
    "use_beam_search": False,
    "length_penalty": 1.0,
    "skip_special_tokens": True,
    "spaces_between_special_tokens": True,
    "include_stop_str_in_output": False,
    "stop_token_ids": [],
}
"""Fields genq does not implement, accepted at the value that changes nothing (clients send
them by default); any other value is refused, naming the field."""


@dataclass(frozen=True, kw_only=True)
class BatchLine:
    """One valid input line."""

    line: int
    custom_id: str
    url: str
    prepared: Prepared
    """Its request in the form SUBMIT takes (id ``BATCH-LINE``)."""
    model: str | None = None


@dataclass(frozen=True, kw_only=True)
class RejectedLine:
    """An input line that was not submitted, and why (``custom_id`` if it had one)."""

    line: int
    custom_id: str | None
    message: str


def check_parallel_tool_calls(value: Any) -> None:
    """``parallel_tool_calls`` is accepted either way: genq makes at most one tool call per
    choice, which is what ``false`` asks and what ``true`` allows (LangChain's structured
    output sends ``false``). Anything but a boolean is refused."""
    if value is not None and not isinstance(value, bool):
        raise InvalidRequest("'parallel_tool_calls' must be true or false")


def request_args(url: str, body: Mapping[str, Any]) -> dict[str, Any]:
    """``build_request`` arguments for an OpenAI ``body`` sent to ``url`` (a completion or a
    chat completion); raise InvalidRequest saying what is wrong. Shared by batch lines and the
    HTTP gateway."""
    args: dict[str, Any] = _logprobs_args(url, body)
    response_format = response_format_arg(body)
    if response_format is not None:
        args["response_format"] = response_format
    body = {
        k: v
        for k, v in body.items()
        if v is not None
        and k not in ("logprobs", "top_logprobs", *FIELDS)
        and not (k in _NEUTRAL and v == _NEUTRAL[k])
    }
    n = body.pop("n", 1)
    if n not in (1, None):
        args["n"] = n  # validation names a value out of 1-16
    model = body.pop("model", None)
    if model is not None:
        args["model"] = model  # its lane: only its workers take it (validation names a bad one)
    body.pop("user", None)
    check_parallel_tool_calls(body.pop("parallel_tool_calls", None))
    if url == COMPLETIONS:
        prompt = body.pop("prompt", None)
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if not isinstance(prompt, str):
            raise InvalidRequest("a /v1/completions body needs 'prompt' as one string")
        args["prompt"] = prompt
        max_tokens = body.pop("max_tokens", None)
        args["max_new_tokens"] = (
            COMPLETIONS_DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens
        )
    else:
        messages = body.pop("messages", None)
        if not isinstance(messages, list):
            raise InvalidRequest("a /v1/chat/completions body needs 'messages' as a list")
        args["messages"] = [_text_message(m) for m in messages]
        max_tokens = body.pop("max_completion_tokens", None)
        max_tokens = body.pop("max_tokens", None) if max_tokens is None else max_tokens
        if max_tokens is not None:
            args["max_new_tokens"] = max_tokens
    for key in _SAMPLING:
        value = body.pop(key, None)
        if value is not None:
            args[key] = value
    if body:
        raise InvalidRequest(f"unsupported body fields {sorted(body)}")
    return args


def _logprobs_args(url: str, body: Mapping[str, Any]) -> dict[str, Any]:
    """``logprobs`` and ``top_logprobs`` in genq's terms: a chat's ``logprobs: true`` and
    ``top_logprobs: N``, or a completion's legacy ``logprobs: N`` (0-5: N likeliest a token)."""
    logprobs, top = body.get("logprobs"), body.get("top_logprobs")
    if url == COMPLETIONS:
        if top not in (None, 0):
            raise InvalidRequest("top_logprobs is a chat field; /v1/completions takes logprobs: N")
        if logprobs is None or logprobs is False:
            return {}
        if isinstance(logprobs, bool) or not isinstance(logprobs, int) or not 0 <= logprobs <= 5:
            raise InvalidRequest(f"logprobs on /v1/completions is an integer 0-5, not {logprobs!r}")
        return {"logprobs": True, "top_logprobs": logprobs}
    if logprobs not in (None, False, True):
        raise InvalidRequest(f"logprobs on /v1/chat/completions is true or false, not {logprobs!r}")
    return {"logprobs": bool(logprobs), "top_logprobs": top or 0} if logprobs or top else {}


def parse_line(
    n: int,
    text: str,
    batch_id: str,
    priority: str = "normal",
    endpoint: str | None = None,
    tenant: str = DEFAULT_TENANT,
    templates: dict[str, LineTemplate | None] | None = None,
) -> BatchLine:
    """Line ``n`` of an OpenAI batch file as a request; raise InvalidRequest saying why not.
    With ``endpoint``, a line for another URL is refused (OpenAI: one endpoint per batch).
    ``templates``, kept by the caller from line to line: completion lines whose bodies differ
    only in their prompt are prepared on one validation of the rest (``PromptTemplate``), with
    the same entries."""
    try:
        item = orjson.loads(text)
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
    if endpoint is not None and url != endpoint:
        raise InvalidRequest(f"'url' must be this batch's endpoint {endpoint!r}, got {url!r}")
    if not isinstance(body, dict):
        raise InvalidRequest("'body' must be a JSON object")
    if body.get("stream"):
        raise InvalidRequest("stream = true is not supported in a batch")
    body = {k: v for k, v in body.items() if k != "stream"}
    request_id, metadata = f"{batch_id}-{n}", {"custom_id": custom_id, "batch": batch_id}
    if templates is not None and url == COMPLETIONS and isinstance(body.get("prompt"), str):
        found = _template(templates, body, priority, tenant, batch_id)
        fast = found.template.prepare(body["prompt"], request_id, metadata) if found else None
        if found and fast:
            return BatchLine(line=n, custom_id=custom_id, url=url, prepared=fast, model=found.model)
    if url == EMBEDDINGS:
        return _embedding_line(n, custom_id, body, request_id, metadata, priority, tenant)
    args = {"priority": priority, "tenant": tenant, **request_args(url, body)}
    model = args.get("model")
    done = prepare(build_request(**args, request_id=request_id, metadata=metadata))
    return BatchLine(
        line=n,
        custom_id=custom_id,
        url=url,
        prepared=done,
        model=None if model is None else str(model),
    )


def _embedding_line(
    n: int,
    custom_id: str,
    body: Mapping[str, Any],
    request_id: str,
    metadata: dict[str, Any],
    priority: str,
    tenant: str,
) -> BatchLine:
    """An embeddings line: its own ``metadata`` is refused (the line's is the batch's), and a
    float encoding rides in the request's metadata to its output line."""
    read = embedding_bodies.read_body(body, default_encoding="base64")
    if read.metadata is not None:
        raise InvalidRequest("'metadata' is the batch's in a batch line")
    if read.encoding != "base64":
        metadata = {**metadata, ENCODING_KEY: read.encoding}
    options = {"priority": priority, **read.options}
    request = build_embedding(
        read.inputs,
        model=read.model,
        tenant=tenant,
        request_id=request_id,
        metadata=metadata,
        **options,
    )
    return BatchLine(
        line=n, custom_id=custom_id, url=EMBEDDINGS, prepared=prepare(request), model=read.model
    )


MAX_TEMPLATES = 64
"""Most distinct option sets a batch's reader keeps validated (``parse_line``'s templates)."""


@dataclass(frozen=True)
class LineTemplate:
    """The options that completion lines share, validated once, and their model."""

    template: PromptTemplate
    model: str | None


def _template(
    templates: dict[str, LineTemplate | None],
    body: Mapping[str, Any],
    priority: str,
    tenant: str,
    batch_id: str,
) -> LineTemplate | None:
    """The validated template of a completion line's body (all but its prompt), made once per
    distinct body; None when it is not valid (the full path then says why)."""
    rest = {k: v for k, v in body.items() if k != "prompt"}
    try:
        name = orjson.dumps([priority, tenant, rest], option=orjson.OPT_SORT_KEYS).decode()
    except TypeError:
        return None
    if name not in templates:
        if len(templates) >= MAX_TEMPLATES:
            templates.clear()
        try:
            args = request_args(COMPLETIONS, {**rest, "prompt": "-"})
            del args["prompt"]
            meta = {"custom_id": "-", "batch": batch_id}
            options = {"priority": priority, "tenant": tenant, **args, "metadata": meta}
            model = args.get("model")
            templates[name] = LineTemplate(
                PromptTemplate(options), None if model is None else str(model)
            )
        except InvalidRequest:
            templates[name] = None
    return templates[name]


def _text_message(m: Any) -> dict[str, Any]:
    if not isinstance(m, dict):
        raise InvalidRequest("each message must be an object with 'role' and 'content'")
    extra = {k: m[k] for k in ("tool_calls", "tool_call_id", "name") if m.get(k) is not None}
    content = m.get("content")
    if isinstance(content, list):  # OpenAI's content parts: text parts only
        texts = [p.get("text") for p in content if isinstance(p, dict) and p.get("type") == "text"]
        if len(texts) != len(content):
            raise InvalidRequest("only text message content is supported")
        if not all(isinstance(t, str) for t in texts):
            raise InvalidRequest("a text part's 'text' must be a string")
        content = "".join(str(t) for t in texts)
    return {"role": m.get("role"), "content": content, **extra}


def custom_id_of(text: str) -> str | None:
    """The ``custom_id`` of a batch line, if it has one (also of a line refused)."""
    try:
        item = json.loads(text)
    except ValueError:
        return None
    value = item.get("custom_id") if isinstance(item, dict) else None
    return value if isinstance(value, str) else None


def parse_file(
    lines: Iterable[str],
    batch_id: str,
    priority: str = "normal",
    endpoint: str | None = None,
    tenant: str = DEFAULT_TENANT,
) -> tuple[list[BatchLine], list[RejectedLine]]:
    """Every line of a batch file: the valid ones, and each invalid one with its number."""
    good: list[BatchLine] = []
    bad: list[RejectedLine] = []
    seen: set[str] = set()
    templates: dict[str, LineTemplate | None] = {}
    for n, text in enumerate(lines, start=1):
        if not text.strip():
            continue
        try:
            item = parse_line(n, text, batch_id, priority, endpoint, tenant, templates)
            if item.custom_id in seen:
                raise InvalidRequest(f"custom_id {item.custom_id!r} appears twice")
            seen.add(item.custom_id)
            good.append(item)
        except InvalidRequest as err:
            bad.append(RejectedLine(line=n, custom_id=custom_id_of(text), message=str(err)))
    return good, bad


def rejected_output(batch_id: str, bad: RejectedLine) -> dict[str, Any]:
    """The error-file line of an input line refused at submission."""
    return {
        "id": f"batch_req_{batch_id}-{bad.line}",
        "custom_id": bad.custom_id,
        "response": None,
        "error": {"code": "invalid_request", "message": f"line {bad.line}: {bad.message}"},
    }


def expired_line(batch_id: str, number: int, text: str) -> str:
    """The error-file line of an input line never fed: its batch expired first."""
    return json.dumps(
        {
            "id": f"batch_req_{batch_id}-{number}",
            "custom_id": custom_id_of(text),
            "response": None,
            "error": {
                "code": "batch_expired",
                "message": "this request could not be executed before the completion window "
                "expired",
            },
        }
    )


def plain_output_line(request_id: str, url: str, raw: bytes | str) -> dict[str, Any] | None:
    """``output_line`` of a stored state read as JSON, without building its ``Result``, for
    the usual case (succeeded, one choice, no log-probabilities, no tool calls: a batch's
    output is mostly these); None for any other, which takes ``output_line``."""
    state = orjson.loads(raw)
    if state.get("status") != "succeeded" or any(
        state.get(k) is not None for k in ("choices", "logprobs", "tool_calls", "embeddings")
    ):
        return None
    usage, timings = state.get("usage") or {}, state.get("timings") or {}
    prompt, generated = usage.get("prompt_tokens", 0), usage.get("completion_tokens", 0)
    choice: dict[str, Any] = {"index": 0, "finish_reason": state.get("finish_reason")}
    if url == CHAT:
        choice["message"] = {"role": "assistant", "content": state.get("text") or ""}
    else:
        choice["text"] = state.get("text") or ""
    choice["logprobs"] = None
    body = {
        "id": state.get("id"),
        "object": ENDPOINTS[url],
        "created": (timings.get("finished_unix_ms") or 0) // 1000,
        "model": state.get("model") or "unknown",
        "choices": [choice],
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": generated,
            "total_tokens": prompt + generated,
            "prompt_tokens_details": {"cached_tokens": usage.get("cached_tokens", 0)},
        },
    }
    return {
        "id": f"batch_req_{request_id}",
        "custom_id": (state.get("metadata") or {}).get("custom_id"),
        "response": {"status_code": 200, "request_id": request_id, "body": body},
        "error": None,
    }


def output_line(request_id: str, url: str, res: Result) -> dict[str, Any]:
    """The output-file line (succeeded) or error-file line (otherwise) of a final result."""
    line: dict[str, Any] = {
        "id": f"batch_req_{request_id}",
        "custom_id": res.metadata.get("custom_id"),
    }
    if res.status != "succeeded":
        err = res.error
        line["response"] = None
        line["error"] = {
            "code": err.code if err else res.status,
            "message": err.message if err else res.status,
        }
        return line
    if url == EMBEDDINGS:
        encoding = str(res.metadata.get(ENCODING_KEY) or "base64")
        body = embedding_bodies.response_body(res, encoding) | {"id": res.id}
    else:
        body = response_body(url, res)
    line["response"] = {"status_code": 200, "request_id": request_id, "body": body}
    line["error"] = None
    return line
