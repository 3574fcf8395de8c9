"""The batching policy: which waiting requests form the next batch.

Pure: plain data in, plain data out; no Redis, no torch, no clock (``now_ms`` is an argument).

The rule, in order:

1. **Who goes first.** Each request has a priority rank (high 0, normal 1, low 2). Waiting raises
   it: the *effective rank* is ``rank - wait_ms // priority_aging_ms`` (never below 0). The most
   urgent request (lowest effective rank, then oldest) names the priority that goes now: a
   request waits at most ``2 * priority_aging_ms`` before it ranks with ``high``, and from then
   on only requests older than it go ahead: low priority cannot starve. Within that priority,
   the *anchor* (it always runs in this batch) is the one the order's ``Preference`` names
   (``fair_share.Shares``: the tenant with the least service, then the oldest: aging orders
   priorities, never one tenant's flood ahead of another tenant's request of the same
   priority). With no preference it is the most urgent request itself.
2. **Who goes with it.** Other requests join by effective rank, best first; within a rank, the
   ones closest in length to the anchor (``|prompt tokens difference| + |max_new_tokens
   difference|``) first, because padding and wasted decode steps grow with those differences;
   a preference may arrange them again (the fair one: tenant by tenant).
   A request joins only if the batch stays within ``max_batch_size`` requests and
   ``max_batch_tokens`` (each request costs prompt tokens + max_new_tokens). An embedding
   (``max_new_tokens`` 0) shares no decode steps with its batch-mates, each one costs its own
   compute: so a batch anchored by an embedding takes none of a lower effective rank (a high
   query never waits for a low indexing job's inputs computed beside it).
3. **Whether to wait.** If the batch could still take more and its anchor has waited less than
   ``max_wait_ms``, the decision is to wait (at most the rest of that time) for more to arrive.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import islice
from typing import Protocol


@dataclass(slots=True, unsafe_hash=True, kw_only=True)
class Candidate:
    """A waiting request, as the policy sees it. (Not a frozen dataclass, like the rest here:
    one is made per request on the worker's hot path, and a frozen one costs four times as
    much to build. Treat it as read-only.)"""

    key: str
    """An opaque handle the caller uses to find the request again (e.g. the stream entry id)."""
    prompt_tokens: int
    """Exact prompt length in the worker's tokenizer."""
    max_new_tokens: int
    """The request's own generation limit."""
    enqueued_ms: int
    """When it entered the queue, in the same clock as ``now_ms``."""
    priority_rank: int = 1
    """0 = high, 1 = normal, 2 = low."""
    tenant: str = "default"
    """Whom it belongs to: the tenant with the least service anchors its priority's batch."""
    choices: int = 1
    """The request's ``n``: it runs as that many rows."""
    prefix: str | None = None
    """What cached context it likely shares with others (its tenant and prefix key), or None:
    a prefix-aware order groups those that share one."""
    model: str | None = None
    """The model it names (None: the queue's default): an order with the adapter rule groups
    requests by the LoRA adapter they run through."""

    @property
    def cost_tokens(self) -> int:
        """What the request takes from the batch's token budget (each choice a row)."""
        return (self.prompt_tokens + self.max_new_tokens) * self.choices


