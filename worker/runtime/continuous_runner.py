"""The continuous runner: an iteration-level engine (``continuous``, ``vllm``) behind the
runner's interface. Requests join and leave the running batch at every decode step, each
result is written the moment it finishes, and, with ``--preempt``, running requests yield
their places to higher-priority or (past a time slice) shorter ones that wait, paused and run
again later (``policy/preemption.py`` decides who).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

from genq.common.errors import GenerationError, GenqError
from genq.worker.engines.base import GenerationOutput, IterationEngine, PausingEngine
from genq.worker.policy import preemption
from genq.worker.policy.admission import deadline_passed
from genq.worker.policy.lookahead import Held
from genq.worker.runtime import read_trip
from genq.worker.runtime.clock import now_ms
from genq.worker.runtime.outcomes import Outcome
from genq.worker.runtime.runners import (
    CANCEL_CHECK_S,
    POLL_SLICE_S,
    Runner,
    RunnerContext,
    towards,
)

log = logging.getLogger("genq.worker")

FULL_READ_PACE_S = 1.0
"""With every place taken, how long a read that found nothing waits before the next (a
submission rings the doorbell and ends it at once: this paces only the look for entries that
ring nothing, taken over from dead workers or added by a plain XADD). Polling every
``READ_PACE_S`` there cost a low backlog ~15% of its speed on 2 cores (the priority bench)."""


class ContinuousRunner(Runner):
    """An iteration-level engine: requests join and leave the running batch at every decode
    step, and each result is written the moment it finishes."""

    def __init__(
        self,
        context: RunnerContext,
        *,
        engine: IterationEngine,
        preempt: bool = False,
        time_slice_ms: int = 0,
    ) -> None:
        super().__init__(context)
        self.engine = engine
        self._last_expiry_check_s = 0.0
        self.preempts = preempt and isinstance(engine, PausingEngine)
        """Whether higher-priority requests take running ones' places (``--preempt``, and an
        engine that can pause: ``policy/preemption.py``)."""
        self.time_slice_ms = time_slice_ms if self.preempts else 0
        """A running request's slice while shorter ones of its priority wait (0: none)."""
        self.paused: dict[str, Held] = {}
        """Running requests that gave their place to others (still held)."""
        self._since: dict[str, int] = {}  # when each request's run started, or it was paused
        self._pauses: dict[str, int] = {}  # how many times each yielded its place
        self._ms_per_token: float | None = None
        """A request's time per new token, measured on those that finished (weighted towards
        the latest): what a running one has generated is estimated from it (``_rows``)."""

    limits_reads = True

    def read_limit(self, max_batch_size: int) -> int | None:
        """Only what can start now: the free slots. Requests join at every step, so a candidate
        pool buys nothing here, and entries held waiting would be work another worker could do.
        (A paused request keeps no place: what waited since before it was paused goes first.)"""
        return max(0, max_batch_size - len(self.active()))

    def active(self) -> list[Held]:
        return [h for k, h in self.running.items() if k not in self.paused]

    def _rows(self, held: Sequence[Held]) -> list[preemption.Running]:
        now, per_token = now_ms(), self._ms_per_token
        rows = []
        for h in held:
            since, most = self._since.get(h.key, 0), h.request.max_new_tokens
            done = min(most, int((now - since) / per_token)) if per_token else 0
            rows.append(
                preemption.Running(
                    h.key, h.request.priority, since, self._pauses.get(h.key, 0), most, done
                )
            )
        return rows

    def _timed(self, key: str, finished_ms: int, tokens: int) -> None:
        """Learn the time per new token from a request that finished after ``tokens``."""
        since = self._since.get(key)
        if since and tokens > 0 and finished_ms > since:
            self._ms_per_token = towards(self._ms_per_token, (finished_ms - since) / tokens, 0.2)

    def preemptible_by(self, priority: str) -> int:
        """Running requests below ``priority``; with a time slice, one more if any of its
        priority or below ran past its slice (a read brings one request to weigh against it)."""
        if not self.preempts:
            return 0
        # One pass, nothing built: a turn asks this about a dozen times, of every running
        # request (256 of them on a GPU).
        rank, ranks, now = preemption.RANK[priority], preemption.RANK, now_ms()
        base, below, past = self.time_slice_ms, 0, False
        for key, h in self.running.items():
            r = ranks[h.request.priority]
            if key in self.paused or r > rank:
                continue
            below += r < rank
            past = past or preemption.ran_past_slice(
                self._since.get(key, 0), self._pauses.get(key, 0), now, base
            )
        return below + past

    def read_pace_s(self, max_batch_size: int) -> float:
        """None while a paused request could take a free place (what waits in the queue is
        weighed against it first: ``preemption.to_resume``); ``FULL_READ_PACE_S`` while every
        place is taken (a read can then bring only what preempts, and a submission rings)."""
        active = len(self.active())
        if not self.busy or (self.paused and active < max_batch_size):
            return 0.0
        return FULL_READ_PACE_S if active >= max_batch_size else read_trip.READ_PACE_S

    def rebalance(
        self, asks: Callable[[], Sequence[preemption.Waiting]], max_batch_size: int
    ) -> None:
        if not self.preempts:
            return
        assert isinstance(self.engine, PausingEngine)
        waiting = asks()
        if not waiting and not self.paused:
            return  # nothing to resume, nobody to yield to
        now = now_ms()
        free = max_batch_size - len(self.active())
        for key in preemption.to_resume(self._rows(list(self.paused.values())), waiting, free):
            self.engine.resume(key)
            del self.paused[key]
            self._since[key] = now
            free -= 1
        chosen = preemption.victims(
            self._rows(self.active()),
            waiting,
            free,
            now_ms=now,
            base_slice_ms=self.time_slice_ms,
        )
        for key in chosen:
            if self.engine.pause(key):  # (False: it ended meanwhile)
                self.paused[key] = self.running[key]
                self._since[key] = now
                self._pauses[key] = self._pauses.get(key, 0) + 1
                self.counters.preempted += 1
                log.debug("request %s yields its place", key)

    def start(self, batch: Sequence[Held], started_ms: int) -> list[Outcome]:
        """Submit each request to the engine; one it refuses fails alone."""
        failed = []
        for h in batch:
            try:
                self.engine.submit(h.key, self.generation_input(h))
            except GenqError as err:
                failed.append(self.outcomes.failed_held(h, err, started_ms))
                continue
            h.started_ms = started_ms
            self._since[h.key] = started_ms
            self.running[h.key] = h
        self.counters.batch(len(self.running))
        return failed

    def collect(self, timeout_s: float, until: Callable[[], bool] | None = None) -> list[Outcome]:
        """Results of the requests that finished (waiting up to ``timeout_s`` for one, in
        ``POLL_SLICE_S`` slices while ``until`` is given and says to go on)."""
        if not self.running:
            return []
        t0 = time.perf_counter()
        done = self._poll(timeout_s, until)
        self.counters.generation_ms += int((time.perf_counter() - t0) * 1000)
        finished_ms = now_ms()
        out = []
        for key, result in done:
            h = self.running.pop(key, None)
            if self.time_slice_ms and isinstance(result, GenerationOutput):
                self._timed(key, finished_ms, result.completion_tokens)
            self._forget(key)  # (paused: its run ended before its pause reached the engine)
            if h is None:
                continue
            started_ms = h.started_ms or finished_ms
            if isinstance(result, GenqError):  # refused by the engine: the request's fault
                out.append(self.outcomes.failed_held(h, result, started_ms))
                continue
            if isinstance(result, str):
                err = GenerationError(f"the engine failed on this request: {result}")
                out.append(self.outcomes.failed_held(h, err, started_ms))
                continue
            self.counters.generated_one(
                prompt_tokens=len(h.prompt_ids),
                completion_tokens=result.completion_tokens,
                cached_tokens=result.cached_tokens,
            )
            self.metrics.batch(1, 0, (finished_ms - started_ms) / 1000)
            out.append(
                self.outcomes.succeeded(
                    h,
                    result,
                    started_ms=started_ms,
                    finished_ms=finished_ms,
                    generation_ms=finished_ms - started_ms,
                    batch_size=len(self.running) + 1,
                )
            )
        return out

    def _poll(
        self, timeout_s: float, until: Callable[[], bool] | None
    ) -> list[tuple[str, GenerationOutput | str | GenqError]]:
        if until is None:
            return self.engine.poll(timeout_s)
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            done = self.engine.poll(max(0.0, min(POLL_SLICE_S, left)))
            if done or left <= POLL_SLICE_S or until():
                return done

    def cancel(self, held: Held) -> None:
        """Free the request's place in the running batch (or drop it, paused)."""
        self.engine.cancel(held.key)
        self._forget(held.key)

    def _forget(self, key: str) -> None:
        self.paused.pop(key, None)
        self._since.pop(key, None)
        self._pauses.pop(key, None)

    def drop_expired(self) -> list[Outcome]:
        """Stop running requests whose deadline passed, freeing their place: they end
        ``expired`` (checked every ``CANCEL_CHECK_S``, with the cancel check)."""
        if not self.running or time.monotonic() - self._last_expiry_check_s < CANCEL_CHECK_S:
            return []
        self._last_expiry_check_s = time.monotonic()
        now = now_ms()
        out = []
        for h in list(self.running.values()):
            if deadline_passed(h.request, now, h.enqueued_ms):
                self.cancel(h)
                del self.running[h.key]
                log.info("request %s: deadline passed while generating; stopped", h.request.id)
                out.append(self.outcomes.expired_running(h, h.started_ms or now))
        return out

    def close(self) -> None:
        """Stop the engine's thread."""
        self.engine.close()
