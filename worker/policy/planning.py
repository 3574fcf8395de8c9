"""What to start this turn: the batching policy applied to the room the runner has left.

A static runner has nothing running when it plans, so the room is the whole budget and the
decision is ``next_batch``'s, except that it waits to fill a batch only when another arrival is
expected within the window (``arrivals.py``): a lone request on an idle queue starts at once.
A continuous runner has requests running: new ones join while the budget and batch size have
room, and if the most urgent waiting request does not fit yet, nothing starts (it would
otherwise be overtaken again and again by smaller ones).

Pure: plain data in, a ``Decision`` out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from genq.worker.policy.arrivals import ArrivalEstimate
from genq.worker.policy.batching import BatchPolicy, Candidate, Decision, batch_limits
from genq.worker.policy.ordering import FirstCome, WaitingOrder


def plan_start(
    candidates: Sequence[Candidate],
    *,
    now_ms: int,
    policy: BatchPolicy,
    running: int,
    running_tokens: int,
    wait_to_fill: bool,
    arrivals: ArrivalEstimate | None = None,
    order: WaitingOrder | None = None,
    weights: Mapping[str, float] | None = None,
) -> Decision:
    """The batch to start now among ``candidates``, given ``running`` requests costing
    ``running_tokens`` already in the engine. ``wait_to_fill``: wait up to the policy's
    ``max_wait_ms`` for a fuller batch (static engines), but only while ``arrivals`` expects
    another request within the window; otherwise start at once. ``order``: who goes first
    (``ordering.py``; first come when None), with the tenants' ``weights``."""
    order = order or FirstCome()
    weights = weights or {}
    free_tokens = policy.max_batch_tokens - running_tokens
    free_slots = policy.max_batch_size - running
    if not candidates:
        return Decision(reason="empty")
    if free_slots <= 0 or free_tokens <= 0:
        return Decision(reason="no room")
    worth = arrivals is not None and arrivals.worth_waiting
    if wait_to_fill and not (worth and worth(policy.max_wait_ms, now_ms)):
        wait_to_fill = False  # none expected within the whole window: none within less
    aging = policy.priority_aging_ms
    room = batch_limits(free_tokens, free_slots, policy.max_wait_ms if wait_to_fill else 0, aging)
    decision = order.decide(candidates, now_ms, room, weights)
    if (
        not decision.batch
        and decision.reason == "waiting"
        and not (worth and worth(decision.wait_ms, now_ms))
    ):
        # No arrival expected within the window: waiting would only add latency.
        return order.decide(
            candidates, now_ms, batch_limits(free_tokens, free_slots, 0, aging), weights
        )
    if running and decision.tokens > free_tokens:
        return Decision(reason="no room")  # the most urgent request does not fit yet
    return decision
