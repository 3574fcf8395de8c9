"""Which models the queue's live workers serve: read from the consumer groups of every lane
(``Keys.lane``) and the workers' heartbeat hashes (which expire with their workers), with the
queue's default model, and reused for ``models_cache_s``."""

from __future__ import annotations

import asyncio
import time

import redis.asyncio as aioredis
from genq.common.keys import DEFAULT_MODEL_FIELD, GROUP, QUEUED, RETURNED, Keys
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
        self._kinds: dict[str, str] = {}
        self._reading: asyncio.Future[dict[str, int]] | None = None
        self.default_model: str | None = None
        """The queue's default model (``DEFAULT_MODEL_FIELD``), as of the last read."""

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
        pipe = self._redis.pipeline(transaction=False)
        pipe.smembers(self._keys.models)
        pipe.hget(self._keys.config, DEFAULT_MODEL_FIELD)
        lanes, default = await pipe.execute()
        self.default_model = None if default is None else as_text(default)
        pipe = self._redis.pipeline(transaction=False)
        for model in [None, *sorted(as_text(m) for m in lanes)]:
            pipe.xinfo_consumers(self._keys.lane(model).stream("normal"), GROUP)
        placeholders = {RETURNED, QUEUED}  # not processes
        names: list[str] = []
        for consumers in await pipe.execute(raise_on_error=False):
            if isinstance(consumers, Exception):  # no stream or group yet: no worker ran
                continue
            for c in consumers:
                name = as_text(c["name"])
                if name not in placeholders and name not in names:
                    names.append(name)
        pipe = self._redis.pipeline(transaction=False)
        for name in names:
            fields = ("model", "started_unix_ms", "adapters", "kind", "model_kinds")
            pipe.hmget(self._keys.worker(name), *fields)
        models: dict[str, int] = {}
        for model, started, adapters, kind, kinds in await pipe.execute() if names else []:
            if model is not None:  # the hash expired: that worker is gone
                # (a pool's worker: its models, space-separated, of several kinds maybe: each
                # MODEL:KIND in model_kinds; then its adapters)
                each = dict(p.rsplit(":", 1) for p in as_text(kinds or b"").split() if ":" in p)
                for name in [*as_text(model).split(), *as_text(adapters or b"").split()]:
                    models[name] = models.get(name, 0) + 1
                    self._created.setdefault(name, int(as_text(started or b"0")) // 1000)
                    self._kinds[name] = each.get(name) or as_text(kind or b"generation")
        self._models, self._read_at = models, time.monotonic()
        return models

    def kind(self, model: str) -> str:
        """``generation``, ``embedding`` or ``score`` (a cross-encoder): what the workers seen
        serving ``model`` do."""
        return self._kinds.get(model, "generation")

    def created(self, model: str) -> int:
        """When the first worker seen serving ``model`` started (unix seconds)."""
        return self._created.get(model, 0)
