"""Prefixes inside a worker, pure (no Redis, no torch, no clock): which prefixes it counts
itself as holding (``Holdings``, what the read's affinity is told), and the prefix rule of its
order (``PrefixAware``: same-prefix requests in one batch, warm prefixes before cold ones).

``Holdings``: an LRU bounded in prompt tokens, like the engine's cache it stands for.

The worker holds a prefix from the moment it starts a request with that key (the engine is
computing it into its cache) and, for a chat, the key of the conversation with the reply it
generated (the next turn's key). When the prefixes it holds add up to more tokens than the
capacity, the least recently used are let go: the read then stops steering their requests
here. It is an estimate of the engine's cache (SGLang's router keeps the same kind of
approximate tree per worker), never a promise: a wrong guess costs a cache miss.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from genq.worker.policy.batching import BatchPolicy, Candidate, Decision, Preference, next_batch


class Holdings:
    """Prefix keys (already scoped to their tenant) with the prompt tokens each stands for."""

    def __init__(self, capacity_tokens: int) -> None:
        self.capacity_tokens = capacity_tokens
        self._held: OrderedDict[str, int] = OrderedDict()
        self._tokens = 0

    def hold(self, key: str, tokens: int) -> tuple[bool, list[str]]:
        """``key`` was just used for a prompt of ``tokens``: (whether it is new here, the keys
        let go to make room, least recently used first). A capacity of 0 holds nothing."""
        if self.capacity_tokens <= 0:
            return False, []
        new = key not in self._held
        self._tokens += tokens - self._held.get(key, 0)
        self._held[key] = tokens
        self._held.move_to_end(key)
        gone: list[str] = []
        while self._tokens > self.capacity_tokens and len(self._held) > 1:
            old, size = self._held.popitem(last=False)
            self._tokens -= size
            gone.append(old)
        return new, gone

    def __contains__(self, key: object) -> bool:
        return key in self._held

    def __len__(self) -> int:
        return len(self._held)

    @property
    def tokens(self) -> int:
        """The prompt tokens the held prefixes stand for."""
        return self._tokens


WARM_PREFIXES = 64
"""How many of the prefixes it started last a worker's order counts as warm in its engine."""


class _Order(Protocol):
    """What ``PrefixAware`` needs of the order it wraps (``ordering.WaitingOrder``)."""

    @property
    def name(self) -> str: ...

    @property
    def read_rule(self) -> str: ...

    @property
    def sees_newcomers(self) -> bool: ...

    def preference(
        self, candidates: Sequence[Candidate], weights: Mapping[str, float]
    ) -> Preference | None: ...

    def started(self, batch: Sequence[Candidate]) -> None: ...


@dataclass(frozen=True)
class PrefixPreference:
    """The prefix rule inside one decision, over what the wrapped order allows: its anchor
    (fair share's, or the most urgent request), and its fill re-offered within each rank:
    the anchor's prefix first, then prefixes warm in the engine, then the rest, each group
    in the order the wrapped rule gave (so fair share still orders tenants within a group)."""

    inner: Preference | None
    warm: frozenset[str]

    def anchor(self, level: Sequence[Candidate]) -> Candidate:
        """The wrapped rule's anchor, else the oldest: the prefix never picks the anchor, so
        no cold prefix waits behind warm ones without bound."""
        if self.inner is not None:
            return self.inner.anchor(level)
        return min(level, key=lambda c: (c.enqueued_ms, c.key))

    def arrange(
        self,
        anchor: Candidate,
        others: list[Candidate],
        ranks: Mapping[str, int],
        max_batch_size: int,
    ) -> list[Candidate]:
        """``others`` grouped by prefix within each rank (stable)."""
        if self.inner is not None:
            others = self.inner.arrange(anchor, others, ranks, max_batch_size)
        mine, warm = anchor.prefix, self.warm

        def group(c: Candidate) -> int:
            if c.prefix is None:
                return 2
            return 0 if c.prefix == mine else 1 if c.prefix in warm else 2

        return sorted(others, key=lambda c: (ranks[c.key], group(c)))


class PrefixAware:
    """An order wrapped with the prefix rule (``--prefix-aware``): same-prefix requests share
    a batch, a prefix the engine holds goes before a cold one; the wrapped order (fair share
    or first come) still decides who anchors, and its read rule is the read's."""

    def __init__(self, inner: _Order) -> None:
        self.inner = inner
        self.name = inner.name
        self.read_rule = inner.read_rule
        self.sees_newcomers = inner.sees_newcomers
        self._warm: OrderedDict[str, None] = OrderedDict()

    def preference(
        self, candidates: Sequence[Candidate], weights: Mapping[str, float]
    ) -> PrefixPreference:
        """The wrapped order's preference, with the prefix rule over it."""
        inner = self.inner.preference(candidates, weights)
        return PrefixPreference(inner, frozenset(self._warm))

    def decide(
        self,
        candidates: Sequence[Candidate],
        now_ms: int,
        policy: BatchPolicy,
        weights: Mapping[str, float],
    ) -> Decision:
        """``next_batch`` with the prefix rule over the wrapped order's."""
        return next_batch(candidates, now_ms, policy, self.preference(candidates, weights))

    def started(self, batch: Sequence[Candidate]) -> None:
        """The wrapped order learns of it; its prefixes are warm now."""
        self.inner.started(batch)
        for c in batch:
            if c.prefix is not None:
                self._warm[c.prefix] = None
                self._warm.move_to_end(c.prefix)
        while len(self._warm) > WARM_PREFIXES:
            self._warm.popitem(last=False)
