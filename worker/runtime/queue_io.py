"""Queue I/O: everything the worker says to Redis about its work, in one place.

Join (consumer groups and the queue's config), resume (this consumer's own pending entries),
reclaim (entries of dead workers), read (new entries within the look-ahead's room), mark
running and write final states (the APPLY script), dead-letter, check for cancels, publish
stats (streamed text goes from a thread of its own: ``streamed_text.py``). Keys come from
``genq.common.keys``; the worker loop never builds one.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import redis
from genq.common import functions, history, script_calls, states
from genq.common.fair_share import DOORBELL_MAX
from genq.common.keys import GROUP, RETURNED, Keys
from genq.common.lua.hand_back import GIVE_BACK, TAKE_BACK
from genq.common.lua.read import PULL
from genq.common.prefixes import HOLDINGS_TTL_S
from genq.common.scripts import APPLY, MAX_QUEUE_DEPTH_FIELD, ApplyItem, apply, apply_args
from genq.common.settings import WorkerSettings
from genq.worker.policy.lookahead import Held
from genq.worker.runtime import clock, recovery
from genq.worker.runtime.dead_letter import add_to_pipeline
from genq.worker.runtime.doorbell import own_rings, relay_own_rings, wait_for_ring
from genq.worker.runtime.fair_share import TenantAccounts, add_refunds, add_starts, give_back_args
from genq.worker.runtime.outcomes import Outcome
from genq.worker.runtime.prefixes import LoadNote, PrefixAffinity

log = logging.getLogger("genq.worker")

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
"""A read's probe for tenants a worker holds none of (``QueueIO.read``)."""
Reading = tuple[dict[str, int], Probe] | None
"""A read sent in a start's round trip (``QueueIO.mark_running``): its room per stream and its
probe, as ``QueueIO.read``'s; None: none."""
Adds = Callable[[Any], None] | None
"""What queues more commands on a pipeline (``QueueIO._read``'s ``more``)."""


