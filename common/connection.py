"""Opening Redis connections that ride out a dropped connection or a restarting redis-server,
to one Redis or to a Redis Cluster.

URLs: ``redis://`` (``rediss://`` for TLS, ``unix://``), with user and password for AUTH/ACL;
``redis+cluster://host:port`` (``rediss+cluster://`` for TLS) for a Redis Cluster, given any
one node: the client learns the others and follows slot moves and failovers.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import hiredis
import redis
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import ExponentialBackoff
from redis.cluster import RedisCluster

try:  # redis-py 5 and later
    from redis.connection import HiredisRespSerializer
except ImportError:  # pragma: no cover - older redis-py packs its own way
    HiredisRespSerializer = None  # type: ignore[assignment,misc]
from redis.retry import Retry

RETRIES = 8
MAX_BLOCK_MS = 2_000
"""Longest blocking read (XREAD / XREADGROUP BLOCK) genq issues: well under the socket timeout
of a client made with redis-py's defaults (5 s since redis-py 8), which would otherwise end a
read that blocks as long as it with a TimeoutError. Waiting longer loops (each read blocks: it
is not polling), which also keeps a dropped connection from hanging a caller forever."""
"""Retries of one command on a connection error, with exponential backoff (0.05 s .. 2 s):
about 8 s in all, enough for a redis-server restart or a cluster failover. Callers loop on
top of that."""

TRANSIENT_ERRORS: tuple[type[Exception], ...] = (
    redis.ConnectionError,
    redis.TimeoutError,
    redis.exceptions.ClusterDownError,
    redis.exceptions.TryAgainError,
    redis.exceptions.MasterDownError,
    redis.exceptions.SlotNotCoveredError,
)
"""Errors that pass: Redis restarting or unreachable, or a cluster in the middle of a failover.
Whoever loops on Redis waits and tries again on these (after ``refresh_cluster_view``)."""

CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}
T = TypeVar("T")


class _Refused(Exception):
    """Carries a refused password out of redis-py's retry loop, which retries every
    ConnectionError (AuthenticationError is one) and lets anything else through at once."""

    def __init__(self, error: redis.ConnectionError) -> None:
        super().__init__(str(error))
        self.error = error


def _nothing_listens(err: redis.ConnectionError) -> bool:
    """The connection was refused: no server at that address (not one that dropped us)."""
    cause = err.__cause__ or err.__context__
    return isinstance(cause, ConnectionRefusedError | FileNotFoundError) or (
        "Connection refused" in str(err)
    )


def _give_up_if_hopeless(err: redis.ConnectionError, ever_connected: bool) -> None:
    """Raise ``_Refused`` for errors not worth retrying: a refused password, or nothing
    listening at an address this client never reached (a wrong URL; a server that restarts
    was reached before). Anything else is left to the caller to re-raise (and retry)."""
    if isinstance(err, redis.AuthenticationError) or (not ever_connected and _nothing_listens(err)):
        raise _Refused(err) from err


class _Retry(Retry):
    """redis-py's retry, except that a refused password, or a URL where nothing ever listened,
    fails at once: a wrong password or port should not take ~9 s to say so. A server this
    client reached before is waited for as usual (it may be restarting)."""

    connected = False

    def call_with_retry(self, do: Callable[[], T], fail: Any, *args: Any, **kwargs: Any) -> T:
        def guarded() -> T:
            try:
                out = do()
            except redis.ConnectionError as err:  # AuthenticationError is one
                _give_up_if_hopeless(err, self.connected)
                raise
            self.connected = True
            return out

        try:
            return super().call_with_retry(guarded, fail, *args, **kwargs)
        except _Refused as refused:
            raise refused.error from None


class _AsyncRetry(AsyncRetry):
    """The asyncio twin of ``_Retry``."""

    connected = False

    async def call_with_retry(
        self, do: Callable[[], Awaitable[T]], fail: Any, *args: Any, **kwargs: Any
    ) -> T:
        async def guarded() -> T:
            try:
                out = await do()
            except redis.ConnectionError as err:  # AuthenticationError is one
                _give_up_if_hopeless(err, self.connected)
                raise
            self.connected = True
            return out

        try:
            return await super().call_with_retry(guarded, fail, *args, **kwargs)
        except _Refused as refused:
            raise refused.error from None


def cluster_url(url: str) -> str | None:
    """The plain URL of a ``redis+cluster://`` URL (None for any other URL)."""
    scheme, sep, rest = url.partition("://")
    plain = CLUSTER_SCHEMES.get(scheme.lower())
    return f"{plain}://{rest}" if sep and plain else None


BLOCK_MARGIN_S = 5.0
"""A long blocking read (``blocking_call``) waits for Redis' reply this much past its block."""


def blocking_call(r: Any, args: Sequence[Any], block_ms: int) -> Any:
    """A blocking command (its ``BLOCK`` of ``block_ms`` among ``args``) on ``r``. One that
    blocks longer than ``MAX_BLOCK_MS`` is sent on a connection of ``r``'s pool and its reply
    read with a timeout of the block plus ``BLOCK_MARGIN_S``, not the socket's (a connection
    found closed, say by a Redis restart while it sat in the pool, is opened again once). Not
    on a cluster client: its callers block at most ``MAX_BLOCK_MS``."""
    if block_ms <= MAX_BLOCK_MS or is_cluster(r):
        return r.execute_command(*args)
    pool = r.connection_pool
    conn = pool.get_connection()
    try:
        for attempt in (1, 2):
            try:
                conn.send_command(*args)
                return conn.read_response(timeout=block_ms / 1000 + BLOCK_MARGIN_S)
            except redis.ConnectionError:
                conn.disconnect()
                if attempt == 2:
                    raise
    finally:
        pool.release(conn)


