"""A static group: rows the continuous engine runs apart from its manager (sampled, adjusted,
constrained, with logprobs or ``n`` > 1), as one ``StaticEngine`` batch in a thread of its own,
so that the worker's loop goes on reading while it runs, and stoppable between two decode
steps (``stop``), so that a higher-priority request does not wait for it to end.

A stopped group's rows are run again from their prompts: each sampled row carries a seed fixed
when it was submitted (``seeded``), so the run again generates the same text, and a streaming
row's text goes through a ``Replayed``, so it sends nothing twice."""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from dataclasses import replace

from genq.worker.engines.base import (
    GenerationInput,
    GenerationOutput,
    Replayed,
    StoppedEarly,
)
from genq.worker.engines.static import StaticEngine
from genq.worker.policy.preemption import RANK


def seeded(row: GenerationInput) -> GenerationInput:
    """``row`` as it waits for a group: with a seed of its own if it samples without one
    (drawn once, so that a run again after a stop draws the same tokens), and its stream
    through a ``Replayed`` (a run again sends nothing twice)."""
    seed = row.seed
    if row.temperature > 0 and seed is None:
        seed = int.from_bytes(os.urandom(8), "little") >> 1
    on_text = row.on_text
    if on_text is not None and not isinstance(on_text, Replayed):
        on_text = Replayed(on_text)
    if seed == row.seed and on_text is row.on_text:
        return row
    return replace(row, seed=seed, on_text=on_text)


class StaticGroup:
    """One static batch in its own thread: ``wait`` for it, then read ``outputs`` (None: it
    was stopped, or failed: ``error``)."""

    def __init__(
        self,
        engine: StaticEngine,
        keys: Sequence[str],
        rows: Sequence[GenerationInput],
    ) -> None:
        self.keys = list(keys)
        self.rows = list(rows)
        self.rank = max(RANK[r.priority] for r in rows)
        """The group's priority rank (its rows share one: ``ContinuousEngine`` groups by it)."""
        self.outputs: list[GenerationOutput] | None = None
        self.error: str | None = None
        """Why ``generate`` failed (reported per request, as the manager reports its errors)."""
        self._stop = threading.Event()
        self._done = threading.Event()
        for r in self.rows:
            if isinstance(r.on_text, Replayed):
                r.on_text.restart()  # (from its prompt: what it sent before is not sent again)
        self._thread = threading.Thread(
            target=self._run, args=(engine,), name="genq-static-group", daemon=True
        )
        self._thread.start()

    def _run(self, engine: StaticEngine) -> None:
        try:
            self.outputs = engine.generate(self.rows, stop=self._stop).outputs
        except StoppedEarly:
            pass
        except Exception as err:  # reported per request, as the manager reports its errors
            self.error = f"{type(err).__name__}: {err}"
        finally:
            self._done.set()

    def stop(self) -> None:
        """End the group at the next decode step boundary (its rows are to run again)."""
        self._stop.set()

    @property
    def stopping(self) -> bool:
        """Whether ``stop`` was called."""
        return self._stop.is_set()

    def wait(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for the group to end; whether it has."""
        return self._done.wait(timeout_s)

    def close(self) -> None:
        """Stop the group and wait for its thread."""
        self.stop()
        self._thread.join()


Result = GenerationOutput | str
"""A row's output, or why its group failed."""


class StaticGroups:
    """The continuous engine's rows that run apart: those waiting (``waiting``) and the group
    running (``running``), started one at a time, the highest priority among them first."""

    def __init__(self, engine: StaticEngine) -> None:
        self.engine = engine
        self.waiting: dict[str, GenerationInput] = {}
        self.running: StaticGroup | None = None
        self.grouped: dict[str, GenerationInput] = {}
        """The running group's rows, less those paused or cancelled since it started."""

    def __len__(self) -> int:
        return len(self.waiting) + len(self.grouped)

    def add(self, key: str, row: GenerationInput) -> None:
        """``row`` waits for a group (its seed fixed now: ``seeded``)."""
        self.waiting[key] = seeded(row)

    def ahead_of(self, row: GenerationInput) -> bool:
        """Whether rows of ``row``'s priority or above wait for a group (they go first)."""
        rank = RANK[row.priority]
        return any(RANK[w.priority] >= rank for w in self.waiting.values())

    def outranked_by(self, row: GenerationInput) -> None:
        """Stop the running group if ``row`` outranks it (it then runs first)."""
        group = self.running
        if group is not None and not group.stopping and RANK[row.priority] > group.rank:
            group.stop()

    def drop(self, key: str) -> None:
        """Forget ``key`` (cancelled): a running group runs on for its other rows."""
        self.waiting.pop(key, None)
        self.grouped.pop(key, None)

    def take(self, key: str) -> GenerationInput | None:
        """Take ``key`` out (paused or cancelled): waiting, or a row of the running group, which
        then stops (its other rows run again); None where it is neither."""
        row = self.waiting.pop(key, None)
        if row is None and (row := self.grouped.pop(key, None)) is not None:
            assert self.running is not None
            self.running.stop()
        return row

    def start(self) -> None:
        """Run the waiting rows of the highest priority among them as one group."""
        top = max(RANK[r.priority] for r in self.waiting.values())
        keys = [k for k, r in self.waiting.items() if RANK[r.priority] == top]
        self.grouped = {k: self.waiting.pop(k) for k in keys}
        self.running = StaticGroup(self.engine, keys, list(self.grouped.values()))

    def end(self, paused: dict[str, GenerationInput]) -> list[tuple[str, Result]]:
        """The ended group's results (a row ``paused`` after its group completed ends too, and
        leaves ``paused``); a stopped group's rows wait to run again, ahead of those that came
        after them."""
        group, grouped = self.running, self.grouped
        assert group is not None
        self.running, self.grouped = None, {}
        if group.outputs is None and group.error is None:  # stopped: its rows run again
            self.waiting = {**grouped, **self.waiting}
            return []
        done: list[tuple[str, Result]] = []
        for i, key in enumerate(group.keys):
            if key not in grouped and paused.pop(key, None) is None:
                continue  # cancelled meanwhile
            out = group.outputs[i] if group.outputs is not None else group.error
            done.append((key, out or "the static group ended without an output"))
        return done

    def close(self) -> None:
        """Stop the running group, if any, and wait for its thread."""
        if self.running is not None:
            self.running.close()
            self.running = None
