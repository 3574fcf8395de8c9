"""The affinity rule of a worker's order, pure (no Redis, no torch, no clock): what its engine
holds goes first, without ever choosing who anchors. Two kinds of holding share it:

- **prefixes** (``--prefix-aware``): same-prefix requests share a batch, a prefix the engine
  computed lately (warm) goes before a cold one;
- **LoRA adapters** (``--lora``): requests for the anchor's adapter, then for the base model
  and adapters resident in the engine (the last ``--max-loras`` a batch used, as the engine's
  LRU keeps them), then for adapters that would have to be loaded (evicting another).

``Affinity`` wraps an order (fair share or first come): the wrapped order's preference still
picks the anchor (the least-served tenant, or the most urgent request), so no cold prefix and
no cold adapter waits behind warm ones without bound: it anchors a batch once it is the one
the wrapped order would take first, and its adapter is loaded then. The fill is re-offered
within each rank by adapter, then by prefix; budget and size still decide what fits.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from genq.worker.policy.batching import BatchPolicy, Candidate, Decision, Preference, next_batch

WARM_PREFIXES = 64
"""How many of the prefixes it started last a worker's order counts as warm in its engine."""


class _Order(Protocol):
    """What ``Affinity`` needs of the order it wraps (``ordering.WaitingOrder``)."""

    @property
    def name(self) -> str: ...

    @property
    def read_rule(self) -> str: ...

    @property
    def sees_newcomers(self) -> bool: ...

    def decide(
        self,
        candidates: Sequence[Candidate],
        now_ms: int,
        policy: BatchPolicy,
        weights: Mapping[str, float],
    ) -> Decision: ...

    def preference(
        self, candidates: Sequence[Candidate], weights: Mapping[str, float]
    ) -> Preference | None: ...

    def started(self, batch: Sequence[Candidate]) -> None: ...


@dataclass(frozen=True)
class AffinityPreference:
    """The affinity rule inside one decision, over what the wrapped order allows: its anchor,
    and its fill re-offered within each rank, first by adapter (the anchor's, resident ones
    and the base model, cold ones), then by prefix (the anchor's, warm ones, the rest; only
    when ``prefixes``), each group in the order the wrapped rule gave (so fair share still
    orders tenants within a group)."""

    inner: Preference | None
    warm: frozenset[str] = frozenset()
    """Prefixes the engine computed lately."""
    adapters: frozenset[str] = frozenset()
    """The worker's adapter names: a candidate whose model is one runs through it."""
    resident: frozenset[str] = frozenset()
    """Adapters the engine holds now (as the worker counts them)."""
    prefixes: bool = True
    """Whether the prefix rule is on (``--prefix-aware``)."""

    def anchor(self, level: Sequence[Candidate]) -> Candidate:
        """The wrapped rule's anchor, else the oldest: affinity never picks the anchor."""
        if self.inner is not None:
            return self.inner.anchor(level)
        return min(level, key=lambda c: (c.enqueued_ms, c.key))

    def adapter_of(self, c: Candidate) -> str | None:
        """The adapter ``c`` runs through, or None (the base model)."""
        return c.model if c.model in self.adapters else None

    def arrange(
        self,
        anchor: Candidate,
        others: list[Candidate],
        ranks: Mapping[str, int],
        max_batch_size: int,
    ) -> list[Candidate]:
        """``others`` grouped by adapter, then prefix, within each rank (stable)."""
        if self.inner is not None:
            others = self.inner.arrange(anchor, others, ranks, max_batch_size)
        adapter, resident, adapters = self.adapter_of(anchor), self.resident, self.adapters
        # The prefix rule: 0 the anchor's prefix, 1 a warm one, 2 the rest (or the rule off).
        # "" is no candidate's prefix: with none (or the rule off) nothing matches the anchor's.
        same = (anchor.prefix or "") if self.prefixes else ""
        warm = self.warm if self.prefixes else frozenset()

        def order(c: Candidate) -> tuple[int, int, int]:  # one call a candidate, every turn
            a = self.adapter_of(c) if adapters else None
            by_adapter = 0 if a == adapter else 1 if a is None or a in resident else 2
            return ranks[c.key], by_adapter, 0 if c.prefix == same else 2 - (c.prefix in warm)

        return sorted(others, key=order)


