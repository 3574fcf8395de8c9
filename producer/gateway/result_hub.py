"""One gateway's waiting requests, read by a few shared Redis connections (``ResultHub``).

Each completion or stream the gateway answers waits for its request's event stream. A
blocking XREAD holds a connection for as long as it waits, so one read per waiting request
would need as many connections as requests (redis-py's pool stopped at 100: the 101st
waiting request, whoever sent it, got a 503). Instead the hub runs a few *readers*, each a
task with its own connection blocking on up to ``STREAMS_PER_READER`` event streams at once,
and hands each request's events to the HTTP request waiting for them. Connections grow with
the waiting requests, one per ``STREAMS_PER_READER``; 5,000 waiting requests take 10.

A reader blocked in XREAD does not see a request that joins it meanwhile, so it also reads
its *wake stream* (``Keys.reader_wake``): a join XADDs one entry there (at most one per read
in flight: joins coalesce), which ends the read at once; the next one includes the newcomers.

On a Redis Cluster the event streams of many requests live on different nodes and one XREAD
cannot wait for them all: there the routes wait with the client's own polling (which holds no
connection between its rounds), and the hub is not used.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import AsyncIterator
from typing import Any

import redis.asyncio as aioredis
from genq.common.connection import MAX_BLOCK_MS, REDIS_ERRORS
from genq.common.errors import ResultTimeout
from genq.common.keys import Keys
from genq.common.models import Result
from genq.common.wire import as_text
from genq.producer.waiting import StreamReader

log = logging.getLogger(__name__)

STREAMS_PER_READER = 500
"""Event streams one reader blocks on at once (one XREAD's keys)."""
WAKE_TTL_S = 3600
"""A wake stream outlives its reader by this much at most (a gateway killed without its
shutdown leaves one small stream behind for an hour)."""
RETRY_PAUSE_S = 0.5
"""A reader's pause after a Redis error before it reads again (the waiting requests keep their
own timeouts)."""


class _Waiting:
    """One request waiting: where its stream was read up to, and what came since."""

    __slots__ = ("inbox", "key", "last_id", "reader")

    def __init__(self, key: str) -> None:
        self.key = key
        self.last_id = "0-0"
        self.inbox: asyncio.Queue[list[Any]] = asyncio.Queue()
        self.reader: _Reader | None = None


class _Reader:
    """One connection's blocking read over the event streams of up to ``STREAMS_PER_READER``
    waiting requests and its own wake stream."""

    def __init__(self, hub: ResultHub, wake_key: str) -> None:
        self.hub = hub
        self.wake_key = wake_key
        self.wake_last = "0-0"
        self.members: dict[str, _Waiting] = {}
        self.reading = False
        self.woken = False
        self.joined = asyncio.Event()
        self.task = asyncio.create_task(self._run())

    def join(self, waiting: _Waiting) -> None:
        self.members[waiting.key] = waiting
        waiting.reader = self
        self.joined.set()
        if self.reading and not self.woken:  # it is blocked on the others: end that read
            self.woken = True
            self.hub.wake(self.wake_key)

    async def _run(self) -> None:
        while True:
            if not self.members:
                self.joined.clear()
                await self.joined.wait()
                continue
            members = dict(self.members)
            streams: dict[Any, Any] = {self.wake_key: self.wake_last}
            streams.update((k, w.last_id) for k, w in members.items())
            self.reading, self.woken = True, False
            try:
                response = await self.hub.redis.xread(streams, block=MAX_BLOCK_MS)
            except REDIS_ERRORS as err:  # Redis away: the requests wait on (their timeouts run)
                log.warning("result reader: %s; reading again in %s s", err, RETRY_PAUSE_S)
                await asyncio.sleep(RETRY_PAUSE_S)
                continue
            finally:
                self.reading = False
            self._hand_out(response, members)

    def _hand_out(self, response: Any, members: dict[str, _Waiting]) -> None:
        for stream, entries in response or []:
            key = as_text(stream)
            if key == self.wake_key:
                self.wake_last = as_text(entries[-1][0])
                continue
            waiting = members.get(key)
            if waiting is None or not entries:
                continue
            waiting.last_id = as_text(entries[-1][0])
            waiting.inbox.put_nowait(entries)


class ResultHub:
    """The gateway's waiting requests and the readers that read their event streams."""

    def __init__(self, redis_url: str, keys: Keys, wake_redis: aioredis.Redis) -> None:
        from genq.common.connection import connect_async

        self.keys = keys
        self.redis = connect_async(redis_url)
        """The readers' connections (one each, at most, while they block)."""
        self._wake_redis = wake_redis
        self._name = uuid.uuid4().hex[:12]
        self._readers: list[_Reader] = []
        self._wakes: set[asyncio.Task[None]] = set()

    @property
    def connections(self) -> int:
        """How many readers (each holds at most one Redis connection)."""
        return len(self._readers)

    @property
    def waiting(self) -> int:
        """How many requests wait."""
        return sum(len(r.members) for r in self._readers)

    def _reader_with_room(self) -> _Reader:
        reader = min(self._readers, key=lambda r: len(r.members), default=None)
        if reader is None or len(reader.members) >= STREAMS_PER_READER:
            reader = _Reader(self, self.keys.reader_wake(f"{self._name}.{len(self._readers)}"))
            self._readers.append(reader)
        return reader

    def wake(self, wake_key: str) -> None:
        """End a reader's blocking read now (one XADD on the gateway's shared pool)."""
        task = asyncio.create_task(self._wake(wake_key))
        self._wakes.add(task)
        task.add_done_callback(self._wakes.discard)

    async def _wake(self, wake_key: str) -> None:
        try:
            pipe = self._wake_redis.pipeline(transaction=False)
            pipe.xadd(wake_key, {"w": "1"}, maxlen=1, approximate=False)
            pipe.expire(wake_key, WAKE_TTL_S)
            await pipe.execute()
        except REDIS_ERRORS as err:  # the reader's own read ends within MAX_BLOCK_MS anyway
            log.warning("could not wake a result reader: %s", err)

    async def follow(self, request_id: str, timeout_s: float | None) -> AsyncIterator[str | Result]:
        """The request's text pieces as they come, then its final Result (as
        ``AsyncClient.stream``); raises ResultTimeout if it is not final within ``timeout_s``."""
        follower = StreamReader(self.keys, request_id, timeout_s)
        waiting = _Waiting(follower.key)
        self._reader_with_room().join(waiting)
        try:
            while not follower.done:
                block_ms = follower.next_block_ms()
                if block_ms is None:
                    raise ResultTimeout(f"request {request_id} not final after {timeout_s} s")
                if waiting.inbox.empty():
                    try:
                        entries = await asyncio.wait_for(waiting.inbox.get(), block_ms / 1000)
                    except TimeoutError:
                        continue
                else:  # (no timer and no task for what is there already)
                    entries = waiting.inbox.get_nowait()
                for item in follower.take([(waiting.key, entries)]):
                    yield item
        finally:
            if waiting.reader is not None:
                waiting.reader.members.pop(waiting.key, None)

    async def result(self, request_id: str, timeout_s: float | None) -> Result:
        """The request's final Result (as ``AsyncClient.result``)."""
        async for item in self.follow(request_id, timeout_s):
            if isinstance(item, Result):
                return item
        raise ResultTimeout(f"request {request_id} ended without a result")  # pragma: no cover

    async def close(self) -> None:
        """Stop the readers, delete their wake streams, close their connections."""
        for reader in self._readers:
            reader.task.cancel()
        for reader in self._readers:
            with contextlib.suppress(asyncio.CancelledError):
                await reader.task
        with contextlib.suppress(*REDIS_ERRORS):
            if self._readers:
                await self._wake_redis.delete(*(r.wake_key for r in self._readers))
        await self.redis.aclose()
