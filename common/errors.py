"""The small error hierarchy shared by the client and the worker.

Every error carries a stable ``code`` (what a program branches on, and what a ``failed``
result records) and a message a person can act on.
"""

from __future__ import annotations


class GenqError(Exception):
    """Base class of every error genq raises on purpose."""

    code = "genq_error"


class ConfigError(GenqError):
    """A setting is unknown or out of range."""

    code = "config_error"


class InvalidRequest(GenqError, ValueError):
    """A request is malformed or outside the limits; nothing was sent or run."""

    code = "invalid_request"


class PromptTooLong(InvalidRequest):
    """The prompt alone is longer than the worker accepts (``--max-prompt-tokens``, or the
    model's context)."""

    code = "prompt_too_long"


class ContextTooLong(PromptTooLong):
    """The prompt fits, but not together with ``max_new_tokens`` in the model's context: shorten
    the prompt or ask for fewer tokens."""

    code = "context_too_long"


class MaxNewTokensTooLarge(InvalidRequest):
    """``max_new_tokens`` is above the limit the worker allows."""

    code = "max_new_tokens_too_large"


class RequestTooLarge(InvalidRequest):
    """The request alone needs more tokens than one batch of this worker may hold."""

    code = "request_too_large"


class ModelNotServed(InvalidRequest):
    """A request names a model the worker that read it does not serve (it reached a lane it
    does not belong in: a plain XADD with another model's name). Never answered by the wrong
    model."""

    code = "model_not_served"


class MalformedEntry(InvalidRequest):
    """A stream entry is not in the documented wire format."""

    code = "malformed_entry"


class SubmitFailed(GenqError):
    """Redis refused (part of) a submit: out of memory, or another error it answered. A
    multi-request submit goes in chunks of 500, each all or nothing: ``submitted`` holds the
    ids that were enqueued (safe to submit the rest again, or all: an id already in is not
    enqueued twice), ``not_submitted`` the others."""

    code = "submit_failed"

    def __init__(
        self,
        message: str,
        submitted: list[str] | None = None,
        not_submitted: list[str] | None = None,
    ) -> None:
        super().__init__(message)
        self.submitted = submitted or []
        self.not_submitted = not_submitted or []


class QueueFull(SubmitFailed):
    """The queue holds its maximum number of requests. ``submitted``: the ids that were
    enqueued before the limit was hit (in a large ``submit_many``); the rest were not."""

    code = "queue_full"


class PriorityDenied(InvalidRequest):
    """A request asked for a priority above its tenant's ``max_priority`` (``genq tenants set
    --max-priority``); nothing of the call was enqueued. HTTP 403 at the gateway."""

    code = "priority_denied"


class PoisonRequest(GenqError):
    """Every worker that started this request died before finishing it, ``max_attempts`` times."""

    code = "poison_request"


class GenerationError(GenqError):
    """The engine raised while generating this request."""

    code = "generation_error"


class RequestNotFound(GenqError, KeyError):
    """No request with this id exists (never submitted, or its result expired)."""

    code = "not_found"

    def __str__(self) -> str:  # KeyError quotes its argument; keep the message readable.
        return str(self.args[0]) if self.args else self.code


class RequestFailed(GenqError):
    """A request waited for by a call that returns what it made (``Client.embed``) ended
    without it: failed, expired or cancelled. ``result`` is its final state."""

    code = "request_failed"

    def __init__(self, message: str, result: object = None) -> None:
        super().__init__(message)
        self.result = result


class ResultTimeout(GenqError, TimeoutError):
    """The request did not reach a final state within the time the caller gave."""

    code = "timeout"


INPUT_ERRORS = frozenset(
    {
        InvalidRequest.code,
        PromptTooLong.code,
        ContextTooLong.code,
        MaxNewTokensTooLarge.code,
        RequestTooLarge.code,
        MalformedEntry.code,
    }
)
"""Result error codes that mean the request itself was wrong (HTTP 400; a response's
``invalid_prompt``)."""


EXIT_NO_PERMISSION = 77
"""A worker's exit status when Redis refuses its user a command or key (sysexits' EX_NOPERM):
a restart would meet the same refusal, so its launcher does not restart it."""
