"""The reader: every way a worker gets requests, behind one part.

The worker's turn asks the reader for requests once (``read``) and hands it the engine's time
(``collect``); the reader chooses how:

    carried:   the last start's round trip carried the next read (``with_start``): plan at once;
    beside:    while a short static batch ran, the batch-reads thread read in the loop's place
               (``batch_reads.py``): what it read is admitted, and the turn plans at once;
    read:      otherwise one read round trip (``read_trip.py``), paced while the engine is busy
               or the worker idles, not paced after a ring;
    reclaim:   dead workers' entries, taken over within the room (every claim_idle_ms / 4);
    pool:      with several models, only the lanes of those it holds; the swaps
               (``model_pool.py``) change them between reads;
    resume:    this consumer's own pending entries, when it joins;
    idle:      nothing to start: a block on the doorbell (``doorbell.py``), which a
               submission or a hand-back rings.

While the engine runs (``collect``), the doorbell listener wakes an iteration-level engine's
wait when a request arrives, and the batch-reads thread reads beside a static batch. What to
ask for (the room per stream, the probe) comes from ``read_asks.py``; what other concepts send
with every read (refunds, holds, weights) rides the round trip (``read_trip.Rider``), named by
``build_worker``. Admission is the worker's: each path hands what it got to ``admit``.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Sequence

from genq.common.connection import MAX_BLOCK_MS
from genq.common.settings import WorkerSettings
from genq.worker.policy.lookahead import Held, Lookahead
from genq.worker.runtime import recovery
from genq.worker.runtime.batch_reads import SHORTEST_MS, ReadsDuringBatch
from genq.worker.runtime.doorbell import DoorbellListener
from genq.worker.runtime.heartbeat import Counters
from genq.worker.runtime.model_pool import ModelPool
from genq.worker.runtime.outcomes import Outcome
from genq.worker.runtime.read_asks import ReadAsks
from genq.worker.runtime.read_trip import CarriedRead, Delivered, ReadTrip
from genq.worker.runtime.runners import POLL_S, Runner

log = logging.getLogger("genq.worker")

REDIS_TICK_MS = 100
"""Redis' timer tick at its default ``hz`` (10): the resolution of a blocked read's timeout."""

Admit = Callable[[Delivered, bool], None]
"""The worker's admission: what a read brought, and whether it was delivered before (resumed,
taken over: ``Held.suspect``)."""


class Reader:
    """One worker's reads, by every path (see the module's docstring)."""

    def __init__(
        self,
        *,
        settings: WorkerSettings,
        trip: ReadTrip,
        asks: ReadAsks,
        lookahead: Lookahead,
        runner: Runner,
        doorbell: DoorbellListener,
        counters: Counters,
        exchange: Callable[[], None] | None = None,
        pool: ModelPool | None = None,
    ) -> None:
        self.trip = trip
        self.asks = asks
        self.lookahead = lookahead
        self.runner = runner
        self.doorbell = doorbell
        self.counters = counters
        self.pool = pool
        """A pool of models (None: one model): which lanes are read, and the swaps."""
        self.batch_reads = ReadsDuringBatch(self.beside_batch, exchange)
        """The thread that reads while a short static batch runs (``exchange``: the start
        spacing's, which it calls as a window opens)."""
        self.cluster = trip.cluster
        self.max_batch_size = settings.max_batch_size
        self.hand_back_after_ms = settings.hand_back_after_ms
        self.claim_idle_ms = settings.claim_idle_ms
        self.idle_block_ms, self.idle_pace_s = idle_waits(settings)
        """An idle worker's longest block on the doorbell, and its read's pace (``idle_waits``)."""
        self.reclaim_at_s = 0.0
        """When ``reclaim`` looks for dead workers' entries next (monotonic s)."""
        self._covered = False  # the last start carried a read (``carried``)
        self.backlog = False
        """Whether this turn's start may carry the next read (``with_start``): reading, and
        the last read left a backlog waiting."""

    def start(self) -> None:
        """Start the doorbell listener and the batch-reads thread."""
        self.doorbell.start()
        self.batch_reads.start()

    def stop(self) -> None:
        """Stop both threads (after a read in flight), and wait for a pool's load to end."""
        self.doorbell.stop()
        self.batch_reads.stop()
        if self.pool is not None:
            self.pool.stop()

    def entries(self) -> list[tuple[str, str]]:
        """(stream, entry id) of what was read and not admitted yet (safe from any thread)."""
        return self.batch_reads.entries()

    def resume(self, admit: Admit) -> int:
        """Take back this consumer's own pending entries (``recovery.resume_own``); a pool's
        first models start loading (its lanes are read once they are loaded)."""
        if self.pool is not None:
            self.pool.start()
        trip = self.trip
        resumed = recovery.resume_own(
            trip.redis,
            trip.keys.streams(),
            trip.consumer,
            self.asks.room,
            lambda stream, entries: admit([(stream, entries)], True),
        )
        if resumed:
            log.info("resumed %d pending entries of consumer %s", resumed, trip.consumer)
        return resumed

    def read(self, admit: Admit, reading: bool = True) -> None:
        """The turn's requests: what the batch-reads thread read meanwhile; then, reading,
        dead workers' entries when due, and a read unless the last start's or the batch-reads
        thread's read covered the turn (the turn plans at once). The read is paced while the
        runner says so, or while idle (``idle_pace_s``), unless the doorbell rang."""
        covered, self._covered = self._covered, False
        if self.batch_reads.taken is False:  # a window opened since the last take
            fetched, covered = self.batch_reads.take()
            admit(fetched, False)
        if reading and self.pool is not None:  # (its swaps change which lanes are read)
            self.pool.look(self.lookahead, self.runner.running.values())
        if reading and time.monotonic() >= self.reclaim_at_s:
            self.reclaim(admit)
        if reading and not (covered and self.lookahead.waiting):
            room, probe = self.asks.room(), self.asks.probe()
            runner, size = self.runner, self.max_batch_size
            total = runner.read_total(self.lookahead, size) if runner.limits_reads else 0
            rung, running = self.doorbell.take(), runner.running
            s = runner.read_pace_s(size) if running else 0.0  # (0 for an idle runner)
            if not (s or running or self.trip.left_waiting or self.lookahead.waiting):
                s = self.idle_pace_s  # idle: a ring ends the wait (``idle``)
            admit(self.trip.read(room, probe, total, pace_s=0.0 if rung else s), False)
        self.backlog = reading and self.trip.left_waiting > 0

    def reclaim(self, admit: Admit) -> None:
        """Take over entries idle for ``claim_idle_ms`` (their worker died: live workers renew
        theirs), within the look-ahead's room; looked for at most every ``claim_idle_ms / 4``."""
        self.reclaim_at_s = time.monotonic() + self.claim_idle_ms / 4000
        trip, taken = self.trip, []
        for stream, n in self.asks.room().items():
            if n <= 0:
                continue
            entries = recovery.claim_idle(
                trip.redis, stream, trip.consumer, min_idle_ms=self.claim_idle_ms, count=n
            )
            if entries:
                log.info("took over %d entries of %s from dead workers", len(entries), stream)
                taken.append((stream, entries))
        for stream, entries in taken:
            self.counters.reclaimed += len(entries)
            admit([(stream, entries)], True)

    def collect(self, reading: bool) -> list[Outcome]:
        """The engine's time: the runner works until the next read is due, or the doorbell
        rings when it ``listens`` (an iteration-level engine generating with room for more).
        While a static batch runs, the batch-reads thread reads in the loop's place (a batch
        expected to take from ``SHORTEST_MS`` to ``hand_back_after_ms``: a longer one handed
        back what waited here). What finished, in order."""
        listening = reading and self.runner.limits_reads and self.asks.listens()
        busy_ms = self.runner.holds_loop_ms if reading and not listening else None
        beside = busy_ms is not None and SHORTEST_MS <= busy_ms < self.hand_back_after_ms
        stoppable = reading and self.runner.stoppable  # (a ring above the batch stops it)
        if listening or beside or stoppable or self.doorbell.armed:  # (else it stays unarmed)
            self.doorbell.arm(
                listening or beside or stoppable,
                self.batch_reads.ring if beside else None,
                self.runner.outranked if stoppable else None,
                self.runner.batch_started_ms if stoppable else None,
            )
        until = self.doorbell.rung if listening else None
        window = self.batch_reads.window(busy_ms) if beside and busy_ms else None
        with window or contextlib.nullcontext():
            return self.runner.collect(max(POLL_S, self.trip.read_wait_s()), until=until)

    def idle(self, fill_wait_ms: int | None, stopping: threading.Event) -> None:
        """Nothing to start: block on the doorbell, or wait ``fill_wait_ms`` for a batch to
        fill; the next turn reads (one read a wake). With nothing left waiting only a ring
        brings work: wait ``idle_block_ms``; with requests waiting it could not take (another's
        prefix, a tenant over its quota), every tick. Shorter waits are slept here: Redis ends
        a blocked read only at its next tick (``hz`` 10), so a 10 ms BLOCK lasts up to 100."""
        if fill_wait_ms is not None and fill_wait_ms < REDIS_TICK_MS:
            stopping.wait(max(1, fill_wait_ms) / 1000)
            return
        quiet = self.trip.left_waiting == 0
        idle_ms = min(self.idle_block_ms, 10**9 if quiet else REDIS_TICK_MS)
        block_ms = idle_ms if fill_wait_ms is None else min(fill_wait_ms, MAX_BLOCK_MS)
        if any(n > 0 for n in self.asks.room().values()):
            self.trip.wait_for_doorbell(max(1, block_ms))
        else:
            stopping.wait(block_ms / 1000)

    def with_start(self, batch: Sequence[Held]) -> CarriedRead | None:
        """The read ``batch``'s start carries in its round trip (``QueueIO.mark_running``): the
        next batch's candidates, when the last read left a ``backlog`` waiting and the batch is
        expected to end before a read beside it could help (``SHORTEST_MS``; a static runner
        that knows its time per step). The next turn then plans at once: one round trip a
        turn instead of two. None (the next turn reads first): anything else, or a Redis
        Cluster (APPLY is a call per request there). What it brings goes to ``carried``."""
        expected_ms = self.runner.expected_ms(batch)
        if expected_ms is None or expected_ms >= SHORTEST_MS or self.cluster:
            return None
        room = self.asks.room()
        if not any(room.values()):
            return None
        probe = self.asks.probe()
        return lambda pipe, rider: self.trip.read(room, probe, pipe=pipe, rider=rider)

    def carried(self, fetched: Delivered) -> Delivered:
        """What a start's read brought, about to be admitted: the next turn plans at once."""
        self._covered = True
        return fetched

    def beside_batch(self, fetched: dict[str, int]) -> Delivered:
        """The read the batch-reads thread makes while the loop is inside the engine: the
        turn's, within the look-ahead's room less what earlier such reads ``fetched``."""
        self.doorbell.take()
        room = {s: n - fetched.get(s, 0) for s, n in self.asks.room().items()}
        total = self.runner.read_total(self.lookahead, self.max_batch_size)
        return self.trip.read(room, self.asks.probe(), total)


def idle_waits(settings: WorkerSettings) -> tuple[int, float]:
    """An idle worker's waits: how long it blocks on the doorbell at most (ms), and how often
    it reads when no ring came (s). It beats, and looks for dead workers' entries, when a wait
    ends, so the block stays well inside its stats hash's life (a third of --heartbeat-ttl-s)
    and within the reclaim's cadence (claim_idle_ms / 4). Its read waits --read-block-ms: only
    a plain XADD (not genq_submit) rings nothing, and it is seen within that."""
    block_ms = min(
        settings.read_block_ms,
        max(1, settings.heartbeat_ttl_s * 1000 // 3),
        max(1, settings.claim_idle_ms // 4),
    )
    return block_ms, settings.read_block_ms / 1000
