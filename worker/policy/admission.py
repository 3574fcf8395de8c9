"""Admission: the verdict on each delivered entry, before it costs any generation.

An entry is run, failed at once (malformed with a usable id, over a limit), expired (its
deadline passed) or dead-lettered (no usable id: there is nobody to report to). Two steps,
because the second needs the prompt's length in the engine's tokenizer: ``judge_entry`` on the
decoded entry, then ``judge_prompt`` on its token count.

Pure functions of their inputs.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from genq.common.errors import (
    ContextTooLong,
    GenqError,
    InvalidRequest,
    MaxNewTokensTooLarge,
    ModelNotServed,
    PromptTooLong,
    RequestTooLarge,
)
from genq.common.models import Request
from genq.common.wire import UndecodableEntry


class Action(Enum):
    """What becomes of a delivered entry."""

    RUN = "run"
    FAIL = "fail"
    EXPIRE = "expire"
    DEAD_LETTER = "dead_letter"


@dataclass(frozen=True, slots=True, kw_only=True)
class Verdict:
    """The verdict on one entry, and why (for FAIL and DEAD_LETTER)."""

    action: Action
    error: GenqError | None = None
    request_id: str | None = None
    """The id to report a FAIL under, when the entry could not be decoded into a request."""


RUN = Verdict(action=Action.RUN)
EXPIRE = Verdict(action=Action.EXPIRE)


@dataclass(frozen=True, kw_only=True)
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
    vocab_size: int | None = None
    """Tokens the model's tokenizer knows: ``logit_bias`` may name only these (None: any)."""
    models: frozenset[str] | None = None
    """The names this worker serves: a request naming another is failed, never answered by
    the wrong model (None: any, in tests)."""


def check_limits(request: Request, prompt_tokens: int, limits: Limits) -> GenqError | None:
    """The reason this worker cannot run ``request``, or None if it can."""
    served = limits.models
    if request.model is not None and served is not None and request.model not in served:
        return ModelNotServed(
            f"model {request.model!r} is not served by this worker ({', '.join(sorted(served))}):"
            " its entry was added to another model's stream (submit with a client or "
            "FCALL genq_submit)"
        )
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
    if ctx is not None and prompt_tokens >= ctx:
        return PromptTooLong(
            f"prompt is {prompt_tokens} tokens; this model's context is {ctx} tokens, with "
            "room needed for at least one generated token: shorten the prompt"
        )
    if ctx is not None and prompt_tokens + request.max_new_tokens > ctx:
        return ContextTooLong(
            f"prompt is {prompt_tokens} tokens and max_new_tokens is {request.max_new_tokens}; "
            f"together they exceed this model's context of {ctx} tokens: shorten the prompt "
            "or lower max_new_tokens"
        )
    vocab = limits.vocab_size
    unknown = (
        [t for t in request.logit_bias if int(t) >= vocab]
        if vocab is not None and request.logit_bias
        else []
    )
    if unknown and vocab is not None:
        return InvalidRequest(
            f"logit_bias names token {unknown[0]}; this model's tokenizer has {vocab} tokens "
            f"(ids 0 to {vocab - 1})"
        )
    cost = (prompt_tokens + request.max_new_tokens) * request.n
    if cost > limits.max_batch_tokens:
        times = f" x n {request.n}" if request.n > 1 else ""
        return RequestTooLarge(
            f"request needs {cost} tokens ((prompt {prompt_tokens} + max_new_tokens "
            f"{request.max_new_tokens}){times}); this worker's batch budget is "
            f"{limits.max_batch_tokens} (--max-batch-tokens)"
        )
    return None


def judge_entry(decoded: Request | UndecodableEntry, now_ms: int, enqueued_ms: int) -> Verdict:
    """The verdict on a decoded entry: run it (pending its prompt's length), fail it under the
    id it carried, expire it, or dead-letter it (no usable id). ``enqueued_ms``: the entry's
    time (Redis' clock, as ``now_ms``)."""
    if isinstance(decoded, UndecodableEntry):
        if decoded.request_id is None:
            return Verdict(action=Action.DEAD_LETTER, error=decoded.error)
        return Verdict(action=Action.FAIL, error=decoded.error, request_id=decoded.request_id)
    return EXPIRE if deadline_passed(decoded, now_ms, enqueued_ms) else RUN


def judge_prompt(request: Request, prompt_tokens: int, limits: Limits) -> Verdict:
    """The verdict once the prompt's length is known: run it, or fail it over a limit."""
    problem = check_limits(request, prompt_tokens, limits)
    return RUN if problem is None else Verdict(action=Action.FAIL, error=problem)


def deadline_passed(request: Request, now_ms: int, enqueued_ms: int) -> bool:
    """True if the request had a deadline and it is past: an absolute one
    (``deadline_unix_ms``), or one relative to when its entry was accepted (``deadline_in_ms``
    after ``enqueued_ms``). Redis' clock is at least the time it stamped on the entry, so a
    worker whose view of it lags by a millisecond or two (``clock.sync`` measures to the
    millisecond, halfway through a round trip) still finds a deadline of 0 past."""
    if request.deadline_unix_ms is not None and now_ms >= request.deadline_unix_ms:
        return True
    relative = request.deadline_in_ms
    return relative is not None and max(now_ms, enqueued_ms) >= enqueued_ms + relative


def entry_time_ms(entry_id: str) -> int:
    """When Redis accepted an entry: the millisecond part of its id."""
    return int(entry_id.split("-", 1)[0])
