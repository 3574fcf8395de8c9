"""The worker: one Redis connection, one engine, and a loop of small named steps. Its parts
are built and wired in ``builder.py`` (``build_worker``); this module only runs them.

    join:   consumer groups and the queue's config, heartbeat, this consumer's own pending
    turn:   read (reclaim dead workers' entries, read, admit) -> plan -> launch (mark
            running, with the next read for a short batch; hand to the runner) -> advance
            (collect what finished, write it to the writer thread)
    beside: the ClaimKeeper thread renews this worker's claims and heartbeat (recovery.py);
            the ResultWriter thread writes results, events, acks and stats (writer.py);
            the DoorbellListener thread wakes a generating loop for arrivals (doorbell.py);
            the ReadsDuringBatch thread reads while a short static batch runs
            (batch_reads.py), so the next turn plans without a read
    stop:   SIGTERM stops reading; the same turn, without reading, runs what is held for up
            to shutdown_grace_s; then whatever is left stays pending for other workers. A
            second signal exits at once.

One turn serves every engine: a static runner runs a whole batch inside ``collect``, a
continuous one returns each request as it finishes (``runners.py``). The decisions are pure
units in ``genq.worker.policy``: admission, the look-ahead, the order (who goes first:
``ordering.py``), planning, the budget, the suspect gate.

Redis going away (a dropped connection, a restarting redis-server, a cluster failover) never
loses work: each command is retried with backoff, the loop retries the turn on top of that, and
results not yet written wait in the writer, which retries in order.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from genq.common.connection import MAX_BLOCK_MS, REDIS_ERRORS
from genq.common.keys import Keys
from genq.common.scripts import Applied
from genq.common.settings import WorkerSettings
from genq.worker.engines.base import Engine
from genq.worker.policy.arrivals import ArrivalEstimate
from genq.worker.policy.batching import BatchPolicy, Decision, batch_limits
from genq.worker.policy.budget import AdaptiveBudget
from genq.worker.policy.lookahead import Held, Lookahead, entry_key
from genq.worker.policy.ordering import WaitingOrder
from genq.worker.policy.planning import plan_start
from genq.worker.policy.suspects import Gate, SuspectGate
from genq.worker.runtime import clock
from genq.worker.runtime.availability import Availability
from genq.worker.runtime.batch_reads import SHORTEST_MS, ReadsDuringBatch
from genq.worker.runtime.clock import now_ms
from genq.worker.runtime.doorbell import DoorbellListener
from genq.worker.runtime.fair_share import TenantAccounts
from genq.worker.runtime.heartbeat import Counters, Heartbeat
from genq.worker.runtime.intake import Intake
from genq.worker.runtime.metrics import Metrics
from genq.worker.runtime.outcomes import Outcome
from genq.worker.runtime.prefixes import PrefixAffinity
from genq.worker.runtime.queue_io import Delivered, QueueIO
from genq.worker.runtime.read_asks import ReadAsks
from genq.worker.runtime.recovery import ClaimKeeper
from genq.worker.runtime.runners import POLL_S, Runner
from genq.worker.runtime.signals import install_signal_handlers
from genq.worker.runtime.spacing import StaggeredStarts
from genq.worker.runtime.starting import Starter
from genq.worker.runtime.streamed_text import TextSender
from genq.worker.runtime.writer import ResultWriter

log = logging.getLogger("genq.worker")

REDIS_TICK_MS = 100
"""Redis' timer tick at its default ``hz`` (10): the resolution of a blocked read's timeout."""
SETTLE_S = 1.0
"""How long a turn waits for the writer before a suspect starts (see ``policy/suspects.py``)."""


@dataclass(kw_only=True, eq=False)
class Worker:
    """One worker process's loop over its parts, which ``builder.build_worker`` builds and
    wires. ``run()`` until ``stop()`` (or SIGTERM/SIGINT)."""

    settings: WorkerSettings
    engine: Engine
    keys: Keys
    queue: QueueIO  # the queue's Redis commands, on the loop's connection
    tenants: TenantAccounts  # the tenants' weights, what goes back to their shares
    prefixes: PrefixAffinity  # the prefixes this worker holds, told to the fleet
    availability: Availability  # the loop's retry while Redis is away; a full Redis
    counters: Counters
    metrics: Metrics
    lookahead: Lookahead
    order: WaitingOrder  # who goes first among what waits (--tenant-policy)
    budget: AdaptiveBudget
    gate: SuspectGate
    arrivals: ArrivalEstimate
    intake: Intake
    runner: Runner
    starter: Starter
    writer: ResultWriter[Outcome]
    text: TextSender  # streaming requests' pieces, many a round trip, from its own thread
    stats: Heartbeat
    keeper: ClaimKeeper  # renews claims and the heartbeat, on a connection of its own
    doorbell: DoorbellListener  # wakes a generating loop for arrivals, on its own connection
    batch_reads: ReadsDuringBatch  # reads while a short static batch holds the loop
    spacing: StaggeredStarts  # a saturated static fleet's starts spread over a turn
    _stopping: threading.Event = field(default_factory=threading.Event, init=False)

    asks: ReadAsks = field(init=False)  # what a read asks for, from what the worker holds
    carried: bool = field(default=False, init=False)  # the last start read (``start``)
    consumer: str = field(init=False)  # this worker's consumer name in the group

    def __post_init__(self) -> None:
        self.asks = ReadAsks(
            self.settings, self.lookahead, self.runner, self.order, self.queue, self.doorbell
        )
        self.batch_reads.read = self.asks.beside_batch
        self.consumer = self.settings.consumer_name

    # -- lifecycle -------------------------------------------------------------------------

    def run(self) -> None:
        """Serve until stopped; then run what is held, write it, and log one summary line."""
        install_signal_handlers(self.stop)
        self.availability.retrying(self.join, self._stopping)
        for helper in (self.keeper, self.doorbell, self.batch_reads):
            helper.start()
        where = (self.consumer, self.keys.queue, self.engine.name)
        log.info("worker %s serving queue %r with engine %s", *where)
        while not self._stopping.is_set():
            step = self.turn if self.availability.full_since is None else self.wait_for_memory
            self.availability.retrying(step, self._stopping, once=True)
        try:
            self.drain()
        finally:
            for part in (self.doorbell, self.batch_reads, self.text, self.writer):
                part.stop()
            self.runner.close()
        self.account_written()
        self.keeper.stop()
        self.metrics.close()
        with contextlib.suppress(*REDIS_ERRORS):
            self.queue.leave()
        left = len(self.lookahead) + len(self.runner.running) + len(self.writer)
        tail = f" left_pending={left}" if left else ""
        log.info("worker %s stopped: %s%s", self.consumer, self.counters.summary(), tail)

    def join(self) -> None:
        """Join the queue: groups, queue config, heartbeat, then this consumer's own pending."""
        self.queue.ensure_groups()
        self.heartbeat(force=True)
        self.queue.resume(self.asks.room, self.admit_delivered)

    def wait_for_memory(self) -> None:
        """Redis is full: only the heartbeat (a write); once it goes through, turns again."""
        self.heartbeat(force=True)
        self.availability.memory_back()

    def stop(self) -> None:
        """Ask the loop to stop after the current turn. Idempotent."""
        self._stopping.set()

    def drain(self) -> None:
        """The turn without reading, for up to ``shutdown_grace_s``: what is held runs and is
        written; what is left after that stays pending and is taken over by other workers."""
        deadline = time.monotonic() + self.settings.shutdown_grace_s
        while (self.lookahead.waiting or self.runner.busy) and time.monotonic() < deadline:
            self.availability.retrying(lambda: self.turn(reading=False), self._stopping, once=True)
        self.writer.flush(max(0.0, deadline - time.monotonic()))
        left = (len(self.lookahead.waiting), len(self.runner.running), len(self.writer))
        if self.lookahead.waiting or self.runner.busy or len(self.writer):
            log.warning(
                "grace period over: %d held, %d running, %d unwritten requests stay "
                "pending for other workers",
                *left,
            )

    # -- the turn --------------------------------------------------------------------------

    def turn(self, reading: bool = True) -> None:
        """One turn: read, plan, start, advance; without ``reading`` (draining), no new work."""
        if time.monotonic() >= min(self.stats.due_s, clock.sync_due_s):
            self.heartbeat()  # (else neither would do anything)
        covered, self.carried = self.carried, False  # (the last start read: ``start``)
        if self.batch_reads.taken is False:  # a window since the last take
            fetched, covered = self.batch_reads.take()
            self.admit(fetched)
        if reading and covered and self.lookahead.waiting:
            self.reclaim()  # read while the last batch ran: plan at once
        elif reading:
            self.read()
        if self.runner.preempts:
            self.runner.rebalance(self.lookahead.asks, self.settings.max_batch_size)
        decision = self.plan(wait_to_fill=reading and self.runner.waits_to_fill)
        self.launch(decision, reading)
        self.advance(reading)
        if reading and not decision.batch and not self.runner.running:
            self.idle(decision.wait_ms if self.lookahead.waiting else None)

    def read(self) -> None:
        """Take over dead workers' entries, then read new ones (paced while the runner says
        so, or while idle: ``QueueIO.idle_pace_s``; unless the doorbell rang); admit them."""
        if time.monotonic() >= self.queue.reclaim_at_s:
            self.reclaim()
        room, probe = self.asks.room(), self.asks.probe()
        limits, size = self.runner.limits_reads, self.settings.max_batch_size
        total = self.runner.read_total(self.lookahead, size) if limits else 0
        rung, running = self.doorbell.take(), self.runner.running
        s = self.runner.read_pace_s(size) if running else 0.0  # (0 for an idle runner)
        if not (s or running or self.queue.left_waiting or self.lookahead.waiting):
            s = self.queue.idle_pace_s  # idle: a ring ends the wait (``QueueIO.read``)
        self.admit(self.queue.read(room, pace_s=0.0 if rung else s, probe=probe, total=total))

    def launch(self, decision: Decision, reading: bool = True) -> None:
        """Start the batch the plan chose: the order and the arrival estimate learn of it, it
        is marked running and handed to the runner; what waits behind a long batch goes back."""
        if decision.reason == "waiting":
            self.arrivals.waiting(now_ms())  # scored when the batch starts: did anyone come?
        if not decision.batch:
            return
        if self.arrivals.in_wait:  # (``batch_started`` scores the wait under way)
            self.arrivals.batch_started()
        self.order.started(decision.batch)
        batch = self.lookahead.take(c.key for c in decision.batch)
        if self.prefixes.tracks_adapters or any(c.prefix for c in decision.batch):
            self.prefixes.started(batch)  # told with the start's round trip (``mark_running``)
        self.write(self.start(batch, reading))
        if self.lookahead.waiting:  # (what waits behind a long batch)
            self.starter.hand_back(self.lookahead, self.runner)

    def advance(self, reading: bool) -> None:
        """Let the runner work until the next read is due (or the doorbell rings, when it
        ``listens``): write what finished, then what was cancelled or expired meanwhile. While
        a static batch runs, ``batch_reads`` reads in the loop's place (one expected to take
        from ``SHORTEST_MS`` to ``hand_back_after_ms``: a longer one handed back what waited
        here)."""
        listening = reading and self.runner.limits_reads and self.asks.listens()
        busy_ms = self.runner.holds_loop_ms if reading and not listening else None
        beside = busy_ms is not None and SHORTEST_MS <= busy_ms < self.settings.hand_back_after_ms
        self.doorbell.arm(listening or beside, self.batch_reads.ring if beside else None)
        until = self.doorbell.rung if listening else None
        window = self.batch_reads.window(busy_ms) if beside and busy_ms else None
        with window or contextlib.nullcontext():
            done = self.runner.collect(max(POLL_S, self.queue.read_wait_s()), until=until)
        self.write(done)
        if self.runner.running:  # (a static batch ends within its turn: nothing to drop)
            self.write(
                self.runner.drop_cancelled(self.queue.final_ones) + self.runner.drop_expired()
            )

    def idle(self, fill_wait_ms: int | None) -> None:
        """Nothing to start: block on the doorbell, or wait ``fill_wait_ms`` for a batch to
        fill; the next turn reads (one read a wake). With nothing left waiting only a ring
        brings work: wait ``idle_block_ms``; with requests waiting it could not take (another's
        prefix, a tenant over its quota), every tick. Shorter waits are slept here: Redis ends
        a blocked read only at its next tick (``hz`` 10), so a 10 ms BLOCK lasts up to 100."""
        if fill_wait_ms is not None and fill_wait_ms < REDIS_TICK_MS:
            self._stopping.wait(max(1, fill_wait_ms) / 1000)
            return
        quiet = self.queue.left_waiting == 0
        idle_ms = min(self.queue.idle_block_ms, 10**9 if quiet else REDIS_TICK_MS)
        block_ms = idle_ms if fill_wait_ms is None else min(fill_wait_ms, MAX_BLOCK_MS)
        if any(n > 0 for n in self.asks.room().values()):
            self.queue.wait_for_doorbell(max(1, block_ms))
        else:
            self._stopping.wait(block_ms / 1000)

    def reclaim(self) -> None:
        """Take over entries of dead workers, within the look-ahead's room."""
        for stream, entries in self.queue.reclaim(self.asks.room):
            self.counters.reclaimed += len(entries)
            self.admit_delivered(stream, entries)

    def admit_delivered(self, stream: str, entries: list[Any]) -> None:
        """Admit entries delivered before (resumed, taken over): ``Held.suspect``."""
        self.admit([(stream, entries)], redelivered=True)

    def admit(self, delivered: Delivered, redelivered: bool = False) -> None:
        """Runnable entries join the look-ahead (their adapters count as held); the rest end
        at once (failed, expired) or go to the dead-letter stream. One held already is skipped."""
        if not delivered:
            return
        writing = {entry_key(s, e) for s, e in self.writer.entries()}
        holders = (self.lookahead.waiting, self.lookahead.starting, self.runner.running, writing)
        admitted = self.intake.admit(delivered, now_ms=now_ms(), held=holders)
        if redelivered and admitted.held:
            starts = self.queue.starts([h.request.id for h in admitted.held])
            for held in admitted.held:
                held.starts = starts.get(held.request.id, 0)
        for record in admitted.dead_letters:
            self.starter.dead_letter(record, ack=True)
        for held in admitted.held:
            self.lookahead.add(held)
        if self.prefixes.tracks_adapters:
            self.prefixes.read(admitted.held)
        if not redelivered:  # new arrivals; their charges made exact
            self.arrivals.observe(h.enqueued_ms for h in admitted.held)
            self.tenants.corrections(admitted.held)
        self.write(admitted.outcomes)

    def plan(self, wait_to_fill: bool) -> Decision:
        """What to start now: the suspect alone when the gate lets it, else the batching
        policy within the room the runner has left (``policy/planning.py``)."""
        suspect = self.lookahead.next_suspect() if self.lookahead.suspects else None
        running = self.runner.active() if self.runner.running else []
        gate = self.gate.check(
            suspect_waiting=suspect is not None,
            running=len(running),
            suspect_running=any(h.suspect for h in running),
        )
        if gate is Gate.CLOSED:
            return Decision(reason="suspect running")
        if gate is Gate.FLUSH_FIRST:
            if not self.writer.flush(SETTLE_S):
                return Decision(reason="writer behind")  # Redis away: next turn
            self.gate.passed(suspect=suspect is not None)
        if suspect is not None:
            return Decision(batch=[suspect.candidate], reason="suspect")
        decision = plan_start(
            [h.candidate for h in self.lookahead.waiting.values()],  # (``candidates``)
            now_ms=now_ms(),
            policy=batch_policy(self.settings, self.budget),
            running=len(running),
            running_tokens=sum(h.cost_tokens for h in running),
            wait_to_fill=wait_to_fill,
            arrivals=self.arrivals,
            order=self.order,
            weights=self.tenants.weights.now,
        )
        return self.spacing.held(decision, static=wait_to_fill)  # (a static worker reading)

    def start(self, batch: list[Held], reading: bool = False) -> list[Outcome]:
        """Mark ``batch`` running (its start may carry the next read: ``ReadAsks.with_start``)
        and hand it to the runner. If Redis fails first, the batch goes back to waiting."""
        backlog = reading and self.queue.left_waiting > 0  # (else ``with_start`` says None)
        started_ms, read = now_ms(), self.asks.with_start(batch) if backlog else None
        try:
            live, outcomes, fetched = self.starter.mark_running(batch, started_ms, read)
        except REDIS_ERRORS:
            self.lookahead.put_back(batch)
            raise
        self.lookahead.started(batch)
        outcomes += self.runner.start(live, started_ms)
        if fetched is not None:  # (admitted once the batch is the runner's: held once)
            self.carried = True
            self.admit(fetched)
        return outcomes

    def write(self, outcomes: Sequence[Outcome]) -> None:
        """Count final results and hand them to the writer (``writer.py``), which writes them
        with their events, acknowledges and deletes their entries (one atomic script: no entry
        is acknowledged without its result) and the stats refreshed for it, while the loop
        goes on. Blocks while the writer is behind by more than two batches."""
        self.account_written()
        if not outcomes:
            return
        self.counters.ended(outcomes)
        if any(o.continuation for o in outcomes):  # (a chat's next turn: ``PrefixAffinity``)
            self.prefixes.finished(outcomes)
        self.stats.refresh(drained=not (self.lookahead.waiting or self.runner.running))
        self.writer.put(list(outcomes))

    def account_written(self) -> None:
        """Count what the writer found already final since the last call (the loop's own)."""
        for _batch, answers in self.writer.take_written():
            if Applied.ALREADY_FINAL in answers or Applied.DUPLICATE in answers:
                self.counters.count_answers(answers)

    def heartbeat(self, force: bool = False) -> None:
        """Refresh this worker's stats hash (at most every ``HEARTBEAT_S`` unless forced)."""
        self.account_written()
        clock.sync(self.queue.redis, force=force)  # Redis' clock, not this host's
        if self.stats.beat(force=force):
            held, c = len(self.lookahead) + len(self.runner.running), self.counters
            self.metrics.state(
                held, c.prompt_tokens, c.padded_prompt_tokens, cached_tokens=c.cached_tokens
            )


def batch_policy(settings: WorkerSettings, budget: AdaptiveBudget) -> BatchPolicy:
    """The batching policy now: the settings' limits, within the budget (restored once its
    backoff after an out-of-memory error is over)."""
    if budget.restore_at_s is not None and budget.restore_due(time.monotonic()):
        log.info("batch budget back to %d tokens", budget.full_tokens)
    s = settings
    return batch_limits(budget.tokens, s.max_batch_size, s.max_wait_ms, s.priority_aging_ms)
