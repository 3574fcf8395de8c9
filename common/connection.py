"""Opening Redis connections that ride out a dropped connection or a restarting redis-server."""

from __future__ import annotations

from typing import Any

import redis
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

RETRIES = 8
"""Retries of one command on a connection error, with exponential backoff (0.05 s .. 2 s):
about 8 s in all, enough for a redis-server restart. Callers loop on top of that."""


def _retry_options(kwargs: dict[str, Any], retry: Any) -> dict[str, Any]:
    kwargs.setdefault("retry", retry)
    kwargs.setdefault("retry_on_error", [redis.ConnectionError, redis.TimeoutError])
    return kwargs


def connect(url: str, **kwargs: Any) -> redis.Redis:
    """A client for ``url`` (``redis://``, ``rediss://`` for TLS, ``unix://``; user and
    password in the URL for AUTH/ACL) that retries commands on connection errors."""
    retry = Retry(ExponentialBackoff(cap=2.0, base=0.05), RETRIES)
    return redis.Redis.from_url(url, **_retry_options(kwargs, retry))


def connect_async(url: str, **kwargs: Any) -> aioredis.Redis:
    """The asyncio twin of ``connect``."""
    retry = AsyncRetry(ExponentialBackoff(cap=2.0, base=0.05), RETRIES)
    return aioredis.Redis.from_url(url, **_retry_options(kwargs, retry))
