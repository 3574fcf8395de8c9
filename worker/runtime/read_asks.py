"""What the worker's reads ask for, from what it holds: the room per stream and the probe, and
whether the doorbell listener should wake a generating loop (``reader.py`` makes the reads)."""

from __future__ import annotations

from dataclasses import dataclass

from genq.common.keys import Keys
from genq.common.settings import WorkerSettings
from genq.worker.policy.lookahead import Lookahead
from genq.worker.policy.ordering import WaitingOrder
from genq.worker.runtime.model_pool import ModelPool
from genq.worker.runtime.runners import Runner


@dataclass(eq=False)
class ReadAsks:
    """The read's arguments, computed from the worker's parts (it changes none of them)."""

    settings: WorkerSettings
    lookahead: Lookahead
    runner: Runner
    order: WaitingOrder
    keys: Keys
    pool: ModelPool | None = None  # a pool of models: only the lanes of those it holds

    def room(self) -> dict[str, int]:
        """How many entries to read per stream: the look-ahead's room, within what the runner
        should hold (a continuous runner: only what it can start now, or by preempting a
        lower-priority running request: ``Runner.preemptible_by``); with a pool of models,
        none from the lanes of models it does not hold."""
        runner = self.runner
        room = self.lookahead.room(
            runner.read_limit(self.settings.max_batch_size) if runner.limits_reads else None
        )
        if self.runner.preempts:
            room = self.runner.widen(room, self.keys.priority_of, self.lookahead.priorities())
        if self.pool is not None:
            readable = self.pool.readable
            room = {s: n if s in readable else 0 for s, n in room.items()}
        return room

    def probe(self) -> tuple[int, list[str]]:
        """A static worker with an order that ranks tenants reads, with each priority, up to a
        batch's worth more from tenants it holds none of: a tenant that arrived behind another's
        backlog (a full look-ahead, or a read that brought only that backlog) is seen before
        the next batch is chosen, not after it (``PULL``'s probe). Not with a pool of models:
        the probe would read the lanes of models it does not hold."""
        if not self.order.sees_newcomers or (
            self.runner.limits_reads and self.runner.read_limit(1) is not None
        ):
            return 0, []
        if self.pool is not None:  # (the probe reads every lane: a pool reads only its own)
            return 0, []
        return self.settings.max_batch_size, self.lookahead.held_tenants()

    def listens(self) -> bool:
        """Whether the doorbell listener should wake this turn's wait on the engine: an
        iteration-level runner is generating and has room for more (``doorbell.py``)."""
        runner = self.runner
        if not (runner.limits_reads and runner.busy):
            return False
        if runner.read_limit(self.settings.max_batch_size) is None:
            return False
        return any(n > 0 for n in self.room().values())
