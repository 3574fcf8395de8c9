"""Runners: an engine behind the one interface the worker's turn uses (``Runner``); the static
runner is ``static_runner.py``, the continuous one ``continuous_runner.py`` (``builder.make_runner``
picks).

The turn hands a runner the requests it started (``start``), then asks for what finished
(``collect``). A **static** runner runs the whole batch inside ``collect`` (one ``generate``
call, bisected on failure); a **continuous** runner hands each request to an iteration-level
engine at ``start`` and returns each result from ``collect`` the moment it finishes. Both
hold what they run in ``running`` (for the claim keeper, the planner and cancels) and turn
engine output into outcomes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Container, Sequence
from dataclasses import dataclass

from genq.worker.engines.base import (
    SHARED_SCOPE,
    GenerationInput,
    logit_adjust,
)
from genq.worker.policy import preemption
from genq.worker.policy.lookahead import Held, Lookahead
from genq.worker.runtime import read_trip
from genq.worker.runtime.heartbeat import Counters
from genq.worker.runtime.metrics import Metrics
from genq.worker.runtime.outcomes import Outcome, Outcomes

log = logging.getLogger("genq.worker")

POLL_S = 0.02
"""How long a turn waits, at least, for a running request to finish before checking Redis
again (longer while its next read is paced: ``read_trip.READ_PACE_S``)."""
POLL_SLICE_S = 0.005
"""A continuous runner's wait for outputs is cut in slices this long, to see between them
whether the doorbell rang (a request arrived: it should join the running batch now)."""
FIRST_BATCH_GUESS_MS = 1000.0
"""What a static worker takes its first batch to last, before it has measured one: a real
model's batch takes about this long, and guessing long only costs one hand-back. (An engine
that knows its time per decode step says so instead: echo's ``ms_per_step``.)"""
CANCEL_CHECK_S = 0.25
"""How often a runner looks for running requests cancelled by a client."""


@dataclass(frozen=True, kw_only=True)
class RunnerContext:
    """What every runner reports to."""

    outcomes: Outcomes
    """Builds the outcomes of what it ran."""
    counters: Counters
    """The worker's counters (the loop's thread only)."""
    metrics: Metrics
    send_delta: Callable[[str, str], None]
    """``send_delta(request id, text)``: a piece of a streaming request's text."""
    sharing: Callable[[], Container[str]] = frozenset
    """The tenants that share (``share_prefixes``): their embeddings' repeats meet."""


