"""Fair shares between tenants, the whole pure rule in one place: what a request is charged
when a worker reads it, what is refunded when it ends, and the ``fair`` order (``FairShare``):
who anchors a batch and how the rest of it is filled. Pure: no Redis, no torch, no clock.

Where the rest of the concept lives: ``genq.common.fair_share`` (the Lua: the per-tenant
indexes, the read that picks a tenant, the hand-back; and ``weighted_tokens``, the one cost
formula) and ``genq.worker.runtime.fair_share`` (a worker's calls: weights, corrections,
starts, refunds). Tenants' settings are ``genq.common.tenants``.

A worker's read (``scripts.PULL``) serves, within each priority, the active tenant with the
least weighted tokens served per unit of weight (VTC: prompt tokens count 1, generated 2), and
charges each request it reads *at once*, before anything is known of its real cost: an upper
bound of its prompt (its body's bytes) and its whole ``max_new_tokens``; the worker corrects
the prompt's part as soon as it has tokenized it (``Held.recharge``). Charging at the read is
what keeps a fleet fair between reads (the next worker to read already sees the charge) and
makes a tenant's tokens-per-minute an upper bound. The charge is *reserved* until a worker
starts the request (``started_charges``: then it counts as served); a hand-back returns it.
A tenant back from idle is lifted to the lowest *served* count, so what other tenants merely
hold in look-aheads (and may hand back) is not counted against it. When the request ends, the
worker refunds the difference to its real cost (``Refund``): generated tokens are therefore
counted at the end, and a request that never ran costs nothing in the end.

``charge`` is the same computation as the ``charge`` of the Lua script (a test compares them).
"""

from __future__ import annotations

import re
from collections import Counter, deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from genq.common.fair_share import weighted_tokens
from genq.common.models import DEFAULT_MAX_NEW_TOKENS, MAX_CHOICES_PER_REQUEST
from genq.worker.policy.batching import BatchPolicy, Candidate, Decision, next_batch

_MAX_NEW = re.compile(rb'"max_new_tokens":\s*(\d+)')
_N = re.compile(rb'"n":\s*(\d+)')


def charge(body: bytes) -> tuple[int, int]:
    """(prompt estimate, max_new_tokens) charged for an entry whose body is ``body``: the
    whole body's bytes (an upper bound: a prompt has no more tokens than bytes, so a charge is
    never below the real cost and a tenant's tokens per minute hold); and the first
    ``"max_new_tokens": N`` in it (the default when there is none). The worker corrects the
    estimate as soon as it has tokenized the prompt. A body with ``"n": N`` (N choices) is
    charged N x max_new_tokens (N read as at most 16: still an upper bound). PULL's ``charge``
    is the twin in Lua: both must say the same, or the refund leaves the tenant's reserved off
    (``test_a_read_charges_what_the_python_estimate_says``)."""
    found = _MAX_NEW.search(body)
    new = int(found.group(1)) if found else DEFAULT_MAX_NEW_TOKENS
    choices = _N.search(body) if b'"n":' in body else None
    return len(body), new * (min(int(choices.group(1)), MAX_CHOICES_PER_REQUEST) if choices else 1)


@dataclass(slots=True, kw_only=True)
class Refund:
    """What ends one request's charge: its tenant, the estimate it was charged at the read,
    and what it really cost (0 and 0 for one that never ran). (Read-only by convention: two
    are made per request on the worker's hot path, and a frozen one costs several times as
    much to build.)"""

    tenant: str
    charged: tuple[int, int]
    prompt_tokens: int = 0
    completion_tokens: int = 0
    ended: bool = True
    """False for a correction at the read (the prompt's real size for the estimate): nothing
    is counted as served yet."""
    started: bool = True
    """Whether a worker began starting it: its charge was moved from the tenant's reserved to
    its service then (``started_charges``), so it is returned there; else to reserved."""

    @property
    def weighted(self) -> int:
        """Back to the tenant's weighted service (VTC): charged minus used, output x2."""
        est, max_new = self.charged
        return weighted_tokens(est, max_new) - weighted_tokens(
            self.prompt_tokens, self.completion_tokens
        )

    @property
    def tokens(self) -> int:
        """Back to the tenant's last minute: charged minus used, in plain tokens."""
        est, max_new = self.charged
        return est + max_new - (self.prompt_tokens + self.completion_tokens)

    @property
    def used(self) -> int:
        """Tokens it really took (prompt + generated); 0 until it ended."""
        return self.prompt_tokens + self.completion_tokens if self.ended else 0