class ResidentAdapters:
    """The LoRA adapters an engine holds, as its LRU keeps them: the last ``capacity`` used.
    The order counts them (``Affinity``) and the runtime tells the fleet (``PrefixAffinity``)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = max(1, capacity)
        self._names: OrderedDict[str, None] = OrderedDict()

    def use(self, adapter: str) -> list[str]:
        """``adapter`` is used now; the adapters that are no longer held, if any."""
        self._names[adapter] = None
        self._names.move_to_end(adapter)
        gone = []
        while len(self._names) > self.capacity:
            gone.append(self._names.popitem(last=False)[0])
        return gone

    @property
    def names(self) -> list[str]:
        """The adapters held, least recently used first."""
        return list(self._names)

    @property
    def free(self) -> int:
        """How many more could be held without letting one go."""
        return self.capacity - len(self._names)


class Affinity:
    """An order wrapped with the affinity rule: the prefix rule (``prefixes``,
    ``--prefix-aware``) and the adapter rule (``adapters``, the worker's ``--lora`` names, of
    which ``max_loras`` are resident at once). The wrapped order (fair share or first come)
    still decides who anchors, and its read rule is the read's."""

    def __init__(
        self,
        inner: _Order,
        *,
        prefixes: bool = True,
        adapters: Sequence[str] = (),
        max_loras: int = 1,
    ) -> None:
        self.inner = inner
        self.name = inner.name
        self.read_rule = inner.read_rule
        self.sees_newcomers = inner.sees_newcomers
        self.prefixes = prefixes
        self.adapters = frozenset(adapters)
        self.max_loras = max_loras or len(self.adapters)  # 0: every adapter resident
        self._resident = ResidentAdapters(self.max_loras)
        self._warm: OrderedDict[str, None] = OrderedDict()

    def preference(
        self, candidates: Sequence[Candidate], weights: Mapping[str, float]
    ) -> AffinityPreference:
        """The wrapped order's preference, with the affinity rule over it."""
        inner = self.inner.preference(candidates, weights)
        return AffinityPreference(
            inner,
            warm=frozenset(self._warm),
            adapters=self.adapters,
            resident=frozenset(self._resident.names),
            prefixes=self.prefixes,
        )

    def decide(
        self,
        candidates: Sequence[Candidate],
        now_ms: int,
        policy: BatchPolicy,
        weights: Mapping[str, float],
    ) -> Decision:
        """``next_batch`` with the affinity rule over the wrapped order's; the wrapped order's
        alone when no candidate has a prefix or an adapter to group by (the rule would then
        keep its order: the common case, at no cost)."""
        adapters, prefixes = self.adapters, self.prefixes
        if not any(
            (prefixes and c.prefix is not None) or (c.model is not None and c.model in adapters)
            for c in candidates
        ):
            return self.inner.decide(candidates, now_ms, policy, weights)
        return next_batch(candidates, now_ms, policy, self.preference(candidates, weights))

    def started(self, batch: Sequence[Candidate]) -> None:
        """The wrapped order learns of it; its prefixes are warm now, its adapters resident
        (the least recently used ones past ``max_loras`` go, as in the engine)."""
        self.inner.started(batch)
        for c in batch:
            if self.prefixes and c.prefix is not None:
                self._warm[c.prefix] = None
                self._warm.move_to_end(c.prefix)
            if c.model is not None and c.model in self.adapters:
                self._resident.use(c.model)
        while len(self._warm) > WARM_PREFIXES:
            self._warm.popitem(last=False)

    @property
    def resident(self) -> list[str]:
        """The adapters counted as resident, least recently used first."""
        return self._resident.names
