"""The read's round trip: what one read sends to Redis and what it learns, and the doorbell
wait that comes before a read when the worker is idle.

One round trip holds, in order: the acknowledgement of the rings the last wait heard; the
riders' commands (each concept that sends something with every read queues it here and takes
its replies: ``Rider``); a probe (XPENDING, one row) per stream of what other workers handed
back (``RETURNED``); the PULL script, which takes from each priority the entries of the
tenants with the least service (``policy/fair_share.py``); one LLEN per lane (its backlog, for
the idle wait and the ring passed on); then the riders that come after the read (the tenants'
weights, the APPLY of a start that carries this read). The round trip knows none of the riders'
concepts: ``build_worker`` names them. Only when a probe finds entries handed back does a
second call (the TAKE_BACK script) claim them, up to the room again: they are older than
anything new, and leaving them for later would let them wait behind newer work.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import redis
from genq.common import script_calls
from genq.common.connection import is_cluster
from genq.common.fair_share import DOORBELL_MAX
from genq.common.keys import GROUP, RETURNED, Keys
from genq.common.lua.hand_back import TAKE_BACK
from genq.common.lua.read import PULL
from genq.common.settings import WorkerSettings
from genq.worker.runtime import clock
from genq.worker.runtime.doorbell import own_rings, relay_own_rings, wait_for_ring

READ_PACE_S = 0.05
"""While the engine is busy, how soon a queue found empty is asked again (a *paced* read). A
request that arrives meanwhile waits at most this long to join the running batch; the loop
stops asking Redis ~50 times a second for nothing while the engine computes (on a CPU, that
work takes cores from the model). An engine that finishes a request does not shorten it."""
OWN_RING_SLEEP_MS = 100
"""How long a worker whose wait took only its own read's rings (``doorbell.relay_own_rings``)
sleeps instead of blocking on the doorbell again: the holders it rang for block meanwhile."""

Delivered = list[tuple[Any, list[Any]]]
"""An XREADGROUP reply: ``[[stream, [[entry id, fields], ...]], ...]``."""
Probe = tuple[int, list[str]]
"""A read's probe for tenants a worker holds none of (``ReadTrip.read``)."""
Taker = Callable[[list[Any]], None]
"""What takes a rider's replies once the round trip went through."""
Rider = Callable[[Any], Taker | None]
"""A concept's commands in every read's round trip: it queues them on the pipeline and returns
what takes their replies (None: it queued nothing, or needs no reply). Riders are called in
the loop's thread or the batch-reads thread, never both at once (``batch_reads.py``)."""
CarriedRead = Callable[[Any, Rider], Delivered]
"""A read sent in a start's round trip (``Reader.with_start``): given the start's pipeline
(holding its commands so far) and a rider for the start's APPLY, sends them with the read and
returns what it read."""


