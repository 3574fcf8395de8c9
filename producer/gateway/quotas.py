"""What one tenant may keep in Redis through a gateway (``Quotas``): uploaded files (how many,
and their bytes together), batches and stored responses, each counted while it is kept (its
result TTL).

Each kind is a sorted set per tenant (``Keys.stored``): a member per thing kept (a file's
member carries its size: ``FILE_ID:BYTES``), scored by when it expires. One script (``QUOTA_CLAIM``)
drops the expired members, checks the limit and adds the new one, atomically, so two gateways
cannot both take the last place; deleting a file or a response gives its place back. The
limits are the gateway's defaults (``--tenant-max-files`` ...), or the tenant's own (``genq
tenants set --max-files`` ...); past one, the tenant gets a 429 ``tenant_quota`` naming it,
and no other tenant is touched.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from genq.common import script_calls
from genq.common.keys import Keys
from genq.common.lua.quotas import QUOTA_CLAIM
from genq.common.tenants import TenantSettings
from genq.common.wire import as_text
from genq.producer.gateway.openai_errors import ApiError

SETTINGS_CACHE_S = 5.0
"""How long a tenant's own limits are reused before they are read again."""
KINDS = {"files": "max_files", "batches": "max_batches", "responses": "max_responses"}
FLAGS = {
    "files": "--max-files",
    "batches": "--max-batches",
    "responses": "--max-responses",
    "bytes": "--max-stored-bytes",
}


@dataclass(frozen=True)
class Limits:
    """One tenant's limits (0: none)."""

    files: int
    stored_bytes: int
    batches: int
    responses: int


class Quotas:
    """Claims and gives back the places of what tenants keep, on one queue."""

    def __init__(self, redis: Any, keys: Keys, defaults: Limits, ttl_s: int) -> None:
        self._redis = redis
        self._keys = keys
        self._defaults = defaults
        self._ttl_s = ttl_s
        self._cache: dict[str, tuple[float, Limits]] = {}

    async def limits(self, tenant: str) -> Limits:
        """The tenant's limits: its own where it set them, else the gateway's defaults."""
        cached = self._cache.get(tenant)
        if cached is not None and time.monotonic() - cached[0] < SETTINGS_CACHE_S:
            return cached[1]
        raw = await self._redis.hget(self._keys.tenants, tenant)
        own = TenantSettings.from_json(raw) if raw else TenantSettings()
        d = self._defaults
        limits = Limits(
            files=own.max_files or d.files,
            stored_bytes=own.max_stored_bytes or d.stored_bytes,
            batches=own.max_batches or d.batches,
            responses=own.max_responses or d.responses,
        )
        self._cache[tenant] = (time.monotonic(), limits)
        return limits

    async def claim(self, tenant: str, kind: str, member: str, size: int = 0) -> None:
        """Take a place for ``member`` (a file: ``size`` bytes) among ``tenant``'s kept
        ``kind``, or raise 429 ``tenant_quota`` saying which limit it met."""
        limits = await self.limits(tenant)
        most = getattr(limits, kind)
        most_bytes = limits.stored_bytes if kind == "files" else 0
        now = int(time.time())
        key = self._keys.stored(tenant, kind)
        answer = await script_calls.call_async(
            self._redis,
            QUOTA_CLAIM,
            1,
            key,
            now,
            now + self._ttl_s,
            f"{member}:{size}" if kind == "files" else member,
            most,
            most_bytes,
            size,
            self._ttl_s,
        )
        verdict, value = as_text(answer[0]), int(answer[1])
        if verdict == "ok":
            return
        if verdict == "bytes":
            message = (
                f"tenant {tenant!r} keeps {value} bytes of files; {size} more would pass its "
                f"limit of {most_bytes} (genq tenants set {tenant} {FLAGS['bytes']}, or "
                "delete some)"
            )
        else:
            message = (
                f"tenant {tenant!r} keeps {value} {kind}, its limit (genq tenants set {tenant} "
                f"{FLAGS[kind]}, or delete some; they also expire with the result TTL)"
            )
        raise ApiError(429, message, type_="insufficient_quota", code="tenant_quota")

    async def give_back(self, tenant: str, kind: str, member: str, size: int | None = None) -> None:
        """``member`` is no longer kept (deleted): its place is free."""
        name = member if size is None else f"{member}:{size}"
        await self._redis.zrem(self._keys.stored(tenant, kind), name)