@dataclass(frozen=True, kw_only=True)
class BatchPolicy:
    """The limits a batch is formed under."""

    max_batch_tokens: int
    max_batch_size: int
    max_wait_ms: int = 0
    priority_aging_ms: int = 10_000

    def __post_init__(self) -> None:
        for name in ("max_batch_tokens", "max_batch_size", "priority_aging_ms"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.max_wait_ms < 0:
            raise ValueError(f"max_wait_ms must be at least 0, got {self.max_wait_ms}")


@functools.lru_cache(maxsize=256)
def batch_limits(
    max_batch_tokens: int, max_batch_size: int, max_wait_ms: int, priority_aging_ms: int
) -> BatchPolicy:
    """The ``BatchPolicy`` of these limits, made once (frozen, so shared): a worker asks for
    one at every plan, mostly the same."""
    return BatchPolicy(
        max_batch_tokens=max_batch_tokens,
        max_batch_size=max_batch_size,
        max_wait_ms=max_wait_ms,
        priority_aging_ms=priority_aging_ms,
    )


@dataclass(frozen=True, kw_only=True)
class Decision:
    """Either a batch to run now, or how long to wait before asking again."""

    batch: list[Candidate] = field(default_factory=list)
    """The requests to run now, anchor first; empty when waiting."""
    wait_ms: int = 0
    """When ``batch`` is empty and there are candidates: wait at most this long for more."""
    reason: str = ""
    """Why this decision, for logs: 'empty', 'full', 'waited', 'waiting'."""

    @property
    def tokens(self) -> int:
        """The batch's total cost in tokens."""
        return sum(c.cost_tokens for c in self.batch)


def effective_rank(c: Candidate, now_ms: int, priority_aging_ms: int) -> int:
    """The candidate's priority rank after aging (0 is the most urgent)."""
    waited_ms = max(0, now_ms - c.enqueued_ms)
    return max(0, c.priority_rank - waited_ms // priority_aging_ms)


class Preference(Protocol):
    """An order's own rule inside ``next_batch``, within what priority and aging allow: who
    anchors the batch among the anchor's priority, and in which order the rest is offered to
    it (budget and size still decide what fits). ``fair_share.Shares`` is one."""

    def anchor(self, level: Sequence[Candidate]) -> Candidate:
        """The anchor among ``level``: the candidates of the most urgent one's priority."""
        ...

    def arrange(
        self,
        anchor: Candidate,
        others: list[Candidate],
        ranks: Mapping[str, int],
        max_batch_size: int,
    ) -> list[Candidate]:
        """``others`` (sorted by effective rank, then length distance to the anchor) in the
        order the batch should take them; ``ranks``: each one's effective rank by key."""
        ...


def next_batch(
    candidates: Sequence[Candidate],
    now_ms: int,
    policy: BatchPolicy,
    prefer: Preference | None = None,
) -> Decision:
    """Decide the next batch among ``candidates`` (see the module docstring for the rule);
    ``prefer``: the order's own rule for the anchor and the fill, if it has one."""
    if not candidates:
        return Decision(reason="empty")
    # effective_rank and the length distance, inlined: this runs over the whole look-ahead
    # each turn.
    aging = policy.priority_aging_ms
    ranks = {
        c.key: max(0, c.priority_rank - max(0, now_ms - c.enqueued_ms) // aging) for c in candidates
    }
    anchor = min(candidates, key=lambda c: (ranks[c.key], c.enqueued_ms, c.key))
    if prefer is not None:
        anchor = prefer.anchor([c for c in candidates if c.priority_rank == anchor.priority_rank])
    prompt, new = anchor.prompt_tokens, anchor.max_new_tokens
    others = sorted(
        (c for c in candidates if c is not anchor),
        key=lambda c: (
            ranks[c.key],
            abs(c.prompt_tokens - prompt) + abs(c.max_new_tokens - new),
            c.enqueued_ms,
            c.key,
        ),
    )
    if new == 0:  # an embedding: no lower rank rides with it (the module's rule 2)
        top = ranks[anchor.key]
        others = [c for c in others if ranks[c.key] <= top]
    if prefer is not None:
        others = prefer.arrange(anchor, others, ranks, policy.max_batch_size)
    batch = [anchor]
    tokens = anchor.cost_tokens
    # The anchor runs even if it alone is over budget: refusing such requests is admission's job,
    # and a policy that never picks its anchor would stall the queue.
    full = tokens >= policy.max_batch_tokens or policy.max_batch_size == 1
    cheapest = None  # of the others from the first that did not fit on
    for i, c in enumerate(others):
        if len(batch) >= policy.max_batch_size:
            full = True
            break
        cost = c.cost_tokens
        if tokens + cost > policy.max_batch_tokens:
            full = True  # something did not fit: the batch is as big as the budget allows
            if cheapest is None:
                cheapest = min(o.cost_tokens for o in islice(others, i, None))
            if tokens + cheapest > policy.max_batch_tokens:
                break  # nor does any after it (long prompts: a batch of two, hundreds waiting)
            continue
        batch.append(c)
        tokens += cost
    if len(batch) >= policy.max_batch_size:
        full = True
    if full:
        return Decision(batch=batch, reason="full")
    anchor_waited_ms = max(0, now_ms - anchor.enqueued_ms)
    if anchor_waited_ms < policy.max_wait_ms:
        return Decision(wait_ms=policy.max_wait_ms - anchor_waited_ms, reason="waiting")
    return Decision(batch=batch, reason="waited")