class QueueIO:
    """One worker's reads and writes on its queue's streams, states and stats."""

    def __init__(
        self,
        *,
        r: redis.Redis,
        keys: Keys,
        consumer: str,
        settings: WorkerSettings,
        tenants: TenantAccounts,
        read_rule: str,
        affinity: PrefixAffinity | None = None,
    ) -> None:
        self.redis = r
        self.keys = keys
        self.consumer = consumer
        self.settings = settings
        self.reclaim_at_s = 0.0
        """When ``reclaim`` looks for dead workers' entries next (monotonic s)."""
        self.tenants = tenants
        """The tenants' weights, and what goes back to their shares (``fair_share.py``): sent in
        the read's round trip."""
        self.read_rule = read_rule
        """How the read picks among tenants: the worker's order says (``read_rule``)."""
        self.affinity = affinity
        """The prefixes this worker holds, told to the fleet before each read."""
        self.affinity_args = (
            [settings.prefix_wait_ms, round(settings.prefix_load_factor * 100)]
            if settings.prefix_aware
            else [0, 0]
        )
        """PULL's affinity: how long an entry waits for the worker holding its prefix, and
        the load bound (``common/prefixes.py``); 0: none."""
        self._found_empty_s: float | None = None
        """When a read last found nothing (None: the last read found entries)."""
        self.idle_block_ms, self.idle_pace_s = idle_waits(settings)
        """An idle worker's longest block on the doorbell, and its read's pace (``idle_waits``)."""
        self.left_waiting = 1  # the backlog after the last read: 0, only a ring brings work
        self._rung: list[tuple[str, Any]] = []  # rings heard (doorbell, id), acked by a read
        self._left_in: dict[str, int] = {}  # per lane's doorbell: its backlog after a read
        self._unrung, self._pace_s = False, 0.0  # no ring ended the last wait; ``read``'s pace
        self._load = LoadNote()
        self._backlogs = [(k.doorbell, k.waiting) for k in keys.lanes()]
        """Each lane's doorbell and backlog (a read asks each backlog's length)."""
        self._stats_key = keys.worker(consumer)
        self._streams = keys.streams()  # (every lane's: what APPLY acknowledges entries of)
        self._doorbells_renewed_s = -float("inf")  # (``add_stats``)

    def ensure_groups(self) -> None:
        """Create the consumer group on every priority stream (and the streams) if missing,
        publish the queue's limits that producers enforce, and load genq's Redis Functions.
        The group starts at the beginning, so requests sent before any worker ran are
        served."""
        join_lanes(self.redis, self.keys, self.settings.heartbeat_ttl_s)
        self.redis.hset(self.keys.config, MAX_QUEUE_DEPTH_FIELD, str(self.settings.max_queue_depth))
        # For clients in other languages (FCALL genq_submit, genq_cancel): a worker's start
        # keeps the library current after an upgrade, or a Redis that lost it.
        functions.try_load(self.redis)

    def resume(
        self, room: Callable[[], dict[str, int]], admit: Callable[[str, list[Any]], None]
    ) -> int:
        """Take back this consumer's own pending entries (``recovery.resume_own``)."""
        resumed = recovery.resume_own(self.redis, self.keys.streams(), self.consumer, room, admit)
        if resumed:
            log.info("resumed %d pending entries of consumer %s", resumed, self.consumer)
        return resumed

    def reclaim(self, room: Callable[[], dict[str, int]]) -> list[tuple[str, list[Any]]]:
        """Entries idle for ``claim_idle_ms`` (their worker died: live workers renew theirs),
        taken over within ``room()`` (asked only when due); looked for at most every
        ``claim_idle_ms / 4``."""
        now_s = time.monotonic()
        if now_s < self.reclaim_at_s:
            return []
        self.reclaim_at_s = now_s + self.settings.claim_idle_ms / 4000
        taken = []
        for stream, n in room().items():
            if n <= 0:
                continue
            entries = recovery.claim_idle(
                self.redis, stream, self.consumer, min_idle_ms=self.settings.claim_idle_ms, count=n
            )
            if entries:
                log.info("took over %d entries of %s from dead workers", len(entries), stream)
                taken.append((stream, entries))
        return taken

    def starts(self, request_ids: Sequence[str]) -> dict[str, int]:
        """How many times workers started each of these requests (``recovery.starts``)."""
        return recovery.starts(self.redis, self.keys, request_ids)

    def read(
        self, room: dict[str, int], pace_s: float = 0.0, probe: Probe = (0, []), total: int = 0
    ) -> Delivered:
        """Entries for this worker, each stream up to its room.

        One round trip: the PULL script, which takes from each priority the entries of the
        tenants with the least service (``policy/fair_share.py``), and a probe (XPENDING, one
        row) per priority of the entries other workers handed back (``RETURNED``). Only when a
        probe finds some does a second call (the TAKE_BACK script) claim them, up to the room
        again: they are older than anything new, and leaving them for later would let them
        wait behind newer work. ``pace_s``: nothing, without asking, if a read found the queue
        empty less than that long ago (see ``read_wait_s``; 0: ask). An idle worker blocks on
        the doorbell before it reads (``wait_for_doorbell``, the loop's ``idle``). ``probe``:
        per priority, up to so many more from tenants other than the ``PRIORITY|TENANT`` pairs
        named, even past the room (``Lookahead.probe``). ``total``: at most so many in all, the
        highest priorities first (0: no cap)."""
        self._pace_s, pipe = pace_s, self.redis.pipeline(transaction=False)
        if not (any(room.values()) or probe[0]) or (not self._rung and self.read_wait_s() > 0):
            return []
        return self._read(pipe, room, probe, total)[0]

    def read_wait_s(self) -> float:
        """How long until a paced read asks Redis again (0: it would ask now)."""
        if self._found_empty_s is None:
            return 0.0
        return max(0.0, self._found_empty_s + self._pace_s - time.monotonic())

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

    def _read(
        self, pipe: Any, room: dict[str, int], probe: Probe, total: int, more: Adds = None
    ) -> tuple[Delivered, Any]:
        """``read``'s commands on ``pipe`` (after what it holds), then ``more(pipe)``'s (one
        reply: the APPLY of the start that carries this read), in one round trip: what it
        read, and ``more``'s reply (None without)."""
        streams, asked = self._streams, [s for s, n in room.items() if n > 0]
        woken = bool(self._rung)
        by_bell: dict[str, list[Any]] = {}  # the rings heard, acknowledged and deleted
        for doorbell, ring in self._rung:
            by_bell.setdefault(doorbell, []).append(ring)
        for doorbell, rings in by_bell.items():
            pipe.xack(doorbell, GROUP, *rings)
            pipe.xdel(doorbell, *rings)
        self._rung = []
        sending = self.tenants.add_deferred(pipe)
        affinity = self.affinity
        holds = affinity.add_to(pipe) if affinity is not None and affinity.untold else 0
        skip = len(pipe)
        # Entries handed back ring the doorbell: after a wait no ring ended, none came since
        # the last read's probe (one whose ring got lost is taken over after claim_idle_ms).
        probed = [] if self._unrung else asked
        self._unrung = False
        for s in probed:
            pipe.xpending_range(s, GROUP, "-", "+", 1, RETURNED)
        rooms = [room[s] if s in asked else 0 for s in streams]
        now, burst = clock.now_ms(), self.settings.max_batch_tokens
        rule = self.read_rule
        args = [self.keys.config, *streams, self.consumer, rule, now, burst, *rooms, total]
        args += [probe[0], *self.affinity_args, *probe[1]]
        script_calls.add(pipe, PULL, 1 + len(streams), *args)
        for _, backlog in self._backlogs:
            pipe.llen(backlog)
        if more is not None:
            more(pipe)
        replies = self.tenants.weights.read_with(pipe)
        extra = replies.pop() if more is not None else None
        replies = replies[skip:]
        self._left_in = {bell: int(replies.pop()) for bell, _ in reversed(self._backlogs)}
        self.left_waiting = sum(self._left_in.values())
        self.tenants.sent(sending)
        if holds and affinity is not None:
            affinity.sent(holds)
        fresh: Delivered = replies[-1] or []
        back = [s for s, probe in zip(probed, replies[:-1], strict=True) if probe]
        delivered = self.take_back({s: room[s] for s in back}) + fresh if back else fresh
        self._found_empty_s = None if delivered else time.monotonic()
        if woken and delivered and self.left_waiting > 0:
            pass_the_ring_on(self.redis, self._left_in)
        return delivered, extra

    def take_back(self, room: dict[str, int]) -> Delivered:
        """Claim entries other workers handed back, up to ``room`` per stream (one script)."""
        args: list[str | int] = [GROUP, RETURNED, self.consumer, *room.values()]
        reply: Any = script_calls.call(self.redis, TAKE_BACK, len(room), *room, *args)
        return reply or []

    def hand_back(self, held: Sequence[Held], *, rings: int) -> None:
        """Give these entries (read, not started) back to the waiting, at the front of their
        tenants' indexes, with their charges returned (GIVE_BACK), for whichever worker reads
        next; and ring the doorbell ``rings`` times, which wakes as many idle workers."""
        args = give_back_args(self.keys, held, rings)
        pipe = self.redis.pipeline(transaction=False)
        script_calls.add(pipe, GIVE_BACK, 1 + len(self.keys.streams()), *args)
        expire_doorbells(pipe, self.keys, self.settings.heartbeat_ttl_s)
        script_calls.execute(pipe)

    def mark_running(
        self,
        items: Sequence[ApplyItem],
        token: str,
        held: Sequence[Held] = (),
        read: Reading = None,
    ) -> tuple[list[int], Delivered | None]:
        """Write these requests' ``running`` states (one APPLY call, counting a start each);
        in the same round trip, move the charges of ``held`` (the same requests) from their
        tenants' reserved to their service, and tell the prefixes held from now (before a
        result can reach a client, who may send the next turn at once). Answers in order, and
        what ``read`` brought (None: not sent): the next batch's, in this round trip."""
        if not items:
            return [], None
        pipe, affinity = self.redis.pipeline(transaction=False), self.affinity
        add_starts(pipe, self.keys, held)
        if read is not None:  # (the read tells the prefixes; APPLY queued after it, not ``apply``:
            # that would run the pipe and keep only its own replies)
            ttl, attempts = self.settings.result_ttl_s, self.settings.max_attempts
            call = apply_args(
                self.keys, ttl, "running", items, attempts, token, streams=self._streams
            )
            fetched, answers = self._read(
                pipe,
                *read,
                0,
                more=lambda p: script_calls.add(p, APPLY, len(call[0]), *call[0], *call[1]),
            )
            return list(answers), fetched
        holds = affinity.add_to(pipe) if affinity is not None and affinity.untold else 0
        args = (self.redis, self.keys, self.settings.result_ttl_s, "running", items)
        attempts, streams = self.settings.max_attempts, self._streams
        answers = apply(*args, max_attempts=attempts, pipe=pipe, token=token, streams=streams)
        if holds and affinity is not None:
            affinity.sent(holds)
        return answers, None

    def write_final(self, outcomes: Sequence[Outcome], also: Callable[[Any], None]) -> list[int]:
        """Write these final states with their events and acknowledge their entries (one
        APPLY call), with ``also(pipe)``'s commands and the tenants' refunds in the same round
        trip. One this worker never started proves it owns its id first (expired, malformed);
        one it started was checked then."""
        items = [(o.request_id, o.stream, o.entry_id, o.state_json) for o in outcomes]
        unstarted = [o.queue_wait_ms is None for o in outcomes]
        refunds = [o.refund for o in outcomes if o.refund is not None]
        pipe = self.redis.pipeline(transaction=False)
        also(pipe)
        add_refunds(pipe, self.keys, refunds, self.tenants.weights.limited)
        args = (self.redis, self.keys, self.settings.result_ttl_s, "final", items)
        return apply(*args, pipe=pipe, unstarted=unstarted, streams=self._streams)

    def dead_letter(self, record: dict[str, str | int], *, ack: bool) -> None:
        """Add ``record`` to the dead-letter stream; with ``ack``, also drop its work entry (an
        entry with no usable id: there is no result to write)."""
        pipe = self.redis.pipeline(transaction=True)
        add_to_pipeline(pipe, self.keys, record)
        if ack:
            stream, entry_id = str(record["stream"]), str(record["entry_id"])
            pipe.xack(stream, GROUP, entry_id)
            pipe.xdel(stream, entry_id)
        pipe.execute()

    def final_ones(self, request_ids: Sequence[str]) -> set[str]:
        """Which of these requests are final (cancelled by a client while running, say)."""
        raws = self.redis.mget([self.keys.result(i) for i in request_ids])
        return {i for i, raw in zip(request_ids, raws, strict=True) if states.is_final(raw)}

    def add_stats(self, pipe: Any, fields: dict[str, Any], recent: dict[str, int]) -> None:
        """Queue the refresh of this worker's stats hash (and its TTL) on ``pipe``, of the
        doorbells' TTL (they live while workers do: a joining worker makes them again; renewed
        every third of it, not with every result), and the addition of ``recent`` (what it did
        since the last time) to the queue's history."""
        key, ttl_s = self._stats_key, self.settings.heartbeat_ttl_s
        pipe.hset(key, mapping=fields)
        pipe.expire(key, ttl_s)
        now_s = time.monotonic()
        if now_s - self._doorbells_renewed_s >= ttl_s / 3:
            self._doorbells_renewed_s = now_s
            expire_doorbells(pipe, self.keys, ttl_s)
        if recent or self.left_waiting:  # (idle, on an empty queue: nothing to add)
            history.add(pipe, self.keys, recent, clock.now_ms())

    def publish_stats(self, fields: dict[str, Any], recent: dict[str, int]) -> None:
        """Refresh this worker's stats hash now (the heartbeat), with its load for the
        affinity's load bound (``common/prefixes.py``): once a heartbeat, not with every
        result the writer publishes."""
        pipe = self.redis.pipeline(transaction=False)
        self.add_stats(pipe, fields, recent)
        held = int(fields.get("held", 0)) + int(fields.get("in_flight", 0))
        if self.settings.prefix_aware and self._load.due(held):
            pipe.hset(self.keys.load, self.consumer, held)
            pipe.expire(self.keys.load, HOLDINGS_TTL_S)
        script_calls.execute(pipe)

    def leave(self) -> None:
        """Send the corrections still deferred; delete this worker's stats hash (else it
        expires on its own) and its load."""
        self.tenants.flush()
        self.redis.delete(self._stats_key)
        self.redis.hdel(self.keys.load, self.consumer)


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