def is_cluster(r: Any) -> bool:
    """True if ``r`` is a Redis Cluster client (sync or asyncio)."""
    return isinstance(r, RedisCluster | AsyncRedisCluster)


def _retry_options(kwargs: dict[str, Any], retry: Any) -> dict[str, Any]:
    kwargs.setdefault("retry", retry)
    kwargs.setdefault("retry_on_error", [redis.ConnectionError, redis.TimeoutError])
    return kwargs


class CommandPacker:
    """Packs commands with hiredis in one call. redis-py's own hiredis packer first copies every
    argument in a Python loop (to turn bytearray and memoryview into bytes), which costs more
    than the packing itself for genq's script calls of thousands of arguments; this one hands
    them to hiredis as they are and falls back to redis-py's packer only for what hiredis
    refuses. Given to redis-py's connections with its ``command_packer`` option."""

    def __init__(self) -> None:
        self._fallback = HiredisRespSerializer()

    def pack(self, *args: Any) -> list[bytes]:
        first = args[0].encode() if isinstance(args[0], str) else args[0]
        if isinstance(first, bytes) and b" " in first:  # 'CONFIG GET': two words
            args = (*first.split(), *args[1:])
        try:
            return [hiredis.pack_command(args)]
        except TypeError:  # bytearray, memoryview: redis-py converts them (or says why not)
            packed: list[bytes] = self._fallback.pack(*args)
            return packed


def connect(url: str, **kwargs: Any) -> redis.Redis:
    """A client for ``url`` that retries commands on connection errors. For a cluster URL it is
    a ``redis.cluster.RedisCluster``, which has the same commands for genq's purposes."""
    retry = _Retry(ExponentialBackoff(cap=2.0, base=0.05), RETRIES)
    plain = cluster_url(url)
    if plain is not None:
        kwargs.setdefault("retry", retry)
        cluster: Any = RedisCluster.from_url(plain, **kwargs)
        return cluster  # type: ignore[no-any-return]
    if HiredisRespSerializer is not None:
        kwargs.setdefault("command_packer", CommandPacker())
    return redis.Redis.from_url(url, **_retry_options(kwargs, retry))


def connect_async(url: str, **kwargs: Any) -> aioredis.Redis:
    """The asyncio twin of ``connect``. ``pool_wait_s`` (not for a cluster): the pool holds at
    most ``max_connections`` and a command that finds none free waits up to that long for one
    (redis-py's default pool raises at once)."""
    retry = _AsyncRetry(ExponentialBackoff(cap=2.0, base=0.05), RETRIES)
    plain = cluster_url(url)
    if plain is not None:
        kwargs.setdefault("retry", retry)
        cluster: Any = AsyncRedisCluster.from_url(plain, **kwargs)
        return cluster  # type: ignore[no-any-return]
    wait_s = kwargs.pop("pool_wait_s", None)
    if wait_s is not None:  # at most max_connections; a caller finding none free waits
        pool = aioredis.BlockingConnectionPool.from_url(
            url, timeout=wait_s, **_retry_options(kwargs, retry)
        )
        return aioredis.Redis(connection_pool=pool)
    return aioredis.Redis.from_url(url, **_retry_options(kwargs, retry))


def refresh_cluster_view(r: Any) -> None:
    """After a connection error on a Redis Cluster client: learn the slot map again and pick a
    live default node. (redis-py's cluster pipeline asks its default node which keys an EVAL
    touches; it does not replace that node when it dies, so without this every later script
    call would fail after a failover of that node.) Does nothing for a plain client."""
    if not isinstance(r, RedisCluster):
        return
    try:
        r.nodes_manager.initialize()
        r.replace_default_node()
    except redis.RedisError:
        pass  # the cluster is still electing: the caller's next try refreshes again


async def refresh_cluster_view_async(r: Any) -> None:
    """The asyncio twin of ``refresh_cluster_view``."""
    if not isinstance(r, AsyncRedisCluster):
        return
    try:
        await r.nodes_manager.initialize()
        nodes = [n for n in r.get_primaries() if n != r.get_default_node()]
        if nodes:
            r.set_default_node(nodes[0])
    except redis.RedisError:
        pass


CLUSTER_RETRIES = 20
"""Tries of an idempotent client call across a cluster failover (0.5 s apart: ~10 s, several
times a typical cluster-node-timeout plus election)."""

REDIS_ERRORS: tuple[type[Exception], ...] = (redis.RedisError, *TRANSIENT_ERRORS)
"""Any error from Redis, cluster routing errors included (some are not RedisErrors)."""


def refusal_text(err: BaseException) -> str:
    """What Redis said, without the command's arguments that redis-py puts in a pipeline's
    error (they may hold a secret: a webhook secret being set)."""
    return re.sub(r"Command # \d+ \((.*)\) of pipeline caused error: ", "", str(err), flags=re.S)


def permission_refused(err: BaseException) -> bool:
    """Whether ``err`` is Redis refusing this user a command or a key (ACL), directly or inside
    a script: a grant, not a retry, fixes it."""
    text = str(err)
    return isinstance(err, redis.exceptions.NoPermissionError) or any(
        mark in text for mark in ("NOPERM", "can't run this command", "No permissions to access")
    )