@dataclass(slots=True)
class Totals:
    """One tenant's refunds, merged: one set of commands per tenant, not per request."""

    served: int = 0
    """Weighted tokens back to its service (``vtc``)."""
    reserved: int = 0
    """Weighted tokens back to its reserved (requests never started)."""
    tokens: int = 0
    """Plain tokens back to its last minute and its bucket."""
    used: int = 0
    """Tokens its ended requests took (its total served)."""
    requests: int = 0
    """Its requests that ended having used tokens."""


def merged(refunds: list[Refund]) -> dict[str, Totals]:
    """Per tenant: ``Totals`` of these refunds. (The cost is linear, so each tenant's tokens
    back are summed first and weighed once.)"""
    sums: dict[str, list[int]] = {}
    for r in refunds:
        s = sums.get(r.tenant)
        if s is None:
            s = sums[r.tenant] = [0, 0, 0, 0, 0, 0]
        est, max_new = r.charged
        back = 0 if r.started else 2  # to its service, or to its reserved
        s[back] += est - r.prompt_tokens
        s[back + 1] += max_new - r.completion_tokens
        if r.ended:
            used = r.prompt_tokens + r.completion_tokens
            s[4] += used
            s[5] += used > 0
    return {
        tenant: Totals(
            served=weighted_tokens(s[0], s[1]),
            reserved=weighted_tokens(s[2], s[3]),
            tokens=s[0] + s[1] + s[2] + s[3],
            used=s[4],
            requests=s[5],
        )
        for tenant, s in sums.items()
    }


def started_charges(started: Iterable[tuple[str, tuple[int, int]]]) -> dict[str, int]:
    """Per tenant, the weighted charges of requests a worker starts now (tenant, charge): moved
    from its reserved to its service (``vtc``) in the start's round trip."""
    out: dict[str, int] = {}
    for tenant, (est, max_new) in started:
        out[tenant] = out.get(tenant, 0) + weighted_tokens(est, max_new)
    return out


@dataclass(frozen=True, kw_only=True)
class Shares:
    """The fair rule inside one decision: each waiting tenant's service so far per unit of
    weight, and the weights (for what a batch adds). It is the ``Preference`` ``FairShare``
    hands to ``next_batch``: the tenant with the least service anchors, and the batch is
    filled tenant by tenant counting what it already gives each."""

    service: Mapping[str, float]
    weights: Mapping[str, float] = field(default_factory=dict)

    def cost(self, tenant: str, prompt_tokens: int, max_new_tokens: int) -> float:
        """What a request adds to its tenant's service: weighted tokens per unit of weight."""
        return weighted_tokens(prompt_tokens, max_new_tokens) / self.weights.get(tenant, 1.0)

    def anchor(self, level: Sequence[Candidate]) -> Candidate:
        """Among the anchor priority's candidates: the tenant with the least service (a tie to
        the one with fewer waiting), then the oldest."""
        waiting = Counter(c.tenant for c in level)
        service = self.service
        return min(
            level,
            key=lambda c: (service.get(c.tenant, 0.0), waiting[c.tenant], c.enqueued_ms, c.key),
        )

    def arrange(
        self,
        anchor: Candidate,
        others: list[Candidate],
        ranks: Mapping[str, int],
        max_batch_size: int,
    ) -> list[Candidate]:
        """``others`` (sorted by rank, then length distance) in the order a fair batch takes
        them: by rank, then the tenant with the least service counting what this batch already
        gives it (VTC within the batch), then as sorted. Only the first ``2 x max_batch_size``
        are chosen this way (a batch takes no more, bar ones over the budget); the rest follow
        as sorted."""
        acc = dict(self.service)
        acc[anchor.tenant] = acc.get(anchor.tenant, 0.0) + self.cost(
            anchor.tenant, anchor.prompt_tokens, anchor.max_new_tokens
        )
        # Per rank, each tenant's requests in the order given: a pick compares the tenants'
        # heads (a few), not the whole pool (up to a look-ahead's worth each time).
        lines: dict[int, dict[str, deque[tuple[int, Candidate]]]] = {}
        for j, c in enumerate(others):
            lines.setdefault(ranks[c.key], {}).setdefault(c.tenant, deque()).append((j, c))
        out, taken = list[Candidate](), set[int]()
        for rank in sorted(lines):
            heads = lines[rank]
            while heads and len(out) < 2 * max_batch_size:
                tenant = min(heads, key=lambda t: (acc.get(t, 0.0), heads[t][0][0]))
                j, c = heads[tenant].popleft()
                if not heads[tenant]:
                    del heads[tenant]
                out.append(c)
                taken.add(j)
                acc[tenant] = acc.get(tenant, 0.0) + self.cost(
                    tenant, c.prompt_tokens, c.max_new_tokens
                )
        return out + [c for j, c in enumerate(others) if j not in taken]


