"""Staggered starts, the Redis side (the rule: ``worker/policy/spacing.py``).

The workers of a lane publish their phases on its ``starts`` hash (``Keys.starts``: consumer ->
"START_MS TURN_MS"). A static worker exchanges its own for everyone else's twice a batch, from
the batch-reads thread (``batch_reads.py``): as the batch's window opens (the others learn of
its start at once) and after its first read (the phases its next plan uses are a read's lead
old), so the loop pays no round trip for either. A worker that holds a batch publishes the
start it plans at once, from the loop, while it waits anyway, so that the workers deciding
meanwhile space themselves against where it will be, not where it was. (An exchange that ends
after the batch, on a host that starves the thread, can put the latest start back over a planned
one: the others then predict this worker a hold early, once.)
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import redis
from genq.common.connection import REDIS_ERRORS
from genq.common.wire import as_text
from genq.worker.policy.batching import Decision
from genq.worker.policy.spacing import Phase, StartSpacing
from genq.worker.runtime.clock import now_ms
from genq.worker.runtime.heartbeat import Counters

log = logging.getLogger("genq.worker")

STALE_MS = 60_000
"""A phase this old is a worker gone (or idle a long while): the exchange deletes it."""


class StaggeredStarts:
    """The loop's ``held`` (a batch held for the spacing becomes a wait) and the batch-reads
    thread's ``exchange``."""

    def __init__(
        self,
        r: redis.Redis,
        key: str,
        consumer: str,
        spacing: StartSpacing,
        *,
        saturated: Callable[[], bool],
        counters: Counters,
        ttl_s: int,
        clock: Callable[[], int] = now_ms,
    ) -> None:
        self.r, self.key, self.consumer, self.spacing = r, key, consumer, spacing
        self.saturated = saturated
        """Whether the last read left requests waiting in Redis (``QueueIO.left_waiting``)."""
        self.counters, self.ttl_s, self.clock = counters, ttl_s, clock

    def held(self, decision: Decision, static: bool) -> Decision:
        """``decision``, or a wait instead while its batch is held (``static``: a static
        worker reading, the only kind that is spaced)."""
        if not (static and decision.batch and self.spacing.enabled):
            return decision  # (off: no bookkeeping either; the exchange needs a turn)
        holding = self.spacing.target_ms is not None
        wait = self.spacing.hold(decision.batch, self.clock(), self.saturated())
        if not wait:
            return decision
        if not holding:
            self.counters.spacing_holds += 1  # (the stats hash's ``spacing_holds``)
            self._publish(self.spacing.target_ms or 0)
        return Decision(reason="spacing", wait_ms=wait)

    def exchange(self) -> None:
        """Publish this worker's latest start and take the others' phases (one round trip, on
        the batch-reads thread: ``batch_reads.py`` says when). Redis away: the old phases stay."""
        s = self.spacing
        if not (s.enabled and s.turn_ms):
            return
        try:
            pipe = self.r.pipeline(transaction=False)
            pipe.hset(self.key, self.consumer, _phase_text(s.last_start_ms, s.turn_ms))
            pipe.expire(self.key, self.ttl_s)
            pipe.hgetall(self.key)
            raw = pipe.execute()[-1]
        except REDIS_ERRORS as err:
            log.debug("start spacing: phases not exchanged: %r", err)
            return
        others, stale = {}, []
        for name, value in raw.items():
            who = as_text(name)
            if who == self.consumer:
                continue
            phase = _phase(as_text(value))
            if phase is None or s.last_start_ms - phase.start_ms > STALE_MS:
                stale.append(who)
            else:
                others[who] = phase
        s.others = others  # (replaced whole: the loop reads it)
        if stale:
            self._quietly(lambda: self.r.hdel(self.key, *stale))

    def _publish(self, start_ms: int) -> None:
        text = _phase_text(start_ms, self.spacing.turn_ms)
        self._quietly(lambda: self.r.hset(self.key, self.consumer, text))

    @staticmethod
    def _quietly(command: Callable[[], object]) -> None:
        try:
            command()
        except REDIS_ERRORS as err:
            log.debug("start spacing: %r", err)


def _phase_text(start_ms: int, turn_ms: int) -> str:
    """A phase as the hash holds it: "START_MS TURN_MS" (``_phase`` reads it back)."""
    return f"{start_ms} {turn_ms}"


def _phase(value: str) -> Phase | None:
    """A published "START_MS TURN_MS", or None if it is not one."""
    parts = value.split()
    if len(parts) != 2 or not all(p.isdigit() for p in parts):
        return None
    return Phase(start_ms=int(parts[0]), turn_ms=int(parts[1]))
