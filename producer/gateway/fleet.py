"""Which models the queue's live workers serve: read from the consumer group and the workers'
heartbeat hashes (which expire with their workers), and reused for ``models_cache_s``."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import redis.asyncio as aioredis
from genq.common.keys import GROUP, QUEUED, RETURNED, Keys
from genq.common.wire import as_text


class Fleet:
    """The models of one queue's live workers."""

    def __init__(self, r: aioredis.Redis, keys: Keys, cache_s: float) -> None:
        self._redis = r
        self._keys = keys
        self._cache_s = cache_s
        self._read_at = -float("inf")
        self._models: dict[str, int] = {}
        self._created: dict[str, int] = {}
        self._reading: asyncio.Future[dict[str, int]] | None = None

    async def models(self) -> dict[str, int]:
        """Model name -> how many live workers serve it (read at most every ``cache_s``, by one
        read at a time: the requests that find the list stale meanwhile share that read)."""
        if time.monotonic() - self._read_at < self._cache_s:
            return self._models
        if self._reading is None:
            self._reading = asyncio.ensure_future(self._read())
            self._reading.add_done_callback(self._read_done)
        return await asyncio.shield(self._reading)

    def _read_done(self, _: object) -> None:
        self._reading = None

    async def _read(self) -> dict[str, int]:
        try:
            consumers: Any = await self._redis.xinfo_consumers(self._keys.stream("normal"), GROUP)
        except aioredis.ResponseError:  # no stream or group yet: no worker ever ran
            consumers = []
        placeholders = {RETURNED, QUEUED}  # not processes
        names = [as_text(c["name"]) for c in consumers if as_text(c["name"]) not in placeholders]
        pipe = self._redis.pipeline(transaction=False)
        for name in names:
            pipe.hmget(self._keys.worker(name), "model", "started_unix_ms")
        models: dict[str, int] = {}
        for model, started in await pipe.execute() if names else []:
            if model is not None:  # the hash expired: that worker is gone
                name = as_text(model)
                models[name] = models.get(name, 0) + 1
                self._created.setdefault(name, int(as_text(started or b"0")) // 1000)
        self._models, self._read_at = models, time.monotonic()
        return models

    def created(self, model: str) -> int:
        """When the first worker seen serving ``model`` started (unix seconds)."""
        return self._created.get(model, 0)
