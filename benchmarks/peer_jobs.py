"""The no-op job every queue in ``queue_speed.py`` runs, and the peers' worker settings."""

from __future__ import annotations

import os
from typing import Any, ClassVar


def noop(text: str) -> str:
    """RQ's job: return the input (like genq's echo engine)."""
    return text


async def arq_noop(ctx: dict[str, Any], text: str) -> str:
    """arq's job: return the input."""
    return text


class ArqSettings:
    """``arq benchmarks.peer_jobs.ArqSettings``: a 10 ms poll (arq's default is 500 ms)."""

    from arq.connections import RedisSettings

    functions: ClassVar[list[Any]] = [arq_noop]
    redis_settings = RedisSettings(port=int(os.environ.get("BENCH_REDIS_PORT", "6379")))
    poll_delay = 0.01
    max_jobs = 100
    keep_result = 3600
