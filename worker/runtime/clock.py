"""The worker's clock: Redis' own, not this host's.

Every age a worker computes (waits, aging, max-wait, deadlines) compares a moment with the time
Redis stamped on an entry (its id). A worker host whose clock is off by seconds or hours would
wait, expire and prioritise wrongly, so the worker reads Redis' ``TIME`` at start and every
``SYNC_EVERY_S`` (one cheap round trip) and keeps the offset: ``now_ms()`` is this host's clock
plus that offset, i.e. Redis' clock, whatever this host's says. Deadlines are relative to the
entry's time too (``Request.deadline_in_ms``), so a client's clock does not matter either.

One worker per process: the offset is the process's.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import redis

log = logging.getLogger("genq.worker")

SYNC_EVERY_S = 30.0
"""How often the offset to Redis' clock is measured again (clocks drift; NTP steps them)."""
WARN_SKEW_MS = 1_000
"""An offset this large is logged: the host's clock is wrong (genq does not mind)."""

_offset_ms = 0
sync_due_s = -float("inf")
"""When ``sync`` measures again (monotonic s; -inf: never measured): the worker's loop calls it
only from then."""


def now_ms() -> int:
    """Redis' time now, in Unix milliseconds (this host's clock plus the measured offset)."""
    return time.time_ns() // 1_000_000 + _offset_ms


def redis_time_ms(r: Any) -> int | None:
    """Redis' clock (``TIME``) in Unix milliseconds; None if this user may not run TIME."""
    try:
        reply = r.time()
    except redis.exceptions.NoPermissionError:
        return None
    seconds, micros = next(iter(reply.values())) if isinstance(reply, dict) else reply  # cluster
    return int(seconds) * 1000 + int(micros) // 1000


def sync(r: Any, force: bool = False) -> None:
    """Measure the offset to Redis' clock (``TIME``, halfway through the round trip) if
    ``SYNC_EVERY_S`` passed since the last time, or ``force``."""
    global _offset_ms, sync_due_s
    if not force and time.monotonic() < sync_due_s:
        return
    before = time.time_ns()
    redis_ms = redis_time_ms(r)
    after = time.time_ns()
    if redis_ms is None:
        if sync_due_s == -float("inf"):
            log.warning(
                "this Redis user may not run TIME (add +time to its ACL): timing by this "
                "host's clock, which must then be right"
            )
        sync_due_s = time.monotonic() + SYNC_EVERY_S
        return
    offset = redis_ms - (before + after) // 2 // 1_000_000
    if abs(offset - _offset_ms) >= WARN_SKEW_MS or (force and abs(offset) >= WARN_SKEW_MS):
        log.warning(
            "this host's clock is %+.1f s off Redis' (genq times everything by Redis' clock)",
            -offset / 1000,
        )
    _offset_ms, sync_due_s = offset, time.monotonic() + SYNC_EVERY_S