class TenantShares:
    """One worker's own account of the service its tenants got (``weighted_tokens`` of each
    request it started: its prompt and max_new_tokens), for choosing which waiting request
    anchors the next batch: the tenant with the least (``Shares.anchor``). The fleet's account
    is in Redis (the read script's); this one orders what this worker already holds, so that a
    request read just now does not wait behind a look-ahead full of another tenant's.

    A tenant that is not waiting here is forgotten; one that comes (back) is lifted to the
    least of those waiting, as in VTC: no credit for time away."""

    def __init__(self) -> None:
        self.served: dict[str, float] = {}
        """Each tenant's service, as ``view`` left it (read-only outside)."""

    def view(self, waiting: Iterable[str]) -> dict[str, float]:
        """Each waiting tenant's service (lifting newcomers; forgetting the absent)."""
        present = set(waiting)
        for gone in [t for t in self.served if t not in present]:
            del self.served[gone]
        floor = min(self.served.values(), default=0.0)
        for t in present:
            self.served.setdefault(t, floor)
        return self.served

    def charge(self, tenant: str, weighted_tokens: float) -> None:
        """``tenant`` got a request started costing this much."""
        self.served[tenant] = self.served.get(tenant, 0.0) + weighted_tokens


class FairShare:
    """The ``fair`` order (the default): within a priority, the tenant with the least service
    here goes first (VTC over what this worker started, per unit of weight), and the batch is
    filled tenant by tenant the same way. Its read is the fair one too (``read_rule``)."""

    name: ClassVar[str] = "fair"
    read_rule: ClassVar[str] = "fair"
    sees_newcomers: ClassVar[bool] = True

    def __init__(self) -> None:
        self._shares = TenantShares()
        self._weights: Mapping[str, float] = {}
        self._lone = False
        """The last preference saw one tenant, the only one the shares know: its service is
        not counted (a newcomer is lifted to it, whatever it is)."""

    def decide(
        self,
        candidates: Sequence[Candidate],
        now_ms: int,
        policy: BatchPolicy,
        weights: Mapping[str, float],
    ) -> Decision:
        """``next_batch`` with this worker's shares as its preference (none with one tenant).
        Keeps the weights for ``started``; the shares change only there."""
        return next_batch(candidates, now_ms, policy, self.preference(candidates, weights))

    def preference(
        self, candidates: Sequence[Candidate], weights: Mapping[str, float]
    ) -> Shares | None:
        """This worker's shares as ``next_batch``'s preference (None with one tenant): what an
        order that wraps this one (``affinity.Affinity``) builds on. One tenant waiting, the
        only one the shares know (the common case): nothing to weigh, and its service is not
        counted until another comes (VTC lifts a newcomer to it: only differences count)."""
        self._weights = weights
        served, first = self._shares.served, candidates[0].tenant if candidates else ""
        self._lone = (
            len(served) == 1 and first in served and all(c.tenant == first for c in candidates)
        )
        if self._lone:
            return None
        view = self._shares.view(c.tenant for c in candidates)
        return Shares(service=view, weights=weights) if len(view) > 1 else None

    def started(self, batch: Sequence[Candidate]) -> None:
        """Charge each started request to its tenant, per unit of its weight (none while one
        tenant is alone: ``preference``)."""
        if self._lone:
            return
        for c in batch:
            cost = weighted_tokens(c.prompt_tokens, c.max_new_tokens)
            self._shares.charge(c.tenant, cost / self._weights.get(c.tenant, 1.0))
