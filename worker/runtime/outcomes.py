"""Outcomes: a request's final state as the worker hands it to the writer, with the entry to
acknowledge for it. The state itself is built by ``genq.common.states`` (the one owner of the
result document); this module fills it in from what the worker knows.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from genq.common import states
from genq.common.embeddings import pack
from genq.common.errors import GenqError
from genq.common.keys import Keys
from genq.common.models import DEFAULT_TENANT, Request
from genq.common.prefixes import continuation_key
from genq.common.tools import calls_in_text, forced_calls
from genq.worker.engines.base import GenerationOutput
from genq.worker.policy.admission import entry_time_ms
from genq.worker.policy.fair_share import Refund
from genq.worker.policy.lookahead import Held
from genq.worker.runtime.clock import now_ms

log = logging.getLogger("genq.worker")


@dataclass(slots=True, kw_only=True)
class Outcome:
    """A final state to write, and the entry to acknowledge with it."""

    stream: str
    """The work stream of the entry to acknowledge."""
    entry_id: str
    """The entry to acknowledge (and delete) once the state is written."""
    request_id: str
    status: str
    """succeeded, failed, expired or cancelled."""
    priority: str
    state_json: str
    """The state, as ``genq.common.states`` built it (this is the hot path: JSON once)."""
    queue_wait_ms: int | None = None
    """Enqueue to start, for the wait percentiles and metrics (None: it never started)."""
    completion_tokens: int = 0
    refund: Refund | None = None
    """What goes back to its tenant's share (None: no tenant known, nothing was charged)."""
    continuation: str | None = None
    """A finished chat's next-turn prefix key (its messages and this reply: unscoped), which
    this worker now holds (``runtime/prefixes.py``)."""

    @property
    def tenant(self) -> str:
        """Whom the request belonged to (``default`` when its body could not be read)."""
        return self.refund.tenant if self.refund is not None else DEFAULT_TENANT


