"""A final result as OpenAI's completion or chat completion response body (its choices, their
log-probabilities in each endpoint's shape, its usage). Pure: ``POST /v1/completions``, ``POST
/v1/chat/completions`` and batch output lines share it."""

from __future__ import annotations

from typing import Any

from genq.common.models import Result

COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"
OBJECTS = {COMPLETIONS: "text_completion", CHAT: "chat.completion"}
"""Each endpoint's response ``object``."""


def usage_of(res: Result) -> dict[str, Any]:
    """OpenAI's usage object of a result (chat, completions, batch output lines), with the
    prompt tokens the engine took from its prefix cache."""
    return {
        "prompt_tokens": res.usage.prompt_tokens,
        "completion_tokens": res.usage.completion_tokens,
        "total_tokens": res.usage.prompt_tokens + res.usage.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": res.usage.cached_tokens},
    }


def response_body(url: str, res: Result) -> dict[str, Any]:
    """The OpenAI response body (a completion or a chat completion) of a succeeded result:
    one choice, or each of a request's ``n``."""
    if res.choices is None:
        calls = None if res.tool_calls is None else [c.model_dump() for c in res.tool_calls]
        choices = [_choice(url, 0, res.text or "", res.finish_reason, res.logprobs, calls)]
    else:
        choices = [_choice(url, c.index, c.text, c.finish_reason, c.logprobs) for c in res.choices]
    return {
        "id": res.id,
        "object": OBJECTS[url],
        "created": (res.timings.finished_unix_ms or 0) // 1000,
        "model": res.model or "unknown",
        "choices": choices,
        "usage": usage_of(res),
    }


def _choice(
    url: str,
    index: int,
    text: str,
    finish_reason: str | None,
    logprobs: list[Any] | None,
    calls: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": index, "finish_reason": finish_reason}
    entries = None if logprobs is None else [e.model_dump() for e in logprobs]
    if url == CHAT and calls:
        choice["message"] = {"role": "assistant", "content": None, "tool_calls": calls}
        choice["logprobs"] = None
    elif url == CHAT:
        choice["message"] = {"role": "assistant", "content": text}
        choice["logprobs"] = None if entries is None else {"content": entries, "refusal": None}
    else:
        choice["text"] = text
        choice["logprobs"] = None if entries is None else _legacy_logprobs(entries)
    return choice


def _legacy_logprobs(entries: list[dict[str, Any]]) -> dict[str, Any]:
    """The chat shape of log-probabilities as /v1/completions' legacy object: ``tokens``,
    ``token_logprobs``, ``top_logprobs`` (token -> log-probability) and ``text_offset`` (each
    token's start in the completion's text)."""
    offsets, at = [], 0
    for e in entries:
        offsets.append(at)
        at += len(e["token"])
    return {
        "tokens": [e["token"] for e in entries],
        "token_logprobs": [e["logprob"] for e in entries],
        "top_logprobs": [{t["token"]: t["logprob"] for t in e["top_logprobs"]} for e in entries],
        "text_offset": offsets,
    }
