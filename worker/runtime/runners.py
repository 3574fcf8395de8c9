"""Runners: an engine behind the one interface the worker's turn uses (``Runner``), and the
static runner (the continuous one is ``continuous_runner.py``; ``builder.make_runner`` picks).

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
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from genq.common.errors import GenerationError
from genq.worker.engines.base import (
    Engine,
    GenerationInput,
    logit_adjust,
)
from genq.worker.policy import preemption
from genq.worker.policy.budget import AdaptiveBudget
from genq.worker.policy.lookahead import Held, Lookahead
from genq.worker.runtime import read_trip
from genq.worker.runtime.clock import now_ms
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
    holds_loop_ms: float | None = None
    """How long the batch just started should keep the loop busy, expected (a runner whose loop
    is busy while a batch runs: ``hands_back``; set by ``start``); None: nothing running, not
    known, or the loop goes on while it runs."""

    def __init__(self, context: RunnerContext) -> None:
        self.outcomes = context.outcomes
        self.counters = context.counters
        self.metrics = context.metrics
        self.send_delta = context.send_delta
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
        )


def towards(last: float | None, sample: float, weight: float) -> float:
    """A measured average moved ``weight`` of the way to a new ``sample`` (the sample itself
    when there was none): a runner's times, weighted towards the latest."""
    return sample if last is None else last + weight * (sample - last)


class StaticRunner(Runner):
    """One ``generate`` call per batch. If the engine raises, the batch is split in halves and
    each run again, down to single requests, so that the culprit fails with the error and its
    batch-mates succeed. Out of memory also lowers the budget (``AdaptiveBudget``); only a
    request that runs out of memory alone fails."""

    waits_to_fill = True
    hands_back = True

    def __init__(self, context: RunnerContext, *, engine: Engine, budget: AdaptiveBudget) -> None:
        super().__init__(context)
        self.engine = engine
        self.budget = budget
        self._started_ms = 0
        # Measured, weighted towards recent batches; before the first, what the engine says
        # (an optional ``ms_per_step``: echo's ``--echo-step-ms``), if it knows.
        self._ms_per_step: float | None = getattr(engine, "ms_per_step", None)

    def start(self, batch: Sequence[Held], started_ms: int) -> list[Outcome]:
        """Hold the batch: it runs in ``collect``, in the same turn. It will hold the loop
        (``holds_loop_ms``) for the measured time per decode step times its longest
        ``max_new_tokens``; ``FIRST_BATCH_GUESS_MS`` before any batch was measured (unless the
        engine knows its time per step)."""
        self.running.update((h.key, h) for h in batch)
        self._started_ms = started_ms
        per_step = self._ms_per_step  # (``expected_ms``, inlined: on every batch's path)
        steps = max((h.request.max_new_tokens for h in batch), default=0)
        self.holds_loop_ms = FIRST_BATCH_GUESS_MS if per_step is None else per_step * steps
        return []

    def expected_ms(self, batch: Sequence[Held]) -> float | None:
        """The measured time per decode step times the batch's longest ``max_new_tokens``."""
        per_step = self._ms_per_step
        if per_step is None:
            return None
        return per_step * max((h.request.max_new_tokens for h in batch), default=0)

    def collect(self, timeout_s: float, until: Callable[[], bool] | None = None) -> list[Outcome]:
        """Run the batch started this turn to the end."""
        batch = list(self.running.values())
        try:
            return self._generate(batch)
        finally:
            self.running.clear()
            self.holds_loop_ms = None

    def _generate(self, batch: list[Held]) -> list[Outcome]:
        if not batch:
            return []
        t0 = time.perf_counter()
        try:
            report = self.engine.generate([self.generation_input(h) for h in batch])
        except Exception as err:  # an engine can raise anything; isolate the culprit(s)
            return self._isolate(batch, err)
        elapsed_ms = (time.perf_counter() - t0) * 1000
        generation_ms = int(elapsed_ms)
        step_ms = elapsed_ms / max(h.request.max_new_tokens for h in batch)
        self._ms_per_step = towards(self._ms_per_step, step_ms, 0.3)
        self.counters.generated(report, generation_ms)
        tokens = report.prompt_tokens + report.completion_tokens
        if self.metrics.enabled:
            self.metrics.batch(len(batch), tokens, generation_ms / 1000)
        finished_ms = now_ms()
        return [
            self.outcomes.succeeded(
                h,
                out,
                started_ms=self._started_ms,
                finished_ms=finished_ms,
                generation_ms=generation_ms,
                batch_size=len(batch),
            )
            for h, out in zip(batch, report.outputs, strict=True)
        ]

    def _isolate(self, batch: list[Held], err: Exception) -> list[Outcome]:
        """The batch failed: halve it and run each half (the budget lowered on out of
        memory); a single request fails with the error."""
        oom = is_out_of_memory(err)
        if oom:
            self.counters.oom_splits += 1
            budget = self.budget.lower(sum(h.cost_tokens for h in batch), time.monotonic())
            log.warning(
                "out of memory: batch budget lowered to %d tokens for %.0f s",
                budget,
                self.budget.backoff_s,
            )
        if len(batch) == 1:
            h = batch[0]
            log.warning("request %s failed in the engine: %r", h.request.id, err)
            why = (
                f"out of memory even alone ({len(h.prompt_ids)} prompt tokens + "
                f"{h.request.max_new_tokens} new): ask for fewer tokens, or run a worker "
                "with more memory"
                if oom
                else f"the engine failed on this request: {err}"
            )
            return [self.outcomes.failed_held(h, GenerationError(why), self._started_ms)]
        half = len(batch) // 2
        log.warning("batch of %d failed (%s); splitting it in two", len(batch), type(err).__name__)
        return self._generate(batch[:half]) + self._generate(batch[half:])


def is_out_of_memory(err: BaseException) -> bool:
    """torch.OutOfMemoryError (CUDA, MPS) or the allocator's message, without importing torch."""
    return type(err).__name__ == "OutOfMemoryError" or "out of memory" in str(err).lower()
