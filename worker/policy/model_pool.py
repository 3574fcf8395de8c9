"""The model pool: which of the models a worker may serve it keeps loaded, and when it swaps.
Pure: no Redis, no engine.

A worker started with several ``--model`` holds at most ``capacity`` of them at once
(``--resident-models``) and reads only the lanes of those it holds. At each look, ``decide``
weighs what waits in every lane of its pool (as the queue counts it: weighted tokens, the oldest
wait, the highest priority) against what it holds, and says what to load and what to evict:

- **never thrash**: a model is loaded only when what waits for it outweighs the swap, the work
  this worker would have served during the load (``load_ms`` at its measured drain rate, at most
  what waits for the models it holds) plus what still waits for the model it evicts; a model
  stays at least ``min_resident_ms``, and is swapped out only once idle for as long as its own
  load takes (so a model whose requests come in waves is not evicted between two waves);
- **never starve**: a model no live worker holds whose oldest request has waited
  ``model_wait_ms`` is loaded whatever else waits (the minimum residence does not hold it back;
  one that others hold is served by them, and loaded here only when its backlog needs more);
- **priority across models**: a request for a cold model that outranks the work (waiting or
  running) of the resident ones is loaded for in the place of one whose work it outranks (past
  its minimum residence), its running requests drained first;
- **never evict work**: a model with requests running here is evicted only when a starving or
  outranking model needs its place, and then only once they finished (``Swap.drain``: the worker
  starts no more of it meanwhile and hands back what it holds);
- **one load per need, fleet-wide**: a model other workers hold (or load) is not loaded here
  unless its backlog needs more workers than hold it (what one drains in ``model_wait_ms``);
  the claim is refused once that many hold it, so two workers that decide at once (a model
  that starves for both) never both load what one can serve;
- **idle models go**: one nothing waits for and nothing ran on for ``model_idle_ms`` is evicted.

``fits`` says how many models a worker keeps loaded when ``--resident-models`` is not given: N
such that its N largest together fit in a share of the free memory.

``policy`` picks among the three rules users know: ``backlog`` (the above), ``arrival`` (load
whatever the oldest request needs, as Ollama and the llama.cpp router do) and ``collate`` (serve
every queued request of the resident models before loading another, as llama-swap does). The
last two keep the rules that protect work (never evict running requests, one load per need),
not the ones that weigh it (no minimum residence either: the peers have none).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from genq.common.model_settings import SwapPolicy

SWAP_POLICIES: tuple[SwapPolicy, ...] = ("backlog", "collate", "arrival")
Force = Literal["rank", "starving"] | None
"""Why a load may take a place the usual rules keep (``_place``)."""


@dataclass(frozen=True)
class Backlog:
    """What waits for one model in the queue: requests, their weighted tokens (as the fair share
    counts them), when the oldest was enqueued (None: nothing waits), the highest priority rank
    waiting (0: none), and how many other live workers hold it or load it now."""

    waiting: int = 0
    tokens: int = 0
    oldest_ms: int | None = None
    top_rank: int = 0
    holders: int = 0


@dataclass(frozen=True)
class Resident:
    """A model this worker holds: when it became resident, when it last ran a batch (or was
    loaded), how many of its requests run here (or are held in the look-ahead), and the
    highest priority rank among them (0: none)."""

    model: str
    loaded_ms: int
    used_ms: int
    running: int = 0
    running_rank: int = 0


@dataclass(frozen=True)
class PoolRules:
    """The pool's settings: how many models may be resident at once, the least time a model
    stays, the longest a model's oldest request waits before it is loaded whatever else waits,
    how long an idle model stays, the swap policy, and this worker's drain rate (weighted tokens
    a second it serves, measured: what a load's time costs)."""

    capacity: int
    min_resident_ms: int = 10_000
    model_wait_ms: int = 30_000
    model_idle_ms: int = 300_000
    policy: SwapPolicy = "backlog"
    drain_tokens_per_s: float = 1_000.0
    look_ms: int = 0
    """How often ``decide`` is asked: a model that would pass ``model_wait_ms`` before the next
    look starves now."""