class Outcomes:
    """Builds the outcomes of one worker (its consumer name goes into every state)."""

    def __init__(
        self,
        *,
        worker: str,
        keys: Keys,
        model: str,
        reads_tool_calls: bool | Callable[[str | None], bool] = False,
        keys_next_turns: bool = False,
    ) -> None:
        self.worker = worker
        self.keys = keys
        self.model = model
        self.reads_tool_calls = reads_tool_calls
        """Whether the model's chat template teaches the Hermes call format (``auto`` tool
        choices are read from the text then: ``common/tools.py``); a pool's says it per
        model (a request's)."""
        self.keys_next_turns = keys_next_turns
        """Whether a finished chat's next-turn prefix key is computed (``--prefix-aware``)."""

    def _tool_calls(self, r: Request, out: GenerationOutput) -> list[dict[str, Any]] | None:
        """The calls in a chat-with-tools' output: the forced one, or (``auto``, on a model
        whose template has the call format) the Hermes blocks in its text."""
        choice = r.tool_choice
        if choice == "none" or r.tools is None:
            return None
        if choice in (None, "auto"):
            reads = self.reads_tool_calls
            if not (reads(r.model) if callable(reads) else reads):
                return None
            return calls_in_text(out.text, {t.function.name for t in r.tools})[1]
        return None if out.finish_reason == "length" else forced_calls(out.text, choice)

    def succeeded(
        self,
        held: Held,
        out: GenerationOutput,
        *,
        started_ms: int,
        finished_ms: int,
        generation_ms: int,
        batch_size: int,
    ) -> Outcome:
        """A request that generated its text."""
        r = held.request
        calls = None if r.tools is None else self._tool_calls(r, out)
        state = states.succeeded(  # six by position: 16+ keywords are slower (states.py)
            r.id,
            r.priority,
            r.tenant,
            r.metadata,
            out.text,
            "tool_calls" if calls else out.finish_reason,
            prompt_tokens=len(held.prompt_ids),
            completion_tokens=out.completion_tokens,
            cached_tokens=min(out.cached_tokens, len(held.prompt_ids)),
            queued_ms=held.enqueued_ms,
            started_ms=started_ms,
            finished_ms=finished_ms,
            generation_ms=generation_ms,
            worker=self.worker,
            model=r.model or self.model,  # the name it asked for: this model's, or an adapter's
            batch_size=batch_size,
            logprobs=out.logprobs,
            choices=None if out.choices is None else choice_dicts(out.choices),
            tool_calls=calls or None,
            embeddings=None if out.vectors is None else [pack(v) for v in out.vectors],
        )
        return Outcome(
            stream=held.stream,
            entry_id=held.entry_id,
            request_id=r.id,
            status="succeeded",
            priority=r.priority,
            state_json=state,
            queue_wait_ms=max(0, started_ms - held.enqueued_ms),
            completion_tokens=out.completion_tokens,
            refund=Refund(
                tenant=r.tenant,
                charged=held.charge,
                prompt_tokens=len(held.prompt_ids),
                completion_tokens=out.completion_tokens,
            ),
            continuation=continuation_key(r.messages, out.text)
            if self.keys_next_turns and r.messages is not None
            else None,
        )

    def failed(
        self,
        *,
        stream: str,
        entry_id: str,
        request_id: str,
        error: GenqError,
        request: Request | None = None,
        started_ms: int | None = None,
        charge: tuple[int, int] = (0, 0),
        charged_as_started: bool | None = None,
    ) -> Outcome:
        """A request that failed, with an error a person can act on. ``charged_as_started``:
        whether its charge was moved to its tenant's service (default: it started)."""
        log.info("request %s failed: %s", request_id, error)
        return self._ended(
            stream=stream,
            entry_id=entry_id,
            request_id=request_id,
            request=request,
            status="failed",
            code=error.code,
            message=str(error),
            started_ms=started_ms,
            charge=charge,
            charged_as_started=charged_as_started,
        )

    def failed_held(
        self,
        held: Held,
        error: GenqError,
        started_ms: int | None = None,
        charged_as_started: bool | None = None,
    ) -> Outcome:
        """``failed`` for a held request."""
        return self.failed(
            stream=held.stream,
            entry_id=held.entry_id,
            request_id=held.request.id,
            error=error,
            request=held.request,
            started_ms=started_ms,
            charge=held.charge,
            charged_as_started=charged_as_started,
        )

    def expired(
        self, *, stream: str, entry_id: str, request: Request, charge: tuple[int, int] = (0, 0)
    ) -> Outcome:
        """A request whose deadline passed before it started."""
        return self._ended(
            stream=stream,
            entry_id=entry_id,
            request_id=request.id,
            request=request,
            status="expired",
            code="expired",
            message="the request's deadline passed before it started",
            started_ms=None,
            charge=charge,
        )

    def expired_running(self, held: Held, started_ms: int) -> Outcome:
        """A request whose deadline passed while it was generating: stopped in the engine, its
        text so far dropped (a continuous engine; a static batch runs to its end)."""
        why = "the request's deadline passed while it was generating: it was stopped"
        return self._ended_held(held, "expired", why, started_ms)

    def cancelled(self, held: Held) -> Outcome:
        """A request cancelled while running: its state is already final (the client's), so
        writing this only acknowledges its entry."""
        return self._ended_held(
            held, "cancelled", "cancelled by a client", None, charged_as_started=True
        )

    def _ended_held(
        self,
        held: Held,
        status: str,
        message: str,
        started_ms: int | None,
        charged_as_started: bool | None = None,
    ) -> Outcome:
        return self._ended(
            stream=held.stream,
            entry_id=held.entry_id,
            request_id=held.request.id,
            request=held.request,
            status=status,
            code=status,
            message=message,
            started_ms=started_ms,
            charge=held.charge,
            charged_as_started=charged_as_started,
        )

    def _ended(
        self,
        *,
        stream: str,
        entry_id: str,
        request_id: str,
        request: Request | None,
        status: str,
        code: str,
        message: str,
        started_ms: int | None,
        charge: tuple[int, int] = (0, 0),
        charged_as_started: bool | None = None,
    ) -> Outcome:
        queued_ms = entry_time_ms(entry_id)
        started = started_ms is not None if charged_as_started is None else charged_as_started
        priority = request.priority if request else self.keys.priority_of(stream)
        state = states.ended(
            request_id=request_id,
            status=status,
            priority=priority,
            tenant=request.tenant if request else DEFAULT_TENANT,
            metadata=request.metadata if request else {},
            code=code,
            message=message,
            queued_ms=queued_ms,
            started_ms=started_ms,
            finished_ms=now_ms(),
            worker=self.worker,
        )
        wait_ms = None if started_ms is None else max(0, started_ms - queued_ms)
        return Outcome(
            stream=stream,
            entry_id=entry_id,
            request_id=request_id,
            status=status,
            priority=priority,
            state_json=state,
            queue_wait_ms=wait_ms,
            refund=Refund(tenant=request.tenant, charged=charge, started=started)
            if request
            else None,
        )


def choice_dicts(choices: list[GenerationOutput]) -> list[dict[str, Any]]:
    """``Result.choices`` (``Choice``-shaped dicts) of a row's outputs."""
    return [
        {
            "index": j,
            "text": c.text,
            "finish_reason": c.finish_reason,
            **({} if c.logprobs is None else {"logprobs": c.logprobs}),
        }
        for j, c in enumerate(choices)
    ]
