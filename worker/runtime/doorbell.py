"""The doorbell: an idle worker waits on it, and a busy worker's listener hears a submission
the moment it lands.

An idle worker blocks on the doorbell itself (``wait_for_ring``: a consumer group, so each
ring wakes one idle worker; up to ``--read-block-ms``, a stop signal ending it at once). A
worker generating on an iteration-level engine cannot:
its loop waits on the engine's outputs, and used to look at the queue only every
``READ_PACE_S`` (50 ms), so a request arriving mid-generation waited up to two decode steps
before it joined the running batch (the time to first token that ``vllm bench serve``
measured against ``vllm serve``). This thread does the waiting instead, on a connection of its
own, while the loop says it has room for more: a plain XREAD of the doorbell (not the group's:
it takes no ring away from an idle worker), and a ring marks it ``rung``. The loop's wait on
the engine stops at a ring, and its next read is not paced. While a short static batch runs
the loop is inside the engine and cannot read: a ring is handed to ``batch_reads.py``'s thread,
which reads in its place.

Cost: a blocked read costs Redis nothing; each submission wakes every listening worker once
(one read each, which may find that another worker took the entry).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import redis
from genq.common.connection import MAX_BLOCK_MS, REDIS_ERRORS, blocking_call, is_cluster
from genq.common.fair_share import DOORBELL_BY, DOORBELL_MAX
from genq.common.keys import GROUP
from genq.common.wire import as_dict, as_text
from genq.worker.policy import preemption
from genq.worker.runtime.signals import interruptible, longest_block_ms

log = logging.getLogger("genq.worker")

LISTEN_BLOCK_MS = 1000
"""How long one blocked XREAD lasts before the listener looks whether it should go on."""
AWAY_PAUSE_S = 1.0
"""How long the listener waits after a Redis error (the loop's own retry reports Redis away)."""


RANK = {p.encode(): rank for p, rank in preemption.RANK.items()}
"""A ring's ``p`` (the highest priority it brings) as a rank."""
PRIORITIES = {rank: p for p, rank in preemption.RANK.items()}

Ring = tuple[str, Any, dict[bytes, bytes]]
"""A ring heard: its doorbell, its id (to acknowledge) and its fields."""

PASSED_BY, RELAYED = DOORBELL_BY.encode(), b"relayed"
"""A ring's fields when a read passed entries over for the workers that hold their prefixes
(PULL rings for them): ``by`` the reader; ``relayed`` once that reader rang it again
(``relay_own_rings``)."""


def _loudest(reply: Sequence[Any]) -> int:
    """The rank of the highest priority an XREAD reply's rings say they bring (0: none)."""
    ranks = [RANK.get(as_dict(f).get(b"p", b""), 0) for _, found in reply for _, f in found]
    return max(ranks, default=0)


def wait_for_ring(r: Any, doorbells: Sequence[str], consumer: str, block_ms: int) -> list[Ring]:
    """Block on the doorbells of the worker's lanes (as ``consumer`` of their groups) until one
    rings (a submission, or entries handed back), ``block_ms`` passes or a stop signal comes
    (``signals.interruptible``); the rings heard. Longer than ``MAX_BLOCK_MS`` only in the
    main thread and not on a cluster (``connection.blocking_call``)."""
    if is_cluster(r):
        block_ms = min(block_ms, MAX_BLOCK_MS)
    block_ms = longest_block_ms(block_ms)
    args: tuple[Any, ...] = ("XREADGROUP", "GROUP", GROUP, consumer, "COUNT", DOORBELL_MAX)
    args += ("BLOCK", block_ms, "STREAMS", *doorbells, *[">"] * len(doorbells))
    reply = interruptible(lambda: blocking_call(r, args, block_ms))
    if isinstance(reply, dict):  # RESP3
        reply = list(reply.items())
    return [(as_text(x[0]), e[0], as_dict(e[1])) for x in reply or [] for e in x[1]]


def own_rings(rings: Sequence[Ring], consumer: str) -> list[Ring]:
    """The rings ``consumer``'s own read rang for the holders of what it passed over."""
    me = consumer.encode()
    return [ring for ring in rings if ring[2].get(PASSED_BY) == me]


def relay_own_rings(r: Any, rings: Sequence[Ring], consumer: str) -> None:
    """A reader's wait took the rings its own read rang for the workers holding what it passed
    over (a holder finishing a turn was not blocked on the doorbell yet): ring once more for
    them, those not rung again already, so that the holder's wait takes them. The caller then
    sleeps instead of blocking, or it would take them back."""
    bells = {bell for bell, _, fields in rings if RELAYED not in fields}
    if not bells:
        return
    pipe = r.pipeline(transaction=False)
    for bell in sorted(bells):
        pipe.xadd(bell, {"n": 1, DOORBELL_BY: consumer, RELAYED: 1}, maxlen=DOORBELL_MAX)
    pipe.execute()


class DoorbellListener:
    """A thread that watches the queue's doorbell while ``arm(True)``; ``take()`` tells the
    loop whether it rang since the last call."""

    def __init__(self, r: redis.Redis, doorbells: Sequence[str]) -> None:
        self._redis = r
        self._doorbells = list(doorbells)
        self._armed = threading.Event()
        self.armed = False
        """Whether it listens now (the last ``arm``)."""
        self._rung = threading.Event()
        self._on_ring: Callable[[], None] | None = None
        self._on_priority: Callable[[str], None] | None = None
        self._since = "$"  # where a new listening starts (``arm``'s ``since_ms``)
        self._stopping = False
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start the thread (idempotent); it listens only while armed."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="genq-doorbell", daemon=True)
            self._thread.start()

    def arm(
        self,
        listening: bool,
        on_ring: Callable[[], None] | None = None,
        on_priority: Callable[[str], None] | None = None,
        since_ms: int | None = None,
    ) -> None:
        """Listen (the loop is busy and has room for more) or not (it is idle, or full).
        ``on_ring``: also call it, in this thread, at each ring heard while armed (a static
        batch runs: ``batch_reads.py`` reads in the loop's place). ``on_priority``: call it
        with the highest priority a submission's rings say they bring (their ``p``: a static
        batch below it stops, ``StaticRunner.outranked``). ``since_ms``: a listening that
        starts now hears the rings since then too (Redis' clock: the running batch's start, so
        that a ring between its start and this arming is not lost); else only later ones."""
        if not self.armed:
            self._since = "$" if since_ms is None else f"{max(0, since_ms)}-0"
        self._on_ring = on_ring if listening else None
        self._on_priority = on_priority if listening else None
        self.armed = listening
        if listening:
            self._armed.set()
        else:
            self._armed.clear()

    def take(self) -> bool:
        """Whether the doorbell rang since the last ``take``; clears it."""
        if self._rung.is_set():
            self._rung.clear()
            return True
        return False

    def rung(self) -> bool:
        """Whether the doorbell rang since the last ``take`` (does not clear it)."""
        return self._rung.is_set()

    def stop(self) -> None:
        """Stop listening, and wait for the thread to end (after its current blocked read, at
        most ``LISTEN_BLOCK_MS``): a daemon thread still inside a Redis read while the
        interpreter shuts down can crash the process (a worker exited -11 on SIGTERM in CI)."""
        self._stopping = True
        self._armed.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=LISTEN_BLOCK_MS / 1000 + AWAY_PAUSE_S + 1.0)

    def _run(self) -> None:
        last_id = dict.fromkeys(self._doorbells, "$")
        while not self._stopping:
            if not self._armed.is_set():
                self._armed.wait()
                last_id = dict.fromkeys(self._doorbells, self._since)  # (earlier: others')
                continue
            try:
                reply: Any = self._redis.xread(last_id, block=LISTEN_BLOCK_MS)  # type: ignore[arg-type]
            except REDIS_ERRORS as err:
                log.debug("doorbell listener: %r", err)
                self._rung.set()  # the loop's own read finds out what happened
                time.sleep(AWAY_PAUSE_S)
                continue
            if isinstance(reply, dict):  # RESP3
                reply = list(reply.items())
            heard = False
            for stream, found in reply or []:
                if found:
                    last_id[as_text(stream)] = as_text(found[-1][0])
                    heard = True
            on_ring, on_priority = self._on_ring, self._on_priority
            if heard and self._armed.is_set():
                self._rung.set()
                if on_ring is not None:
                    on_ring()
                loudest = _loudest(reply) if on_priority is not None else 0
                if on_priority is not None and loudest:
                    on_priority(PRIORITIES[loudest])