@dataclass(frozen=True)
class Swap:
    """What to do: load ``load`` (None: nothing), evicting ``evict`` first (None: a free place,
    or an idle model evicted alone); ``drain``: ``evict`` still has requests running here, so the
    worker starts no more of it, hands back what it holds of it, and swaps once they end.
    ``need``: how many workers the loaded model's backlog needs in all: the fleet-wide claim
    refuses the load when that many others hold it already."""

    load: str | None
    evict: str | None
    reason: str
    drain: bool = False
    need: int = 0


def decide(
    backlogs: Mapping[str, Backlog],
    resident: Sequence[Resident],
    load_ms: Mapping[str, int],
    now_ms: int,
    rules: PoolRules,
) -> Swap | None:
    """What to load and evict now (None: nothing). ``backlogs``: every model of the pool (one
    missing counts as nothing waiting); ``resident``: what this worker holds; ``load_ms``: each
    model's measured (or expected) load time."""
    held = {r.model: r for r in resident}
    swap = _choose_load(backlogs, held, load_ms, now_ms, rules)
    if swap is not None:
        return swap
    for r in sorted(resident, key=lambda r: r.used_ms):
        waiting = backlogs.get(r.model, Backlog()).waiting
        if not waiting and not r.running and now_ms - r.used_ms >= rules.model_idle_ms:
            return Swap(load=None, evict=r.model, reason=f"idle {(now_ms - r.used_ms) // 1000} s")
    return None


def _choose_load(
    backlogs: Mapping[str, Backlog],
    held: Mapping[str, Resident],
    load_ms: Mapping[str, int],
    now_ms: int,
    rules: PoolRules,
) -> Swap | None:
    cold = {m: b for m, b in backlogs.items() if m not in held and b.waiting > 0}
    if not cold:
        return None
    if rules.policy == "arrival":
        oldest = min(
            (m for m, b in backlogs.items() if b.waiting and b.oldest_ms is not None),
            key=lambda m: backlogs[m].oldest_ms or 0,
            default=None,
        )
        if oldest is None or oldest in held or _covered(backlogs[oldest], rules):
            return None
        return _place(oldest, held, backlogs, now_ms, rules, "the oldest request", keep_min=False)
    if rules.policy == "collate":
        if any(backlogs.get(m, Backlog()).waiting for m in held) and len(held) >= rules.capacity:
            return None  # what waits for the resident models goes first
        ready = [m for m, b in cold.items() if not _covered(b, rules)]
        if not ready:
            return None
        first = min(ready, key=lambda m: cold[m].oldest_ms or now_ms)
        why = "the resident models drained"
        return _place(first, held, backlogs, now_ms, rules, why, keep_min=False)
    return _weigh(cold, held, backlogs, load_ms, now_ms, rules)


def _weigh(
    cold: Mapping[str, Backlog],
    held: Mapping[str, Resident],
    backlogs: Mapping[str, Backlog],
    load_ms: Mapping[str, int],
    now_ms: int,
    rules: PoolRules,
) -> Swap | None:
    """The ``backlog`` policy: a starving model first (the oldest), then one that outranks the
    work of the resident models (waiting or running), then the one whose backlog most outweighs
    its swap."""
    bound = rules.model_wait_ms - rules.look_ms
    starving = [m for m, b in cold.items() if _waited_ms(b, now_ms) >= bound and not b.holders]
    if starving:
        model = min(starving, key=lambda m: cold[m].oldest_ms or now_ms)
        waited_s = _waited_ms(cold[model], now_ms) // 1000
        return _place(model, held, backlogs, now_ms, rules, f"waited {waited_s} s", "starving")
    ready = {m: b for m, b in cold.items() if not _covered(b, rules)}
    busy_rank = max((_rank(r, backlogs) for r in held.values()), default=0)
    outranking = [m for m, b in ready.items() if busy_rank and b.top_rank > busy_rank]
    if outranking:
        model = max(outranking, key=lambda m: (ready[m].top_rank, -(ready[m].oldest_ms or 0)))
        return _place(model, held, backlogs, now_ms, rules, "outranks the resident", "rank")
    resident_tokens = sum(backlogs.get(m, Backlog()).tokens for m in held)
    best: tuple[float, str] | None = None
    for model, b in ready.items():
        gain = b.tokens - _swap_tokens(load_ms.get(model, 0), resident_tokens, rules)
        if gain > 0 and (best is None or gain > best[0]):
            best = (gain, model)
    if best is None:
        return None
    gain, model = best
    why = f"backlog {ready[model].tokens}"
    swap = _place(model, held, backlogs, now_ms, rules, why, reload_ms=load_ms)
    if swap is None or swap.evict is None:
        return swap
    if gain <= backlogs.get(swap.evict, Backlog()).tokens:
        return None  # what waits for the resident one weighs as much: no swap
    return swap


