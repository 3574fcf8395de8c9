"""Staggered starts: a saturated fleet of static workers spreads its batches' starts over a turn.

Identical static workers that are busy together start and end their batches together: a burst
wakes them at once, and nothing pulls them apart afterwards (measured on the tenants scenario's
fleet: the nearest other worker's start 2-4 ms away at the median, in a turn of 38 ms). A
request that arrives just after their starts then waits a whole batch wherever it goes, where
with the starts a third of a turn apart it would wait a third (another tenant's
requests beside a batch or a flood).

So each static worker, on its own (no coordinator), nudges its starts away from the others'.
About to start a batch, it predicts the other workers' next starts from the phases they
published (``Phase``: the latest start and the turn of each); if the nearest start behind it is
within half the even spacing (a turn / the workers / 2) and nearer than the nearest one ahead,
it holds its batch for half the difference (at most the even spacing), which puts it mid-way
between the two. The fleet drifts apart until no start is that near another's, and then nobody
holds. (Holding whenever the start behind was the nearer kept every worker holding a little at
every turn on a busy host: 5-9% of a flood's throughput on 2 cores, measured; this looser rule
cost none.)

It never holds a batch that has a request which arrived within the last turn (a newcomer is
what the spacing is for), nor when the last read left nothing waiting in Redis (the fleet is not
saturated: an idle worker takes a newcomer at once), nor for workers whose turn differs from its
own by more than a quarter (their phases drift past each other anyway). And only while requests
can pass a backlog here: a batch of more than one tenant or priority started within
``MIXED_MS``. In one tenant's line of one priority a newcomer waits behind the backlog wherever
the starts are, and a hold would only cost (measured: the prefix scenario's one-tenant Zipf
workload ran 6% longer with holds). Pure: the phases come
from ``worker/runtime/spacing.py``, which exchanges them through Redis.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from genq.worker.policy.batching import Candidate

MIN_HOLD_MS = 2
"""A shorter hold is not made: it is within a start's own jitter on a busy host."""
TURNS_KEPT = 9
"""A worker's turn is the median of its last so many (start to start)."""
LONGEST_TURN_MS = 1_000
"""A gap between two starts longer than this is an idle spell, not a turn."""
MIXED_MS = 5_000
"""A worker holds only while a batch of more than one tenant or priority started within this
long: then a newcomer can pass the backlog (fair share, priorities), which is what it is for."""
SAME_TURN = 0.25
"""Workers whose turns differ by more than this fraction are not spaced against each other."""


@dataclass(frozen=True)
class Phase:
    """What a worker published: its latest (or planned) start and its turn, Unix ms."""

    start_ms: int
    turn_ms: int


def hold_ms(now_ms: int, turn_ms: int, others: Iterable[Phase]) -> int:
    """How long a worker with this turn, about to start now, holds its batch so that its start
    moves towards the middle between the others' predicted starts (0: start now)."""
    near = [
        p
        for p in others
        if p.turn_ms > 0
        and abs(p.turn_ms - turn_ms) <= SAME_TURN * turn_ms
        and now_ms - p.start_ms < 2 * p.turn_ms
    ]
    if not near:
        return 0
    # Per worker, its next start (at least a moment from now) and its last one (at most now).
    ahead = min((p.start_ms - now_ms) % p.turn_ms or p.turn_ms for p in near)
    behind = min((now_ms - p.start_ms) % p.turn_ms for p in near)
    even = turn_ms // (len(near) + 1)  # the gap between starts spread evenly
    if behind >= ahead or 2 * behind >= even:
        return 0
    hold = min((ahead - behind) // 2, even)
    return hold if hold >= MIN_HOLD_MS else 0


class StartSpacing:
    """One worker's side of the spacing: its turns, the others' phases (``others``, replaced
    whole by the exchange's thread), and the hold under way. Off (``enabled`` False): every
    batch starts at once, and only the turns are kept."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self.others: dict[str, Phase] = {}
        """The other workers' phases, by consumer: set by ``runtime/spacing.py``."""
        self.last_start_ms = 0
        """This worker's latest start (0: none yet)."""
        self.turn_ms = 0
        """This worker's turn, the median of its last ones (0: fewer than three seen)."""
        self.target_ms: int | None = None
        """The start a hold under way waits for; None: no hold."""
        self.mixed_ms = 0
        """When a batch of more than one tenant or priority last started (Unix ms; 0: never)."""
        self._turns: deque[int] = deque(maxlen=TURNS_KEPT)

    def hold(self, batch: Sequence[Candidate], now_ms: int, saturated: bool) -> int:
        """How long to hold ``batch`` now (0: it starts now, and counts as started). A hold
        is decided once, at the first call after a start; later calls wait for its end, unless
        the batch gained a newcomer."""
        if self.target_ms is None:
            passing = now_ms - self.mixed_ms <= MIXED_MS  # (a newcomer can pass the backlog)
            ready = self.enabled and saturated and passing and self.turn_ms > 0
            wait = 0
            if ready and not self._newcomer(batch, now_ms):
                wait = hold_ms(now_ms, self.turn_ms, self.others.values())
            self.target_ms = now_ms + wait
        if now_ms < self.target_ms and not self._newcomer(batch, now_ms):
            return self.target_ms - now_ms
        self.target_ms = None
        self._started(now_ms, batch)
        return 0

    def _newcomer(self, batch: Sequence[Candidate], now_ms: int) -> bool:
        return any(now_ms - c.enqueued_ms < self.turn_ms for c in batch)

    def _started(self, now_ms: int, batch: Sequence[Candidate]) -> None:
        head = batch[0] if batch else None
        if head and any(
            c.tenant != head.tenant or c.priority_rank != head.priority_rank for c in batch
        ):
            self.mixed_ms = now_ms  # (stops at the first request unlike the anchor)
        gap = now_ms - self.last_start_ms
        if self.last_start_ms and 0 < gap <= LONGEST_TURN_MS:
            self._turns.append(gap)
            if len(self._turns) >= 3:
                self.turn_ms = int(statistics.median(self._turns))
        self.last_start_ms = now_ms