class ReadTrip:
    """One worker's read round trips, its doorbell waits, and what the last read found."""

    def __init__(
        self,
        *,
        r: redis.Redis,
        keys: Keys,
        settings: WorkerSettings,
        read_rule: str,
        before: Sequence[Rider] = (),
        after: Sequence[Rider] = (),
    ) -> None:
        self.redis = r
        self.cluster = is_cluster(r)
        self.keys = keys
        self.consumer = settings.consumer_name
        self.read_rule = read_rule
        """How the read picks among tenants: the worker's order says (``read_rule``)."""
        self.before, self.after = list(before), list(after)
        """The riders whose commands go before the read's, and after them."""
        self.burst = settings.max_batch_tokens
        self.affinity_args = (
            [settings.prefix_wait_ms, round(settings.prefix_load_factor * 100)]
            if settings.prefix_aware
            else [0, 0]
        )
        """PULL's affinity: how long an entry waits for the worker holding its prefix, and
        the load bound (``common/prefixes.py``); 0: none."""
        self.left_waiting = 1
        """The backlog of the worker's lanes after the last read (0: only a ring brings work)."""
        self.found_empty_s: float | None = None
        """When a read last found nothing (None: the last read found entries)."""
        self._pace_s = 0.0  # the last read's pace (``read_wait_s``)
        self._rung: list[tuple[str, Any]] = []  # rings heard (doorbell, id), acked by a read
        self._unrung = False  # no ring ended the last wait: no probe for handed-back entries
        self._backlogs = [(k.doorbell, k.waiting) for k in keys.lanes()]
        """Each lane's doorbell and backlog (a read asks each backlog's length)."""
        self._streams = keys.streams()

    def read_wait_s(self) -> float:
        """How long until a paced read asks Redis again (0: it would ask now)."""
        if self.found_empty_s is None:
            return 0.0
        return max(0.0, self.found_empty_s + self._pace_s - time.monotonic())

    def wait_for_doorbell(self, block_ms: int) -> None:
        """Block until the doorbell rings, ``block_ms`` passes or a stop signal comes
        (``doorbell.wait_for_ring``); the rings heard are acknowledged and deleted with the
        next read (in its round trip)."""
        rung = wait_for_ring(self.redis, self.keys.doorbells, self.consumer, block_ms)
        self._rung += [(bell, ring_id) for bell, ring_id, _ in rung]
        own = own_rings(rung, self.consumer)  # its read rang them for holders: theirs
        if own:
            relay_own_rings(self.redis, own, self.consumer)
        self._unrung = len(own) == len(rung)
        if rung and self._unrung:  # none for this worker: not blocking, or it takes them back
            time.sleep(min(block_ms, OWN_RING_SLEEP_MS) / 1000)

    def read(
        self,
        room: dict[str, int],
        probe: Probe = (0, []),
        total: int = 0,
        pace_s: float = 0.0,
        pipe: Any = None,
        rider: Rider | None = None,
    ) -> Delivered:
        """Entries for this worker, each stream up to its room, in one round trip (see the
        module's docstring). ``probe``: per priority, up to so many more from tenants other than
        the ``PRIORITY|TENANT`` pairs named, even past the room (``Lookahead.probe``).
        ``total``: at most so many in all, the highest priorities first (0: no cap).
        ``pace_s``: nothing, without asking, if a read found the queue empty less than that
        long ago and no ring came since (``read_wait_s``; 0: ask). ``pipe``: a pipeline
        holding commands already (a start's: always sent); ``rider``: one more after the
        read (that start's APPLY)."""
        if pipe is None:
            self._pace_s = pace_s
            if not (any(room.values()) or probe[0]) or (not self._rung and self.read_wait_s()):
                return []
            pipe = self.redis.pipeline(transaction=False)
        streams, asked = self._streams, [s for s, n in room.items() if n > 0]
        woken = bool(self._rung)
        by_bell: dict[str, list[Any]] = {}  # the rings heard, acknowledged and deleted
        for doorbell, ring in self._rung:
            by_bell.setdefault(doorbell, []).append(ring)
        for doorbell, rings in by_bell.items():
            pipe.xack(doorbell, GROUP, *rings)
            pipe.xdel(doorbell, *rings)
        self._rung = []
        # Entries handed back ring the doorbell: after a wait no ring ended, none came since
        # the last read's probe (one whose ring got lost is taken over after claim_idle_ms).
        probed = [] if self._unrung else asked
        self._unrung = False
        takers: list[tuple[Taker, int, int]] = []  # what takes the riders' replies (from, to)
        for ride in self.before:
            first, take = len(pipe), ride(pipe)
            if take is not None:
                takers.append((take, first, len(pipe)))
        start = len(pipe)
        for s in probed:
            pipe.xpending_range(s, GROUP, "-", "+", 1, RETURNED)
        rooms = [room[s] if s in asked else 0 for s in streams]
        args = [self.keys.config, *streams, self.consumer, self.read_rule, clock.now_ms()]
        args += [self.burst, *rooms, total, probe[0], *self.affinity_args, *probe[1]]
        script_calls.add(pipe, PULL, 1 + len(streams), *args)
        for _, backlog in self._backlogs:
            pipe.llen(backlog)
        end = len(pipe)
        for ride in [*self.after, rider] if rider is not None else self.after:
            first, take = len(pipe), ride(pipe)
            if take is not None:
                takers.append((take, first, len(pipe)))
        replies: list[Any] = script_calls.execute(pipe)
        for take, first, last in takers:
            take(replies[first:last])
        mine = replies[start:end]
        left_in = {bell: int(mine.pop()) for bell, _ in reversed(self._backlogs)}
        self.left_waiting = sum(left_in.values())
        fresh: Delivered = mine[-1] or []
        back = [s for s, probe in zip(probed, mine[:-1], strict=True) if probe]
        delivered = self.take_back({s: room[s] for s in back}) + fresh if back else fresh
        self.found_empty_s = None if delivered else time.monotonic()
        if woken and delivered and self.left_waiting > 0:
            pass_the_ring_on(self.redis, left_in)
        return delivered

    def take_back(self, room: dict[str, int]) -> Delivered:
        """Claim entries other workers handed back, up to ``room`` per stream (one script)."""
        args: list[str | int] = [GROUP, RETURNED, self.consumer, *room.values()]
        reply: Any = script_calls.call(self.redis, TAKE_BACK, len(room), *room, *args)
        return reply or []


def pass_the_ring_on(r: Any, left_in: dict[str, int]) -> None:
    """Wake the next idle worker of each lane where work is left: a ring woke this one, it
    took some, and ``left_in`` (per lane's doorbell) more wait. A burst submitted in one call
    rings once; each worker it wakes passes the ring on while work is left, so the idle fleet
    wakes one worker a read apart. A worker that took nothing rings nobody, so every ring
    passed on is paid for by entries taken (no ring storm over work nobody can take: a tenant
    over its quota, another's prefix)."""
    pipe = r.pipeline(transaction=False)
    for doorbell, waiting in left_in.items():
        if waiting > 0:
            pipe.xadd(doorbell, {"n": waiting}, maxlen=DOORBELL_MAX)
    pipe.execute()
