"""The static runner: one ``generate`` call per batch, run inside the turn (``collect``),
bisected on failure; with ``--preempt`` and a stoppable engine, a batch stops between two decode
steps for a request of a higher priority (the doorbell's ring says which a submission brings),
waits, still held, and runs again from its prompts once what outranks it has run.
"""

from __future__ import annotations

import inspect
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import cast

from genq.common.errors import GenerationError
from genq.worker.engines.base import (
    Engine,
    GenerationInput,
    Replayed,
    StoppableEngine,
    StoppedEarly,
)
from genq.worker.policy import preemption
from genq.worker.policy.budget import AdaptiveBudget
from genq.worker.policy.lookahead import Held
from genq.worker.runtime.clock import now_ms
from genq.worker.runtime.outcomes import Outcome
from genq.worker.runtime.runners import FIRST_BATCH_GUESS_MS, Runner, RunnerContext, towards

log = logging.getLogger("genq.worker")

STOP_WORTH_MS = 20.0
"""A batch expected to end sooner than this is not stopped for a higher priority (the high
request waits for it at most this long, and listening to the doorbell for it costs a read: an
echo batch of 0 ms steps; a tiny model's 400 steps, ~80 ms here, are worth stopping)."""


def _takes_stop(engine: Engine) -> bool:
    """Whether ``engine.generate`` takes a ``stop`` event (``StoppableEngine``)."""
    if not getattr(engine, "stoppable", False):
        return False
    return "stop" in inspect.signature(engine.generate).parameters


INPUT_STEP_TOKENS = 1_000
"""An embedding batch's "step" (it decodes none): this many input tokens, so that its expected
time grows with what its passes compute, as a generating batch's grows with its steps."""


def _input_steps(batch: Sequence[Held]) -> float:
    """An embedding batch's length in steps: its input tokens in ``INPUT_STEP_TOKENS``."""
    return max(1, sum(len(h.prompt_ids) for h in batch)) / INPUT_STEP_TOKENS


