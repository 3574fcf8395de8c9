"""Whether Redis has room for what a tenant wants a gateway to keep there (``RedisRoom``).

A tenant's quotas (``quotas.py``) bound what each one keeps, but their defaults are sized for a
big Redis: several tenants, or one with generous limits, could still fill a small one, and a
full Redis refuses everyone's requests. So uploads and batches (the only big writes a tenant
asks for) also stop while Redis' memory, with them, would pass ``--storage-max-redis-fraction``
of its ``maxmemory``: 507 ``redis_storage_full``, and the rest of the memory stays for requests
and results, which are small and short-lived. Redis' memory is read with ``INFO memory`` (at
most once a second, shared by every caller); with no ``maxmemory``, or a user that may not run
``INFO`` (said once in the log), only the quotas apply.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import redis
from genq.producer.gateway.openai_errors import ApiError

log = logging.getLogger(__name__)

READ_EVERY_S = 1.0
"""How long one reading of Redis' memory is reused."""


class RedisRoom:
    """Refuses a tenant's big write while Redis is nearly full (``check``)."""

    def __init__(self, r: Any, fraction: float) -> None:
        self._redis = r
        self._fraction = fraction
        self._lock = asyncio.Lock()
        self._read_at = -READ_EVERY_S
        self._used = 0
        self._limit = 0
        self._may_read = fraction > 0

    async def check(self, adding: int, what: str) -> None:
        """Raise 507 ``redis_storage_full`` if ``adding`` more bytes would take Redis' memory
        past its share for tenants' stored things."""
        if not self._may_read:
            return
        async with self._lock:  # one INFO a second, however many callers
            if time.monotonic() - self._read_at >= READ_EVERY_S:
                await self._read()
        if self._limit <= 0:
            return
        room = self._fraction * self._limit
        if self._used + adding > room:
            raise ApiError(
                507,
                f"Redis is {self._used / self._limit:.0%} full: {what} of {adding} bytes would "
                f"pass the {self._fraction:.0%} of its maxmemory kept for uploads and batches "
                "(genq serve --storage-max-redis-fraction); the rest stays for requests. Try "
                "again later, or delete files you no longer need",
                type_="insufficient_storage",
                code="redis_storage_full",
            )
        self._used += adding  # until the next reading: callers in the same second add up

    async def _read(self) -> None:
        try:
            info = await self._redis.info("memory")
        except redis.exceptions.NoPermissionError:
            log.warning(
                "this Redis user may not run INFO: uploads and batches are bounded by the "
                "tenants' quotas only (grant +info for --storage-max-redis-fraction)"
            )
            self._may_read = False
            return
        self._used = int(info.get("used_memory", 0))
        self._limit = int(info.get("maxmemory", 0))
        self._read_at = time.monotonic()
