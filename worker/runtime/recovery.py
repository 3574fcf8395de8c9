"""Taking over the work of dead workers, without taking it from live ones.

Redis Streams keep every delivered, unacknowledged entry in the group's pending list with its
holder, its idle time and its delivery count. genq recovers with three rules:

1. **A live worker renews its claims.** A background thread (``ClaimKeeper``) re-claims the
   worker's own pending entries every ``claim_idle_ms / 4`` (``XCLAIM ... JUSTID``: resets their
   idle time, leaves their delivery count alone) and keeps its heartbeat key alive, even while
   the main thread is inside a long ``generate`` call. So a live worker's entries never look idle
   for ``claim_idle_ms``, however long its generations run.
2. **Entries idle for ``claim_idle_ms`` belong to a dead worker**, and any live worker takes them
   (``claim_idle``: XPENDING with IDLE per consumer, then XCLAIM; checked every
   ``claim_idle_ms / 4``), except the waiting entries the placeholder consumer ``QUEUED``
   holds, which are read in their tenants' fair order. A dead worker's entries are therefore
   taken over within about ``1.25 x claim_idle_ms`` of its death (plus the batch a busy taker
   is running). XCLAIM drops from the pending list entries that no longer exist in the stream
   (Redis >= 7), so a trimmed or deleted entry never comes back empty.
3. **A request started before runs alone** (counted at each start, in ``genq:att:{ID}``,
   which is read for every entry delivered again): its worker died running it, and if it is
   what kills workers it must not take batch-mates with it. **A request started
   ``max_attempts`` times**, every time by a worker that died before finishing it, is poison:
   it ends ``failed`` and is copied to the dead-letter stream instead of killing another
   worker. Starts are counted, not deliveries: a request that only waited in a dead worker's
   look-ahead, or was handed back, has not been tried, and runs batched as any other.

A worker restarted under the same consumer name first resumes its own pending entries
(``resume_own``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

import redis
from genq.common.connection import REDIS_ERRORS, refresh_cluster_view
from genq.common.keys import GROUP, QUEUED, Keys
from genq.common.wire import as_text

log = logging.getLogger("genq.worker")

PENDING_PAGE = 1000
"""Pending entries read per XPENDING call."""


def resume_own(
    r: redis.Redis,
    streams: Sequence[str],
    consumer: str,
    room: Callable[[], dict[str, int]],
    admit: Callable[[str, list[Any]], None],
) -> int:
    """Take back ``consumer``'s own pending entries (a restart under the same name), as the
    look-ahead has ``room``, handing each page to ``admit(stream, entries)``. Entries deleted
    while pending come back without fields: they are acknowledged. Returns how many were
    resumed."""
    total = 0
    for stream in streams:
        start = "0"
        while room()[stream] > 0:
            resp: Any = r.xreadgroup(GROUP, consumer, {stream: start}, count=room()[stream])
            entries = resp[0][1] if resp else []
            if not entries:
                break
            start = entries[-1][0].decode()
            gone = [e[0] for e in entries if not e[1]]
            if gone:
                r.xack(stream, GROUP, *gone)
            live = [e for e in entries if e[1]]
            total += len(live)
            admit(stream, live)
    return total


def starts(r: redis.Redis, keys: Keys, request_ids: Sequence[str]) -> dict[str, int]:
    """How many times workers started each of these requests (its attempts key, ``STARTS
    ENTRY TOKEN``; absent: never started, or already ended): above 0, a worker died running it."""
    pipe = r.pipeline(transaction=False)
    for request_id in request_ids:
        pipe.get(keys.attempts(request_id))
    out = {}
    for request_id, raw in zip(request_ids, pipe.execute(), strict=True):
        if raw:
            out[request_id] = int(as_text(raw).split(" ", 1)[0])
    return out


def own_pending(r: redis.Redis, stream: str, consumer: str) -> list[str]:
    """Ids of the entries pending for ``consumer`` on ``stream``."""
    ids: list[str] = []
    start = "-"
    while True:
        rows: Any = r.xpending_range(
            stream, GROUP, min=start, max="+", count=PENDING_PAGE, consumername=consumer
        )
        for row in rows:
            entry_id = row["message_id"]
            ids.append(as_text(entry_id))
        if len(rows) < PENDING_PAGE:
            return ids
        start = "(" + ids[-1]


def claim_idle(
    r: redis.Redis, stream: str, consumer: str, *, min_idle_ms: int, count: int
) -> list[Any]:
    """Take up to ``count`` entries idle for ``min_idle_ms`` on ``stream``, from any consumer
    but ``QUEUED`` (which holds the waiting entries: they are read in their tenants' fair
    order, never taken over by age). Entries deleted from the stream are dropped from the
    pending list by Redis."""
    taken: list[Any] = []
    consumers: Any = r.xinfo_consumers(stream, GROUP)
    for c in consumers:
        name = as_text(c["name"])
        if name == QUEUED or not int(c["pending"]) or len(taken) >= count:
            continue
        rows: Any = r.xpending_range(
            stream, GROUP, "-", "+", count - len(taken), consumername=name, idle=min_idle_ms
        )
        ids = [row["message_id"] for row in rows]
        if ids:
            claimed: Any = r.xclaim(stream, GROUP, consumer, min_idle_ms, ids)
            taken += [e for e in claimed if e is not None and e[1]]
    return taken


class ClaimKeeper(threading.Thread):
    """Renews a live worker's claims and heartbeat key from a thread of its own."""

    def __init__(
        self,
        *,
        r: redis.Redis,
        keys: Keys,
        consumer: str,
        claim_idle_ms: int,
        heartbeat_ttl_s: int,
        claimed: Callable[[], list[tuple[str, str]]],
    ) -> None:
        super().__init__(name="genq-claim-keeper", daemon=True)
        self.redis = r
        self.keys = keys
        self.consumer = consumer
        self.every_s = claim_idle_ms / 4000
        self.heartbeat_ttl_s = heartbeat_ttl_s
        self.claimed = claimed
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.wait(self.every_s):
            try:
                self.renew()
            except REDIS_ERRORS as err:  # Redis away, or a failover
                log.warning("could not renew claims: %s", err)
                refresh_cluster_view(self.redis)

    def renew(self) -> int:
        """Reset the idle time of every entry this worker holds; return how many. Only entries
        the worker knows it holds are renewed: one it lost track of (say, a read whose reply
        was lost with the connection) goes idle and is taken over like a dead worker's."""
        renewed = 0
        claimed = self.claimed()
        for stream in self.keys.streams():
            mine = {e for s, e in claimed if s == stream}
            if not mine:
                continue
            ids = [e for e in own_pending(self.redis, stream, self.consumer) if e in mine]
            for start in range(0, len(ids), PENDING_PAGE):
                chunk = ids[start : start + PENDING_PAGE]
                self.redis.xclaim(stream, GROUP, self.consumer, 0, list[Any](chunk), justid=True)
                renewed += len(chunk)
        if claimed:  # (holding nothing, the loop is free to beat: its heartbeat renews it)
            self.redis.expire(self.keys.worker(self.consumer), self.heartbeat_ttl_s)
        return renewed

    def stop(self) -> None:
        """Stop renewing (the worker is exiting)."""
        self._stop_event.set()