def raw_read_reply(response: Any, **options: Any) -> Any:
    """XREADGROUP's reply as ``[[stream, [[entry id, [field, value, ...]], ...]], ...]`` (the
    RESP2 shape; RESP3's map of streams is turned into it)."""
    return list(response.items()) if isinstance(response, dict) else response


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


def join_lanes(r: Any, keys: Keys, doorbell_ttl_s: int) -> None:
    """Create the consumer group on every stream of the worker's lanes and their doorbells
    (and the streams) if missing; name its lanes in the queue's registry (``Keys.models``)."""
    for stream in [*keys.streams(), *keys.doorbells]:
        try:
            r.xgroup_create(stream, GROUP, id="0", mkstream=True)
        except redis.ResponseError as err:
            if "BUSYGROUP" not in str(err):
                raise
    pipe = r.pipeline(transaction=False)
    expire_doorbells(pipe, keys, doorbell_ttl_s)
    named = [m for m in (k.model for k in keys.lanes()) if m is not None]
    if named:
        pipe.sadd(keys.models, *named)
    pipe.execute()


def expire_doorbells(pipe: Any, keys: Keys, ttl_s: int) -> None:
    """Queue on ``pipe`` the renewal of the worker's lanes' doorbells (they live while workers
    do: a joining worker makes them again)."""
    for doorbell in keys.doorbells:
        pipe.expire(doorbell, ttl_s)
