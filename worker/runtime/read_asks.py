"""What the worker's reads ask for, from what it holds: the room per stream and the probe;
whether the doorbell listener should wake a generating loop; the read made in the loop's place
while a short static batch runs (``batch_reads.py``); and the read a shorter batch's start
carries (``with_start``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from genq.common.connection import is_cluster
from genq.common.settings import WorkerSettings
from genq.worker.policy.lookahead import Held, Lookahead
from genq.worker.policy.ordering import WaitingOrder
from genq.worker.runtime.batch_reads import SHORTEST_MS
from genq.worker.runtime.doorbell import DoorbellListener
from genq.worker.runtime.queue_io import Delivered, QueueIO, Reading
from genq.worker.runtime.runners import Runner


@dataclass(eq=False)
class ReadAsks:
    """The read's arguments, computed from the worker's parts (it changes none of them)."""

    settings: WorkerSettings
    lookahead: Lookahead
    runner: Runner
    order: WaitingOrder
    queue: QueueIO
    doorbell: DoorbellListener

    def room(self) -> dict[str, int]:
        """How many entries to read per stream: the look-ahead's room, within what the runner
        should hold (a continuous runner: only what it can start now, or by preempting a
        lower-priority running request: ``Runner.preemptible_by``)."""
        runner = self.runner
        room = self.lookahead.room(
            runner.read_limit(self.settings.max_batch_size) if runner.limits_reads else None
        )
        if not self.runner.preempts:
            return room
        return self.runner.widen(room, self.queue.keys.priority_of, self.lookahead.priorities())

    def probe(self) -> tuple[int, list[str]]:
        """A static worker with an order that ranks tenants reads, with each priority, up to a
        batch's worth more from tenants it holds none of: a tenant that arrived behind another's
        backlog (a full look-ahead, or a read that brought only that backlog) is seen before
        the next batch is chosen, not after it (``PULL``'s probe)."""
        if not self.order.sees_newcomers or (
            self.runner.limits_reads and self.runner.read_limit(1) is not None
        ):
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

    def beside_batch(self, fetched: dict[str, int]) -> Delivered:
        """The read ``batch_reads`` makes in its thread while the loop is inside the engine:
        the turn's, within the look-ahead's room less what earlier such reads ``fetched``."""
        self.doorbell.take()
        room = {s: n - fetched.get(s, 0) for s, n in self.room().items()}
        total = self.runner.read_total(self.lookahead, self.settings.max_batch_size)
        return self.queue.read(room, probe=self.probe(), total=total)

    def with_start(self, batch: Sequence[Held]) -> Reading:
        """The read ``batch``'s start carries in its round trip (``QueueIO.mark_running``): the
        next batch's candidates, when the last read left a backlog waiting and the batch is
        expected to end before a read beside it could help (``SHORTEST_MS``; a static runner
        that knows its time per step). The next turn then plans at once: one round trip a
        turn instead of two. None (the next turn reads first): anything else, or a Redis
        Cluster (APPLY is a call per request there)."""
        if not self.queue.left_waiting:
            return None
        expected_ms = self.runner.expected_ms(batch)
        if expected_ms is None or expected_ms >= SHORTEST_MS or is_cluster(self.queue.redis):
            return None
        room = self.room()
        return (room, self.probe()) if any(room.values()) else None
