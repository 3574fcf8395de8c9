"""Queue I/O: what the worker writes to Redis about its work, in one place.

Join (consumer groups and the queue's config), mark running and write final states (the APPLY
script), hand back, dead-letter, check for cancels, publish stats (reads are the reader's:
``reader.py`` and ``read_trip.py``; streamed text goes from a thread of its own:
``streamed_text.py``). Keys come from ``genq.common.keys``; the worker loop never builds one.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import redis
from genq.common import functions, history, script_calls, states
from genq.common.keys import GROUP, Keys
from genq.common.lua.hand_back import GIVE_BACK
from genq.common.prefixes import HOLDINGS_TTL_S
from genq.common.scripts import APPLY, MAX_QUEUE_DEPTH_FIELD, ApplyItem, apply, apply_args
from genq.common.settings import WorkerSettings
from genq.worker.policy.lookahead import Held
from genq.worker.runtime import clock, recovery
from genq.worker.runtime.dead_letter import add_to_pipeline
from genq.worker.runtime.fair_share import TenantAccounts, add_refunds, add_starts, give_back_args
from genq.worker.runtime.outcomes import Outcome
from genq.worker.runtime.prefixes import LoadNote, PrefixAffinity
from genq.worker.runtime.read_trip import CarriedRead, Delivered

Reading = CarriedRead | None
"""A read sent in a start's round trip (``Reader.with_start``); None: none."""


class QueueIO:
    """One worker's writes on its queue's streams, states and stats."""

    def __init__(
        self,
        *,
        r: redis.Redis,
        keys: Keys,
        consumer: str,
        settings: WorkerSettings,
        tenants: TenantAccounts,
        left_waiting: Callable[[], int],
        affinity: PrefixAffinity | None = None,
    ) -> None:
        self.redis = r
        self.keys = keys
        self.consumer = consumer
        self.settings = settings
        self.tenants = tenants
        """The tenants' accounts: refunds go with the final states they belong to."""
        self.left_waiting = left_waiting
        """The backlog the last read left (``ReadTrip.left_waiting``): an idle worker on an
        empty queue adds nothing to the history."""
        self.affinity = affinity
        """The prefixes this worker holds, told to the fleet with each start."""
        self._load = LoadNote()
        self._stats_key = keys.worker(consumer)
        self._streams = keys.streams()  # (every lane's: what APPLY acknowledges entries of)
        self._doorbells_renewed_s = -float("inf")  # (``add_stats``)

    def ensure_groups(self) -> None:
        """Create the consumer group on every priority stream (and the streams) if missing,
        publish the queue's limits that producers enforce, and load genq's Redis Functions.
        The group starts at the beginning, so requests sent before any worker ran are
        served."""
        join_lanes(self.redis, self.keys, self.settings.heartbeat_ttl_s, self.consumer)
        self.redis.hset(self.keys.config, MAX_QUEUE_DEPTH_FIELD, str(self.settings.max_queue_depth))
        # For clients in other languages (FCALL genq_submit, genq_cancel): a worker's start
        # keeps the library current after an upgrade, or a Redis that lost it.
        functions.try_load(self.redis)

    def starts(self, request_ids: Sequence[str]) -> dict[str, int]:
        """How many times workers started each of these requests (``recovery.starts``)."""
        return recovery.starts(self.redis, self.keys, request_ids)

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
        ttl, attempts = self.settings.result_ttl_s, self.settings.max_attempts
        streams = self._streams
        if read is not None:  # the read tells the prefixes; the APPLY rides after it
            call = apply_args(self.keys, ttl, "running", items, attempts, token, streams=streams)
            answers: list[int] = []

            def start(p: Any) -> Callable[[list[Any]], None]:
                script_calls.add(p, APPLY, len(call[0]), *call[0], *call[1])
                return lambda replies: answers.extend(replies[0])

            fetched = read(pipe, start)
            return answers, fetched
        told = affinity.ride(pipe) if affinity is not None and affinity.untold else None
        args = (self.redis, self.keys, ttl, "running", items)
        answers = apply(*args, max_attempts=attempts, pipe=pipe, token=token, streams=streams)
        if told is not None:
            told([])
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
        if recent or self.left_waiting():  # (idle, on an empty queue: nothing to add)
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


def raw_read_reply(response: Any, **options: Any) -> Any:
    """XREADGROUP's reply as ``[[stream, [[entry id, [field, value, ...]], ...]], ...]`` (the
    RESP2 shape; RESP3's map of streams is turned into it)."""
    return list(response.items()) if isinstance(response, dict) else response


PAST_EVERY_ID = "18446744073709551615-18446744073709551614"
"""A stream id past every entry's (the very last id there can be is read as "none": it would
create no consumer)."""


def join_lanes(r: Any, keys: Keys, doorbell_ttl_s: int, consumer: str | None = None) -> None:
    """Create the consumer group on every stream of the worker's lanes and their doorbells
    (and the streams) if missing; name its lanes in the queue's registry (``Keys.models``);
    with ``consumer``, make it a consumer of each work stream at once, so that the fleet
    (``/v1/models``, ``genq stats``) sees what the worker serves before its first read (a
    pool's worker reads a lane only once it holds the model)."""
    for stream in [*keys.streams(), *keys.doorbells]:
        try:
            r.xgroup_create(stream, GROUP, id="0", mkstream=True)
        except redis.ResponseError as err:
            if "BUSYGROUP" not in str(err):
                raise
    pipe = r.pipeline(transaction=False)
    if consumer is not None:  # (a read of its own entries past the last possible id: none,
        # none redelivered, and only the XREADGROUP the worker's ACL user has anyway)
        pipe.xreadgroup(GROUP, consumer, {stream: PAST_EVERY_ID for stream in keys.streams()})
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
