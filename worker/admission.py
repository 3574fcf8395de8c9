"""Admission: turning stream entries into runnable requests, or into final results at once.

Everything here is decided before a request costs any generation: malformed entries, prompts
over the model's context, limits, passed deadlines. Pure functions of their inputs.
"""

from __future__ import annotations

from dataclasses import dataclass

from genq.common.errors import (
    GenqError,
    MaxNewTokensTooLarge,
    PromptTooLong,
    RequestTooLarge,
)
from genq.common.models import Request


@dataclass(frozen=True)
class Limits:
    """What one worker accepts."""

    max_new_tokens: int
    """From --max-new-tokens-limit."""
    max_prompt_tokens: int | None
    """From --max-prompt-tokens, else the model's context."""
    max_context_tokens: int | None
    """The model's context: prompt + generated tokens must fit in it."""
    max_batch_tokens: int
    """A request costing more could never be batched."""


def check_limits(request: Request, prompt_tokens: int, limits: Limits) -> GenqError | None:
    """The reason this worker cannot run ``request``, or None if it can."""
    if request.max_new_tokens > limits.max_new_tokens:
        return MaxNewTokensTooLarge(
            f"max_new_tokens is {request.max_new_tokens}; this worker allows at most "
            f"{limits.max_new_tokens} (--max-new-tokens-limit)"
        )
    if limits.max_prompt_tokens is not None and prompt_tokens > limits.max_prompt_tokens:
        return PromptTooLong(
            f"prompt is {prompt_tokens} tokens; this worker accepts at most "
            f"{limits.max_prompt_tokens}: shorten the prompt"
        )
    ctx = limits.max_context_tokens
    if ctx is not None and prompt_tokens + request.max_new_tokens > ctx:
        return PromptTooLong(
            f"prompt is {prompt_tokens} tokens and max_new_tokens is {request.max_new_tokens}; "
            f"together they exceed this model's context of {ctx} tokens: shorten the prompt "
            "or lower max_new_tokens"
        )
    cost = prompt_tokens + request.max_new_tokens
    if cost > limits.max_batch_tokens:
        return RequestTooLarge(
            f"request needs {cost} tokens (prompt {prompt_tokens} + max_new_tokens "
            f"{request.max_new_tokens}); this worker's batch budget is {limits.max_batch_tokens} "
            "(--max-batch-tokens)"
        )
    return None


def deadline_passed(request: Request, now_ms: int) -> bool:
    """True if the request had a deadline and it is past."""
    return request.deadline_unix_ms is not None and now_ms >= request.deadline_unix_ms


def entry_time_ms(entry_id: str) -> int:
    """When Redis accepted an entry: the millisecond part of its id."""
    return int(entry_id.split("-", 1)[0])
