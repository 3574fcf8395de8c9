"""The worker: one Redis connection, one engine, and a loop of small named steps. Its parts
are built and wired in ``builder.py`` (``build_worker``); this module only runs them.

    join:   consumer groups and the queue's config, heartbeat, this consumer's own pending
    turn:   read (the reader's: every way requests come, ``reader.py``; admit them) -> plan
            -> launch (mark running, with the next read for a short batch; hand to the
            runner) -> advance (the engine's time; write what finished to the writer thread)
    beside: the ClaimKeeper thread renews this worker's claims and heartbeat (recovery.py);
            the ResultWriter thread writes results, events, acks and stats (writer.py);
            the reader's threads: the doorbell listener and the reads beside a static batch
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

from genq.common.connection import REDIS_ERRORS
from genq.common.scripts import Applied
from genq.common.settings import WorkerSettings
from genq.worker.policy.batching import Decision
from genq.worker.policy.lookahead import Held, Lookahead, entry_key
from genq.worker.runtime import clock
from genq.worker.runtime.availability import Availability
from genq.worker.runtime.clock import now_ms
from genq.worker.runtime.fair_share import TenantAccounts
from genq.worker.runtime.heartbeat import Counters, Heartbeat
from genq.worker.runtime.intake import Intake
from genq.worker.runtime.metrics import Metrics
from genq.worker.runtime.outcomes import Outcome
from genq.worker.runtime.planner import Planner
from genq.worker.runtime.prefixes import PrefixAffinity
from genq.worker.runtime.queue_io import QueueIO
from genq.worker.runtime.read_trip import Delivered
from genq.worker.runtime.reader import Reader
from genq.worker.runtime.recovery import ClaimKeeper
from genq.worker.runtime.runners import Runner
from genq.worker.runtime.signals import install_signal_handlers
from genq.worker.runtime.starting import Starter
from genq.worker.runtime.streamed_text import TextSender
from genq.worker.runtime.writer import ResultWriter

log = logging.getLogger("genq.worker")


@dataclass(kw_only=True, eq=False)
class Worker:
    """One worker process's loop over its parts, which ``builder.build_worker`` builds and
    wires. ``run()`` until ``stop()`` (or SIGTERM/SIGINT)."""

    settings: WorkerSettings
    queue: QueueIO  # the queue's writes, on the loop's connection
    reader: Reader  # every way requests come (reads, the doorbell, reclaim, resume)
    tenants: TenantAccounts  # the tenants' weights, what goes back to their shares
    prefixes: PrefixAffinity  # the prefixes this worker holds, told to the fleet
    availability: Availability  # the loop's retry while Redis is away; a full Redis
    counters: Counters
    metrics: Metrics
    lookahead: Lookahead
    planner: Planner  # what to start now (the suspect gate, the batching policy, the order)
    intake: Intake
    runner: Runner
    starter: Starter
    writer: ResultWriter[Outcome]
    text: TextSender  # streaming requests' pieces, many a round trip, from its own thread
    stats: Heartbeat
    keeper: ClaimKeeper  # renews claims and the heartbeat, on a connection of its own
    _stopping: threading.Event = field(default_factory=threading.Event, init=False)

    @property
    def consumer(self) -> str:
        """This worker's consumer name in the group."""
        return self.settings.consumer_name

    # -- lifecycle -------------------------------------------------------------------------

    def run(self) -> None:
        """Serve until stopped; then run what is held, write it, and log one summary line."""
        install_signal_handlers(self.stop)
        self.availability.retrying(self.join, self._stopping)
        for helper in (self.keeper, self.reader):
            helper.start()
        where = (self.consumer, self.settings.queue, self.stats.identity.fields["engine"])
        log.info("worker %s serving queue %r with engine %s", *where)
        while not self._stopping.is_set():
            step = self.turn if self.availability.full_since is None else self.wait_for_memory
            self.availability.retrying(step, self._stopping, once=True)
        try:
            self.drain()
        finally:
            for part in (self.reader, self.text, self.writer):
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
        self.reader.resume(self.admit)

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
        self.reader.read(self.admit, reading)
        if self.runner.preempts:
            self.runner.rebalance(self.lookahead.asks, self.settings.max_batch_size)
        decision = self.planner.plan(wait_to_fill=reading and self.runner.waits_to_fill)
        self.launch(decision)
        self.advance(reading)
        if reading and not decision.batch and not self.runner.running:
            self.reader.idle(decision.wait_ms if self.lookahead.waiting else None, self._stopping)

    def launch(self, decision: Decision) -> None:
        """Start the batch the plan chose: it is marked running and handed to the runner;
        what waits behind a long batch goes back."""
        if not decision.batch:
            return
        batch = self.lookahead.take(c.key for c in decision.batch)
        if self.prefixes.tracks_adapters or any(c.prefix for c in decision.batch):
            self.prefixes.started(batch)  # told with the start's round trip (``mark_running``)
        self.write(self.start(batch))
        if self.lookahead.waiting:  # (what waits behind a long batch)
            self.starter.hand_back(self.lookahead, self.runner)

    def advance(self, reading: bool) -> None:
        """Give the engine its time (``Reader.collect``: until the next read is due, with the
        reads beside it) and write what finished, then what was cancelled or expired
        meanwhile."""
        self.write(self.reader.collect(reading))
        if self.runner.running:  # (a static batch ends within its turn: nothing to drop)
            self.write(
                self.runner.drop_cancelled(self.queue.final_ones) + self.runner.drop_expired()
            )

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
        if admitted.elsewhere:  # (a pool's, of a model it no longer holds)
            self.queue.hand_back(admitted.elsewhere, rings=1)
        for held in admitted.held:
            self.lookahead.add(held)
        if self.prefixes.tracks_adapters:
            self.prefixes.read(admitted.held)
        if not redelivered:  # new arrivals; their charges made exact
            self.planner.arrived(h.enqueued_ms for h in admitted.held)
            self.tenants.corrections(admitted.held)
        self.write(admitted.outcomes)

    def start(self, batch: list[Held]) -> list[Outcome]:
        """Mark ``batch`` running (its start may carry the next read: ``ReadAsks.with_start``)
        and hand it to the runner. If Redis fails first, the batch goes back to waiting."""
        read = self.reader.with_start(batch) if self.reader.backlog else None
        started_ms = now_ms()
        try:
            live, outcomes, fetched = self.starter.mark_running(batch, started_ms, read)
        except REDIS_ERRORS:
            self.lookahead.put_back(batch)
            raise
        self.lookahead.started(batch)
        outcomes += self.runner.start(live, started_ms)
        if fetched is not None:  # (admitted once the batch is the runner's: held once)
            self.admit(self.reader.carried(fetched))
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