def _rank(r: Resident, backlogs: Mapping[str, Backlog]) -> int:
    """The highest priority rank of a resident model's work here or in its lane."""
    return max(r.running_rank if r.running else 0, backlogs.get(r.model, Backlog()).top_rank)


def _place(
    model: str,
    held: Mapping[str, Resident],
    backlogs: Mapping[str, Backlog],
    now_ms: int,
    rules: PoolRules,
    why: str,
    force: Force = None,
    keep_min: bool = True,
    reload_ms: Mapping[str, int] | None = None,
) -> Swap | None:
    """Load ``model``: into a free place, else in the place of the resident model that loses
    least (nothing running here first, then the least waiting, then the least recently used).
    Unforced, only a model past its minimum residence with nothing running is a place; with
    ``reload_ms`` (the models' load times), only one idle for as long as its own load takes
    (the rent-or-buy rule: a model whose requests keep coming is not swapped out between them,
    to be loaded back a moment later; one idle that long has cost as much as a reload). Forced
    by ``"rank"`` (``model`` outranks what the resident models have waiting), a model past its
    minimum residence whose own work (running or waiting) ranks lower, drained first;
    by ``"starving"``, any model, drained first."""
    need = _need(backlogs.get(model, Backlog()), rules)
    if len(held) < rules.capacity:
        return Swap(load=model, evict=None, reason=why, need=need)
    rank = backlogs[model].top_rank if model in backlogs else 0
    places = []
    for r in held.values():
        b = backlogs.get(r.model, Backlog())
        young = keep_min and now_ms - r.loaded_ms < rules.min_resident_ms
        if force is None and (r.running or young):
            continue
        if reload_ms is not None and now_ms - r.used_ms < reload_ms.get(r.model, 0):
            continue
        if force == "rank" and (young or _rank(r, backlogs) >= rank):
            continue
        places.append((r.running > 0, b.tokens, r.used_ms, r.model))
    if not places:
        return None
    running, _, _, victim = min(places)
    return Swap(load=model, evict=victim, reason=why, drain=running, need=need)


def _waited_ms(b: Backlog, now_ms: int) -> int:
    return 0 if b.oldest_ms is None else now_ms - b.oldest_ms


def _covered(b: Backlog, rules: PoolRules) -> bool:
    """Whether the workers that hold (or load) a model are enough for what waits for it."""
    return bool(b.holders) and b.holders >= _need(b, rules)


def _need(b: Backlog, rules: PoolRules) -> int:
    """How many workers a model's backlog needs: each drains ``model_wait_ms`` of work."""
    per_worker = max(1.0, rules.drain_tokens_per_s * rules.model_wait_ms / 1000)
    return max(1, math.ceil(b.tokens / per_worker))


def _swap_tokens(load_ms: int, resident_tokens: int, rules: PoolRules) -> float:
    """What a load costs: the work this worker would have served meanwhile, at most what waits
    for the models it holds (nothing waits: the load costs no work, only its time)."""
    return min(load_ms / 1000 * rules.drain_tokens_per_s, resident_tokens)


MODELS_SHARE = 0.6
"""The share of free memory a pool's resident models may take by default; the rest is for the
batches (activations, the KV cache) and the process."""


def fits(sizes: Sequence[int], free_bytes: int, share: float = MODELS_SHARE) -> int:
    """How many of a pool's models (``sizes``: each one's weights in bytes) to keep loaded by
    default: N such that the N largest together fit in ``share`` of ``free_bytes`` (whichever
    N are resident, they fit), at most all of them; 0 when not even the largest fits (the pool
    cannot work here)."""
    room, count, taken = free_bytes * share, 0, 0
    for size in sorted(sizes, reverse=True):
        if taken + size > room:
            break
        count, taken = count + 1, taken + size
    return count