class StaticRunner(Runner):
    """One ``generate`` call per batch. If the engine raises, the batch is split in halves and
    each run again, down to single requests, so that the culprit fails with the error and its
    batch-mates succeed. Out of memory also lowers the budget (``AdaptiveBudget``); only a
    request that runs out of memory alone fails."""

    waits_to_fill = True
    hands_back = True

    def __init__(
        self,
        context: RunnerContext,
        *,
        engine: Engine,
        budget: AdaptiveBudget,
        preempt: bool = False,
    ) -> None:
        super().__init__(context)
        self.engine = engine
        self.budget = budget
        self._started_ms = 0
        self.stops = preempt and _takes_stop(engine)
        """Whether a batch stops between two decode steps for a request that outranks it
        (``--preempt`` and a stoppable engine: ``StoppableEngine``). A submission's doorbell
        ring says the highest priority it brings (``outranked``); the stopped batch waits,
        still held, and runs again from its prompts once what outranks it has run."""
        self._batches: list[tuple[int, list[Held]]] = []
        """The batches started and not run to their end, with their priority rank: the one
        started this turn, and those that stopped (the earliest first)."""
        self._stop = threading.Event()
        self._rank = preemption.RANK["high"]  # the running batch's (none: nothing outranks it)
        self._heard = 0  # the highest rank a ring brought since the last batch ran
        self._streams: dict[str, Replayed] = {}  # streaming requests of a batch that may stop
        # Measured, weighted towards recent batches; before the first, what the engine says
        # (an optional ``ms_per_step``: echo's ``--echo-step-ms``), if it knows.
        self._ms_per_step: float | None = getattr(engine, "ms_per_step", None)

    def start(self, batch: Sequence[Held], started_ms: int) -> list[Outcome]:
        """Hold the batch: it runs in ``collect``, in the same turn. It will hold the loop
        (``holds_loop_ms``) for the measured time per decode step times its longest
        ``max_new_tokens``; ``FIRST_BATCH_GUESS_MS`` before any batch was measured (unless the
        engine knows its time per step)."""
        self.running.update((h.key, h) for h in batch)
        rank, ranks = 0, preemption.RANK
        for h in batch:  # (its outcomes' start, should it stop and wait)
            h.started_ms = started_ms
            rank = max(rank, ranks[h.request.priority])
        if batch:
            self._batches.append((rank, list(batch)))
        self._started_ms = self.batch_started_ms = started_ms
        per_step = self._ms_per_step  # (``expected_ms``, inlined: on every batch's path)
        steps = max((h.request.max_new_tokens for h in batch), default=1) or _input_steps(batch)
        self.holds_loop_ms = FIRST_BATCH_GUESS_MS if per_step is None else per_step * steps
        if self.stops and rank < ranks["high"] and self.holds_loop_ms >= STOP_WORTH_MS:
            self.stoppable = True  # (one shorter ends before a stop would help)
        return []

    def expected_ms(self, batch: Sequence[Held]) -> float | None:
        """The measured time per decode step times the batch's longest ``max_new_tokens``."""
        per_step = self._ms_per_step
        if per_step is None:
            return None
        return per_step * (
            max((h.request.max_new_tokens for h in batch), default=1) or _input_steps(batch)
        )

    def active(self) -> list[Held]:
        """Nothing between turns: a batch runs within its turn (one that stopped waits apart)."""
        return []

    def outranked(self, priority: str) -> None:
        """The running batch stops at its next step if ``priority`` outranks it (one not
        started yet, once it starts)."""
        rank = preemption.RANK[priority]
        self._heard = max(self._heard, rank)
        if rank > self._rank:
            self._stop.set()

    def collect(self, timeout_s: float, until: Callable[[], bool] | None = None) -> list[Outcome]:
        """Run one batch to the end: the highest priority of those held, the earliest first
        (the one started this turn, unless one that stopped outranks it or is its like)."""
        if not self._batches:
            return []
        at = 0
        for k in range(1, len(self._batches)):
            if self._batches[k][0] > self._batches[at][0]:
                at = k
        top, batch = self._batches.pop(at)
        self._started_ms = batch[0].started_ms or self._started_ms
        if self._heard > top:  # (a ring heard before it started)
            self._stop.set()
        self._rank = top
        try:
            return self._generate(batch)
        finally:
            self._rank, self._heard = preemption.RANK["high"], 0
            self._stop.clear()
            kept: set[str] = set()  # (those that stopped wait, still running)
            for _, b in self._batches:
                for h in b:
                    kept.add(h.key)
            for h in batch:
                if h.key not in kept:
                    self.running.pop(h.key, None)
                    self._streams.pop(h.key, None)
            if self._batches or self.stoppable:  # (else nothing changed)
                self._held_changed()
            self.holds_loop_ms = None

    def _held_changed(self) -> None:
        """``stopped_rank`` and ``stoppable`` from the batches that stopped and wait."""
        top = 0
        for rank, _ in self._batches:
            top = max(top, rank)
        self.stopped_rank = top
        self.stoppable = bool(self._batches) and top < preemption.RANK["high"]

    def cancel(self, held: Held) -> None:
        """Drop ``held`` from the batch that stopped and waits (its state became final)."""
        self._streams.pop(held.key, None)
        for _, b in self._batches:
            if held in b:
                b.remove(held)
        self._batches = [(r, b) for r, b in self._batches if b]
        self._held_changed()

    def close(self) -> None:
        """End the engine's processes where it has any (vLLM's pooling runner)."""
        close = getattr(self.engine, "close", None)
        if close is not None:
            close()

    def _generate(self, batch: list[Held]) -> list[Outcome]:
        if not batch:
            return []
        t0 = time.perf_counter()
        rows = [self.generation_input(h) for h in batch]
        if self.stops:
            pairs = zip(batch, rows, strict=True)
            rows = [self._replayed(h, row) if row.on_text else row for h, row in pairs]
        try:
            if self.stops:
                report = cast(StoppableEngine, self.engine).generate(rows, stop=self._stop)
            else:
                report = self.engine.generate(rows)
        except StoppedEarly:  # it runs again, from its prompts, after what outranks it
            self._batches.insert(0, (self._rank, batch))
            self.counters.preempted += len(batch)
            log.debug("a batch of %d yields to a higher priority", len(batch))
            return []
        except Exception as err:  # an engine can raise anything; isolate the culprit(s)
            return self._isolate(batch, err)
        elapsed_ms = (time.perf_counter() - t0) * 1000
        generation_ms = int(elapsed_ms)
        steps = max((h.request.max_new_tokens for h in batch), default=0) or _input_steps(batch)
        step_ms = elapsed_ms / steps
        self._ms_per_step = towards(self._ms_per_step, step_ms, 0.3)
        self.counters.generated(report, generation_ms)
        tokens = report.prompt_tokens + report.completion_tokens
        if self.metrics.enabled:
            self.metrics.batch(len(batch), tokens, generation_ms / 1000)
            if report.inputs:
                computed = report.prompt_tokens - report.cached_tokens
                self.metrics.embedded(report.inputs, computed, report.saved_inputs)
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

    def _replayed(self, held: Held, row: GenerationInput) -> GenerationInput:
        """A streaming ``row`` whose text goes through its ``Replayed``, where a batch may
        stop (a run again sends nothing twice)."""
        assert row.on_text is not None
        stream = self._streams.get(held.key)
        if stream is None:
            stream = self._streams[held.key] = Replayed(row.on_text)
        stream.restart()
        return replace(row, on_text=stream)

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
