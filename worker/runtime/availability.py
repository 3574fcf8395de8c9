"""Whether Redis can be used now: the worker loop's retry while Redis is unreachable (a
dropped connection, a restarting redis-server, a cluster failover), a lost consumer group made
again, and a full Redis (maxmemory with noeviction) noted until it accepts writes. Each Redis
command is retried with backoff already (``common/connection.py``); this is the loop's retry on
top of that, forever.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable

import redis
from genq.common.connection import REDIS_ERRORS, TRANSIENT_ERRORS, refresh_cluster_view

log = logging.getLogger("genq.worker")


class Availability:
    """One worker's view of whether its Redis is there, and whether it is full."""

    def __init__(self, r: redis.Redis, *, on_lost_group: Callable[[], None]) -> None:
        """``on_lost_group``: make the consumer groups again (a redis-server that restarted
        without its data)."""
        self.redis = r
        self.on_lost_group = on_lost_group
        self.full_since: float | None = None
        """When Redis last refused a write for want of memory (None: it accepts writes)."""

    def retrying(
        self, step: Callable[[], None], stopping: threading.Event, once: bool = False
    ) -> None:
        """Run ``step``; while Redis is unreachable, wait with backoff and try again until
        ``stopping`` is set (``once``: return after one failed try, for the main loop to go
        round). A lost consumer group (a redis-server that restarted without its data) is
        recreated. A full Redis (maxmemory reached, noeviction) counts as passing too: see
        ``redis_full``."""
        delay_s = 0.1
        while True:
            try:
                step()
                return
            except TRANSIENT_ERRORS as err:
                if isinstance(err, redis.AuthenticationError):
                    raise  # a wrong password does not get better by waiting
                log.warning("Redis unreachable (%s); retrying in %.1f s", err, delay_s)
                refresh_cluster_view(self.redis)
            except redis.exceptions.OutOfMemoryError as err:
                self.redis_full(err)
            except redis.ResponseError as err:
                if "NOGROUP" not in str(err):
                    raise
                log.warning("consumer group missing (Redis lost its data?); recreating it")
                with contextlib.suppress(*REDIS_ERRORS):
                    self.on_lost_group()
            if stopping.wait(delay_s) or once:
                return
            delay_s = min(5.0, delay_s * 2)

    def redis_full(self, err: Exception) -> None:
        """Redis refused a write for want of memory: from now until ``memory_back``, the
        worker reads no new work and only retries, with backoff, what it holds (its results
        wait in the writer). Said once per episode, not once per retry."""
        if self.full_since is None:
            self.full_since = time.monotonic()
            log.warning(
                "Redis is full (%s): holding results, reading no new work, retrying with "
                "backoff until it accepts writes again (free memory or raise maxmemory)",
                err,
            )

    def memory_back(self) -> None:
        """A write went through again after ``redis_full``."""
        if self.full_since is not None:
            log.warning(
                "Redis accepts writes again after %.1f s full; carrying on",
                time.monotonic() - self.full_since,
            )
            self.full_since = None