class Runner:
    """What the turn needs of any engine; the engine-specific part is in the subclasses."""

    waits_to_fill = False
    """Whether a batch is worth waiting for (``max_wait_ms``) before it starts."""
    hands_back = False
    """Whether the loop is busy while a batch runs, so that what it holds waiting should go
    back to the group when a batch will take long (``holds_loop_ms``)."""
    preempts = False
    """Whether higher-priority requests may take running ones' places (``rebalance``,
    ``preemptible_by``): the loop skips those steps for a runner that never preempts."""
    limits_reads = False
    """Whether ``read_limit`` can say anything but None (asked first: on every read's path)."""
    stoppable = False
    """Whether the batch ``collect`` runs next may stop for a higher priority (a static runner
    with ``--preempt``: the doorbell's rings then go to ``outranked``)."""
    stopped_rank = 0
    """The highest priority rank of the batches that stopped for a higher one and wait to run
    again (a static runner): the planner starts only what outranks them until they have run;
    0: none."""
    batch_started_ms: int | None = None
    """When the batch that ``stoppable`` says may stop started (Redis' clock): rings since then
    are heard (``DoorbellListener.arm``)."""
    holds_loop_ms: float | None = None
    """How long the batch just started should keep the loop busy, expected (a runner whose loop
    is busy while a batch runs: ``hands_back``; set by ``start``); None: nothing running, not
    known, or the loop goes on while it runs."""

    def __init__(self, context: RunnerContext) -> None:
        self.outcomes = context.outcomes
        self.counters = context.counters
        self.metrics = context.metrics
        self.send_delta = context.send_delta
        self.sharing = context.sharing
        self.running: dict[str, Held] = {}
        """Started and not yet finished, by held key."""
        self._last_cancel_check_s = 0.0

    @property
    def busy(self) -> bool:
        """Whether anything is running."""
        return bool(self.running)

    def active(self) -> list[Held]:
        """What takes a place in the engine now (the running requests less the paused)."""
        return list(self.running.values())

    def preemptible_by(self, priority: str) -> int:
        """How many running requests a waiting one of ``priority`` could take the place of
        (0: this runner does not preempt)."""
        return 0

    def outranked(self, priority: str) -> None:
        """A ring brought a request of ``priority`` (called in the doorbell's thread)."""

    def preempting(self, waiting: Sequence[str]) -> int:
        """How many more a read may bring, beyond the free places, to take running requests'
        places: those below high less the high ones already ``waiting``."""
        highs = sum(1 for p in waiting if p == "high")
        return max(0, self.preemptible_by("high") - highs)

    def read_total(self, lookahead: Lookahead, max_batch_size: int) -> int:
        """How many entries a read may bring in all (0: no cap): a continuous runner's free
        slots, filled from the highest priority first. (Its room per stream alone would let a
        read bring one of each priority, and the low one would then take the next free slot
        before the high ones still waiting in Redis.)"""
        limit = self.read_limit(max_batch_size) if self.limits_reads else None
        if limit is None:
            return 0
        left = max(0, limit - len(lookahead.waiting))
        return left + (self.preempts and self.preempting(lookahead.priorities()))

    def widen(
        self, room: dict[str, int], priority_of: Callable[[str], str], waiting: Sequence[str]
    ) -> dict[str, int]:
        """``room`` (per stream) widened by what may start by preempting: per priority, the
        running requests below it less the ``waiting`` ones at or above it (they preempt
        first)."""
        for stream in room:
            rank = preemption.RANK[priority_of(stream)]
            ahead = sum(1 for w in waiting if preemption.RANK[w] >= rank)
            room[stream] = max(room[stream], self.preemptible_by(priority_of(stream)) - ahead)
        return room

    def read_pace_s(self, max_batch_size: int) -> float:
        """How long after a read that found the queue empty the next one waits (0: none):
        ``READ_PACE_S`` while the engine is busy (a submission rings the doorbell, which ends
        the pace: the paced read is for what rings nothing)."""
        return read_trip.READ_PACE_S if self.busy else 0.0

    def rebalance(
        self, asks: Callable[[], Sequence[preemption.Waiting]], max_batch_size: int
    ) -> None:
        """Give the places of running requests to the higher-priority (or, past a time slice,
        shorter) ones that wait (``asks()``: built only by a runner that preempts), and run
        paused ones again where room allows (an iteration-level runner that preempts only)."""

    def read_limit(self, max_batch_size: int) -> int | None:
        """How many requests this runner should hold waiting, at most (None: a full candidate
        pool per stream, for choosing its batches)."""
        return None

    def expected_ms(self, batch: Sequence[Held]) -> float | None:
        """How long ``batch`` should keep the loop busy, if this runner runs it in the loop
        and knows (a static runner that measured its time per step, or was told it)."""
        return None

    def entries(self) -> list[tuple[str, str]]:
        """(stream, entry id) of every running request (safe from another thread)."""
        return [(h.stream, h.entry_id) for h in self.running.copy().values()]

    def start(self, batch: Sequence[Held], started_ms: int) -> list[Outcome]:
        """Start ``batch`` (already marked running); return outcomes of those that could not."""
        raise NotImplementedError

    def collect(self, timeout_s: float, until: Callable[[], bool] | None = None) -> list[Outcome]:
        """Outcomes of what finished, waiting up to ``timeout_s`` for the first, or until
        ``until()`` says to stop waiting (an iteration-level runner only)."""
        raise NotImplementedError

    def cancel(self, held: Held) -> None:
        """Stop running ``held`` (its state became final meanwhile)."""

    def close(self) -> None:
        """Stop the engine's background work."""

    def drop_cancelled(self, final_ones: Callable[[list[str]], set[str]]) -> list[Outcome]:
        """Stop running requests that became final meanwhile (cancelled by a client), freeing
        their place; checked every ``CANCEL_CHECK_S``. Writing their outcome only acknowledges
        their entry: the final state is the client's."""
        now_s = time.monotonic()
        if not self.running or now_s - self._last_cancel_check_s < CANCEL_CHECK_S:
            return []
        self._last_cancel_check_s = now_s
        held = list(self.running.values())
        final = final_ones([h.request.id for h in held])
        out = []
        for h in held:
            if h.request.id in final:
                self.cancel(h)
                del self.running[h.key]
                log.info("request %s became final while running (cancelled?)", h.request.id)
                out.append(self.outcomes.cancelled(h))
        return out

    def drop_expired(self) -> list[Outcome]:
        """Stop running requests whose deadline passed (iteration-level runners only: a static
        batch cannot lose a row midway)."""
        return []

    def generation_input(self, held: Held) -> GenerationInput:
        """The engine's view of a held request; a streaming one sends its text as it comes."""
        r = held.request
        on_text = None
        if r.stream:
            request_id, send = r.id, self.send_delta

            def on_text(text: str) -> None:
                send(request_id, text)

        return GenerationInput(
            prompt_ids=held.prompt_ids,
            max_new_tokens=r.max_new_tokens,
            temperature=r.temperature,
            top_p=r.top_p,
            top_k=r.top_k,
            seed=r.seed,
            stop=tuple(r.stop),
            min_p=r.min_p,
            adjust=logit_adjust(r),
            logprobs=r.top_logprobs if r.logprobs else None,
            n=r.n,
            constraint=held.constraint,
            priority=r.priority,
            adapter=r.model,
            on_text=on_text,
            inputs=held.inputs,
            normalize=r.normalize,
            scope="" if held.inputs is None else self._scope(r.tenant),
        )

    def _scope(self, tenant: str) -> str:
        """The scope in which an embedding's repeats meet (``GenerationInput.scope``)."""
        return SHARED_SCOPE if tenant in self.sharing() else tenant


def towards(last: float | None, sample: float, weight: float) -> float:
    """A measured average moved ``weight`` of the way to a new ``sample`` (the sample itself
    when there was none): a runner's times, weighted towards the latest."""
    return sample if last is None else last + weight * (sample - last)
