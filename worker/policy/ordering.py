"""The seam for *who goes first*: a named, stateful order over what waits in one worker.

Each turn the worker asks its order for a ``Decision`` over the waiting candidates
(``decide``) and tells it which batch started (``started``). The order may keep state across
turns (a tenant's service so far); the batch's limits, aging between priorities and the fill
wait stay ``batching.next_batch``'s, so every order keeps them. This is the unit a new rule
plugs into, as vLLM v1's ``RequestQueue`` / ``create_request_queue(policy)``: write a class with
these two methods, add it to ``ORDERS``, and it is a value of ``--tenant-policy``
(``GENQ_TENANT_POLICY``).

What an order may touch: the candidates (``batching.Candidate``: add a field there, filled in
``lookahead.Held``, if it needs more of a request), the tenants' weights, and its own state.
Not Redis, torch, a clock or the look-ahead itself: ``now_ms`` is an argument, and the fleet's
share (Redis' counters, ``common/lua/read.py``) is decided by the read script before anything
reaches an order. Pure, so tested on plain data (``tests/test_policy_units.py``).

- ``FirstCome`` (``fifo``): the most urgent request anchors the batch (``next_batch`` alone).
- ``FairShare`` (``fair``, the default): within the anchor's priority, the tenant with the
  least weighted tokens started here per unit of weight anchors it, and the rest of the batch is
  taken tenant by tenant the same way (``fair_share.TenantShares``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import ClassVar, Protocol

from genq.worker.policy.affinity import Affinity
from genq.worker.policy.batching import BatchPolicy, Candidate, Decision, Preference, next_batch
from genq.worker.policy.fair_share import FairShare


class WaitingOrder(Protocol):
    """A rule for which waiting requests go first, with the state it keeps across turns."""

    @property
    def name(self) -> str:
        """Its value of ``--tenant-policy``."""
        ...

    @property
    def read_rule(self) -> str:
        """How the read picks among a priority's tenants in Redis (``READ_RULES`` of
        ``common.fair_share``): the order owns it, so a new order (one wrapping ``FairShare``,
        say) reads as it declares, not as its name happens to match."""
        ...

    @property
    def sees_newcomers(self) -> bool:
        """Whether a worker whose look-ahead is full still reads tenants it holds none of (a
        probe, ``Lookahead.probe``): an order that ranks by tenant wants them before its next
        batch; first come does not (they are newer than everything held)."""
        ...

    def decide(
        self,
        candidates: Sequence[Candidate],
        now_ms: int,
        policy: BatchPolicy,
        weights: Mapping[str, float],
    ) -> Decision:
        """The next batch among ``candidates`` within ``policy`` (or how long to wait).
        Called possibly twice a turn with the same candidates: both calls must decide the same
        (it may refresh what it knows, the weights, which tenants wait; it charges nothing:
        that is ``started``)."""
        ...

    def started(self, batch: Sequence[Candidate]) -> None:
        """``batch`` was taken to run (what ``decide`` chose, or a suspect alone)."""
        ...

    def preference(
        self, candidates: Sequence[Candidate], weights: Mapping[str, float]
    ) -> Preference | None:
        """This order's own rule as ``next_batch``'s ``Preference`` (what ``decide`` uses), so
        that an order can wrap another: fair share decides whose turn, a prefix rule decides
        among what it allows."""
        ...


class FirstCome:
    """The most urgent request (priority with aging, then the oldest) anchors each batch."""

    name: ClassVar[str] = "fifo"
    read_rule: ClassVar[str] = "fifo"
    sees_newcomers: ClassVar[bool] = False

    def decide(
        self,
        candidates: Sequence[Candidate],
        now_ms: int,
        policy: BatchPolicy,
        weights: Mapping[str, float],
    ) -> Decision:
        """``next_batch`` alone: no preference."""
        return next_batch(candidates, now_ms, policy)

    def preference(
        self, candidates: Sequence[Candidate], weights: Mapping[str, float]
    ) -> Preference | None:
        """None: the most urgent request anchors, the rest by rank and length."""
        return None

    def started(self, batch: Sequence[Candidate]) -> None:
        """Nothing to remember."""
        return None


ORDERS: dict[str, type[FirstCome] | type[FairShare]] = {
    FirstCome.name: FirstCome,
    FairShare.name: FairShare,
}
"""Every order by its name (the values of ``--tenant-policy``)."""


def make_order(
    name: str, *, prefix_aware: bool = False, adapters: Sequence[str] = (), max_loras: int = 1
) -> WaitingOrder:
    """A fresh order named ``name`` (one per worker: its state is that worker's); wrapped in
    ``Affinity`` with the prefix rule (``prefix_aware``: ``--prefix-aware``) and the adapter
    rule (``adapters``: ``--lora``'s names, ``max_loras`` resident at once)."""
    try:
        order: WaitingOrder = ORDERS[name]()
    except KeyError:
        raise ValueError(f"unknown order {name!r}; one of {', '.join(sorted(ORDERS))}") from None
    if not prefix_aware and not adapters:
        return order
    return Affinity(order, prefixes=prefix_aware, adapters=adapters, max_loras=max_loras)
