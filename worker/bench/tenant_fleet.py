"""One tenants case's fleet (``genq bench --scenario tenants``): echo workers on a fresh queue
with one tenant policy, tenants' settings made first; and the counts the cases share (a
request's weighted tokens, the stretch while tenants all have work queued)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import redis
from genq.common import tenants as registry
from genq.common.keys import Keys
from genq.common.models import Result
from genq.producer import Client
from genq.worker.bench.fleet import Fleet


class TenantCase:
    """One fleet on a fresh queue with one tenant policy."""

    def __init__(
        self,
        url: str,
        name: str,
        policy: str,
        workers: int,
        step_ms: float,
        worker: dict[str, object] | None = None,
        **settings: Any,
    ) -> None:
        """``worker``: more worker settings (another engine); ``settings``: tenants' settings
        (``genq tenants set``) made before the fleet starts."""
        self.queue = f"tenants-{name}-{policy}-{int(time.time() * 1000)}"
        self.r = redis.Redis.from_url(url)
        self.client = Client(self.r, self.queue)
        for tenant, changes in settings.items():
            registry.update(self.r, Keys(self.queue), tenant, **changes)
        more = worker or {}
        self.fleet = Fleet(url, self.queue, [step_ms] * workers, 16, tenant_policy=policy, **more)

    def __enter__(self) -> TenantCase:
        self.fleet.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.fleet.__exit__()
        self.client.close()


def weighted(x: Result) -> int:
    return x.usage.prompt_tokens + 2 * x.usage.completion_tokens


def both_waiting(
    results: Sequence[Result],
    when: Callable[[Result], int],
    tenants: tuple[str, ...] = ("heavy", "light"),
) -> tuple[int, int]:
    """From when both tenants had a request queued to the last ``when`` of whichever ended
    first."""
    queued = [min(x.timings.queued_unix_ms or 0 for x in results if x.tenant == t) for t in tenants]
    end = min(max(when(x) for x in results if x.tenant == t) for t in tenants)
    return max(queued), end
