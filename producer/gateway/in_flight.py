"""How many completions and responses a gateway has in flight, in all and per tenant, and
whether one more may start (``InFlight``): a pure unit (no Redis, no HTTP), tested alone.

A request is in flight from the moment the gateway takes it until its answer (or stream) ends.
Past a limit the gateway answers 429 with ``Retry-After`` (the OpenAI SDKs wait and retry), so
that one tenant's thousands of waiting requests can take neither the gateway's memory nor the
other tenants' turn. Every key of a tenant counts together: more keys do not buy more room.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass


@dataclass(frozen=True)
class Refusal:
    """Why one more request may not start: which limit, at what count."""

    limit: int
    per_tenant: bool

    def message(self, tenant: str) -> str:
        if self.per_tenant:
            return (
                f"tenant {tenant!r} has {self.limit} requests in flight on this gateway, its "
                "limit (genq serve --max-in-flight-per-tenant): retry when some have ended"
            )
        return (
            f"this gateway has {self.limit} requests in flight, its limit (genq serve "
            "--max-in-flight): retry later"
        )


class InFlight:
    """Counts of requests in flight, by tenant. ``max_total``/``max_per_tenant``: 0 means no
    limit."""

    def __init__(self, max_total: int, max_per_tenant: int) -> None:
        self.max_total = max_total
        self.max_per_tenant = max_per_tenant
        self.by_tenant: Counter[str] = Counter()
        self.total = 0

    def enter(self, tenant: str) -> Refusal | None:
        """Count one more request of ``tenant`` and return None, or return why not (and
        count nothing)."""
        if self.max_per_tenant and self.by_tenant[tenant] >= self.max_per_tenant:
            return Refusal(self.max_per_tenant, per_tenant=True)
        if self.max_total and self.total >= self.max_total:
            return Refusal(self.max_total, per_tenant=False)
        self.by_tenant[tenant] += 1
        self.total += 1
        return None

    def leave(self, tenant: str) -> None:
        """One request of ``tenant`` ended (it had entered)."""
        self.total -= 1
        self.by_tenant[tenant] -= 1
        if self.by_tenant[tenant] <= 0:
            del self.by_tenant[tenant]
