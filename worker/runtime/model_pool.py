"""A worker's pool of models at run time: which it holds, what waits for each, and the swaps.

A worker started with several ``--model`` reads the lanes of the models it holds (at most
``--resident-models``), not the others'. Every ``LOOK_MS`` the read's round trip carries the
pool's look at every lane of the pool (a rider: ``ride``): the backlog (LLEN, and the entries
dead workers held: they wait for a holder of their model to take them over), the oldest
waiting entry of each priority (XPENDING of the entries no worker took yet) and who else holds
each model (the holders hash, as adapters are held). At each turn's read the reader asks the
pool to ``look``: the policy (``policy/model_pool.py``) says what to load and evict, and the pool
does it: it claims the model to load (``CLAIM_MODEL``: refused when as many other workers as its
backlog needs hold it already, so ten idle workers do not all load what one can drain; a load
in progress counts as held), stops reading the model it evicts, hands back what it holds of
it, waits for that model's running requests to end (the turns go on meanwhile: the other
resident models run), then evicts it and loads the other.
A worker of one model has no pool: none of this runs, and its Redis cost is unchanged.

What loads and evicts (a ``Loader``): on the echo engine ``EchoLoader`` (its models are names,
a load is ``--echo-load-ms`` of sleep), so the fleet's decisions are measurable without real
models; on the transformers and vLLM engines the worker's engine itself, an ``EnginePool``
(``engines/pool.py``: one engine a resident model).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from genq.common import script_calls
from genq.common.connection import REDIS_ERRORS
from genq.common.keys import GROUP, QUEUED, RETURNED, Keys, Lanes
from genq.common.lua.hold import HOLD
from genq.common.lua.model_claim import CLAIM_MODEL
from genq.common.models import PRIORITIES
from genq.common.prefixes import adapter_key
from genq.common.wire import as_text
from genq.worker.policy.lookahead import Held, Lookahead
from genq.worker.policy.model_pool import Backlog, PoolRules, Resident, Swap, decide
from genq.worker.runtime.clock import now_ms
from genq.worker.runtime.heartbeat import Counters
from genq.worker.runtime.metrics import Metrics
from genq.worker.runtime.queue_io import QueueIO
from genq.worker.runtime.read_trip import Taker

log = logging.getLogger("genq.worker")

LOOK_MS = 250
"""How often the read's round trip carries the pool's look at its lanes."""
RANK = {p: len(PRIORITIES) - i for i, p in enumerate(PRIORITIES)}
"""A priority's rank (high first): what the policy compares."""
DEFAULT_COST = 100
"""The weighted tokens a request counts for until the worker measured its own."""


class Loader(Protocol):
    """What loads and evicts a pool's models (an engine's side)."""

    def load(self, model: str) -> str | None:
        """Load ``model``; where from, when it says (``"host memory"``: a warm model)."""

    def evict(self, model: str) -> None: ...


class EchoLoader:
    """The echo engine's pool: its models are names; a load sleeps ``load_ms``."""

    def __init__(self, load_ms: float) -> None:
        self.load_ms = load_ms

    def load(self, model: str) -> str | None:
        time.sleep(self.load_ms / 1000)
        return None

    def evict(self, model: str) -> None:
        pass


@dataclass
class _Held:
    loaded_ms: int
    used_ms: int


class _Load:
    """Models loading in a thread of their own, one after the other, so that the turn goes on
    meanwhile (the heartbeat, the other models' requests): a real model takes seconds to tens
    of seconds to load, longer than the worker's stats key lives unrenewed."""

    def __init__(self, models: list[str], why: str, victim: str | None, loader: Loader) -> None:
        self.models, self.why, self.victim, self.loader = models, why, victim, loader
        self.took_ms: dict[str, int] = {}
        self.source: dict[str, str] = {}  # where a model came from, when the loader said
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="genq-model-load", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        for model in self.models:
            t0 = time.perf_counter()
            try:
                source = self.loader.load(model)
            except Exception as err:  # an engine's load can raise anything: one model lost
                self.error = err
                continue
            self.took_ms[model] = int((time.perf_counter() - t0) * 1000)
            if source:
                self.source[model] = source


class ModelPool:
    """One worker's models, the lanes it reads, and its swaps (see the module's docstring)."""

    def __init__(
        self,
        *,
        r: Any,
        keys: Lanes,
        models: Sequence[str],
        default_model: str,
        rules: PoolRules,
        loader: Loader,
        queue: QueueIO,
        counters: Counters,
        metrics: Metrics,
        fields: dict[str, Any],
        consumer: str,
    ) -> None:
        self.redis, self.keys, self.models, self.rules = r, keys, list(models), rules
        self.loader, self.queue, self.counters, self.consumer = loader, queue, counters, consumer
        self.metrics = metrics
        self.fields = fields
        """The worker's stats fields this pool keeps current (``resident``, its last swap)."""
        self.lanes: dict[str, list[Keys]] = {m: [] for m in models}
        for lane in keys.lanes():
            self.lanes[lane.model or default_model].append(lane)
        self.streams = {m: {s for k in ks for s in k.streams()} for m, ks in self.lanes.items()}
        """Each model's streams (its lanes')."""
        self.model_of = {s: m for m, streams in self.streams.items() for s in streams}
        """Each stream's model."""
        self.readable: set[str] = set()
        """The streams the worker reads: those of the models it holds (less one it drains)."""
        self.backlogs: dict[str, Backlog] = {}
        self.load_ms: dict[str, int] = dict.fromkeys(models, 0)
        """Each model's load time, as measured here (0 until its first load)."""
        self._held: dict[str, _Held] = {}
        self._loading: _Load | None = None  # a load under way, beside the turn
        self._swaps: dict[str, dict[str, int]] = {}  # per model: loads, evictions, load_ms
        self._swap: Swap | None = None
        self._fresh = False  # a look came since the last decision
        self._look_at_s = 0.0
        self._seen: list[str] = []  # other workers seen, whose liveness the next look asks
        self._cost = float(DEFAULT_COST)  # weighted tokens a request, measured
        self._rate: float | None = None  # weighted tokens a second served, measured
        self._served = (0, 0, time.monotonic())  # (requests, weighted tokens) ended, when

    def start(self) -> None:
        """Load the pool's first models (the worker's join), beside the turn: in the pool's
        order, those no other live worker holds or loads (each claimed as a load is, so two
        workers that start at once take different ones: the fleet starts spread over the pool),
        then, places left, the first of the others."""
        first: list[str] = []
        for model in self.models:
            if len(first) < self.rules.capacity and self._claimed(model, need=1):
                first.append(model)
        for model in self.models:
            if len(first) < self.rules.capacity and model not in first:
                first.append(model)
                self._tell("+", model)
        self._loading = _Load(first, "start", None, self.loader)
        self.fields["loading"] = " ".join(first)

    def stop(self) -> None:
        """Wait for a load under way to end (so that closing the engine closes what it made)."""
        if self._loading is not None:
            self._loading.thread.join()
            self._loaded()

    def ride(self, pipe: Any) -> Taker | None:
        """The pool's look at its lanes, in the read's round trip every ``LOOK_MS`` (a rider):
        per lane its backlog; per stream the oldest entry no worker took yet and the pending
        entries by consumer (those of dead workers wait for a holder of their model to take
        them over, so they count); per model its holders; then whether the consumers seen last
        time are alive (their stats hashes)."""
        now_s = time.monotonic()
        if now_s < self._look_at_s:
            return None
        self._look_at_s = now_s + LOOK_MS / 1000
        for model in self.models:
            for lane in self.lanes[model]:
                pipe.llen(lane.waiting)
                for stream in lane.streams():
                    pipe.xpending_range(stream, GROUP, "-", "+", 1, QUEUED)
                    pipe.xpending(stream, GROUP)
            pipe.hget(self.keys.holders, adapter_key(model))
        asked = list(self._seen)
        for consumer in asked:
            pipe.exists(self.keys.worker(consumer))
        return lambda replies: self._took(replies, asked)

    def _took(self, replies: list[Any], asked: list[str]) -> None:
        answers = replies[len(replies) - len(asked) :]
        live = {c for c, alive in zip(asked, answers, strict=True) if alive}
        dead = set(asked) - live
        at, seen = 0, set()
        for model in self.models:
            waiting, oldest, rank = 0, None, 0
            for lane in self.lanes[model]:
                waiting += int(replies[at])
                at += 1
                for stream in lane.streams():
                    first, summary = replies[at], replies[at + 1]
                    at += 2
                    for c in summary.get("consumers") or []:
                        name = as_text(c["name"])
                        if name not in (QUEUED, RETURNED, self.consumer):
                            seen.add(name)
                            waiting += int(c["pending"]) if name in dead else 0
                    if first:
                        ms = int(as_text(first[0]["message_id"]).split("-")[0])
                        oldest = ms if oldest is None else min(oldest, ms)
                        rank = max(rank, RANK[self.keys.priority_of(stream)])
            holders = [h for h in as_text(replies[at] or "").split() if h != self.consumer]
            at += 1
            seen.update(holders)
            alive = sum(1 for h in holders if h not in dead)
            tokens = round(waiting * self._cost)
            self.backlogs[model] = Backlog(waiting, tokens, oldest, rank, alive)
        self._seen = sorted(seen)
        self._fresh = True

    def look(self, lookahead: Lookahead, running: Iterable[Held]) -> None:
        """The reader's call at each read: decide on a fresh look, and go on with a swap under
        way (a drain ends, then the swap)."""
        if self._loading is not None:
            if self._loading.thread.is_alive():
                return  # (no decision while a load is under way)
            self._loaded()
        if not self.readable and self._swap is None:
            self._look_alone()  # (no read goes out, so no look rides one)
        if self._swap is None:
            if not self._fresh:
                return
            self._fresh = False
            self._measure()
            residents = self._residents(lookahead, running)
            swap = decide(self.backlogs, residents, self.load_ms, now_ms(), self._rules())
            if swap is None or (swap.load is not None and not self._claim(swap)):
                return
            self._swap = swap
        self._go_on(self._swap, lookahead, running)

    def _look_alone(self) -> None:
        """The look in a round trip of its own, when due: the worker holds no model (an idle
        one was unloaded), so it reads no lane and no read carries the look."""
        pipe = self.redis.pipeline(transaction=False)
        take = self.ride(pipe)
        if take is not None:
            take(script_calls.execute(pipe))

    def one_model(self, waiting: Iterable[Held]) -> list[Held]:
        """What waits of one model (a batch is one model's): the model of the request that
        goes first by priority and age (used now)."""
        held = list(waiting)
        if not held:
            return held
        first = max(held, key=lambda h: (RANK[h.request.priority], -h.enqueued_ms))
        model = self.model_of[first.stream]
        if model in self._held:  # (its last use: the policy's idle time counts from here)
            self._held[model].used_ms = now_ms()
        return [h for h in held if self.model_of[h.stream] == model]

    def _go_on(self, swap: Swap, lookahead: Lookahead, running: Iterable[Held]) -> None:
        victim = swap.evict
        if victim is not None and victim in self._held:
            self.readable -= self.streams[victim]
            mine = [k for k, h in lookahead.waiting.items() if self.model_of[h.stream] == victim]
            if mine:
                back = lookahead.take(mine)
                try:
                    self.queue.hand_back(back, rings=1)
                except REDIS_ERRORS:
                    lookahead.put_back(back)
                    raise
                lookahead.started(back)
            if any(self.model_of[h.stream] == victim for h in running):
                return  # drained first: its running requests end, then the swap
            self.loader.evict(victim)
            del self._held[victim]
            self._tell("-", victim)
            self.counters.model_evictions += 1
            self._count(victim, "evictions")
            self.metrics.model_evicted(victim)
        self._swap = None
        if swap.load is not None and swap.load not in self._held:
            self._load(swap.load, swap.reason, victim)
        elif victim is not None:
            log.info("model pool: evicted %s (%s)", victim, swap.reason)
        self.fields["resident"] = " ".join(sorted(self._held))

    def _claim(self, swap: Swap) -> bool:
        """Claim ``swap.load`` in the fleet before the swap: refused when as many other workers
        as its backlog needs hold it or load it already."""
        assert swap.load is not None
        claimed = self._claimed(swap.load, swap.need)
        if not claimed:
            log.debug("model pool: %s is held by enough workers", swap.load)
        return claimed

    def _claimed(self, model: str, need: int) -> bool:
        """``CLAIM_MODEL``: whether this worker now holds ``model`` in the fleet's eyes (fewer
        than ``need`` other live workers held it; 0: any number)."""
        args = [self.keys.config, self.consumer, adapter_key(model), need]
        return bool(script_calls.call(self.redis, CLAIM_MODEL, 1, *args))

    def _load(self, model: str, why: str, victim: str | None = None) -> None:
        """Start loading ``model`` beside the turn (its claim was told: held from then on)."""
        self._loading = _Load([model], why, victim, self.loader)
        self.fields["loading"] = model
        self.metrics.model_loading(model, True)

    def _loaded(self) -> None:
        """A load ended: its models are held and read from now on, or (it failed) given up."""
        load, self._loading = self._loading, None
        assert load is not None
        self.fields["loading"] = ""
        for model in load.models:
            self.metrics.model_loading(model, False)
            took_ms = load.took_ms.get(model)
            if took_ms is None:
                self._tell("-", model)
                log.error("model pool: loading %s failed: %s", model, load.error)
                continue
            self.load_ms[model] = took_ms
            self._count(model, "loads", took_ms, warm=model in load.source)
            self.metrics.model_loaded(model, took_ms / 1000)
            now = now_ms()
            self._held[model] = _Held(loaded_ms=now, used_ms=now)
            self.readable |= self.streams[model]
            self.counters.model_loads += 1
            self.counters.model_load_ms += took_ms
            self.fields["last_swap"] = f"{load.victim or '-'} -> {model}: {load.why}"
            place = f" in place of {load.victim}" if load.victim else ""
            source = f" from {load.source[model]}" if model in load.source else ""
            args = (model, took_ms, source, place, load.why)
            log.info("model pool: loaded %s in %d ms%s%s (%s)", *args)
        self.fields["resident"] = " ".join(sorted(self._held))

    def _count(
        self, model: str, what: str, load_ms: int | None = None, *, warm: bool = False
    ) -> None:
        """Count a load or an eviction of ``model`` in the stats hash's ``model_swaps`` (per
        model: loads, those of them from the warm tier, evictions, the last load's time)."""
        zero = {"loads": 0, "warm_loads": 0, "evictions": 0, "load_ms": 0}
        one = self._swaps.setdefault(model, zero)
        one[what] += 1
        one["warm_loads"] += warm
        if load_ms is not None:
            one["load_ms"] = load_ms
        self.fields["model_swaps"] = json.dumps(self._swaps, separators=(",", ":"))

    def _tell(self, op: str, model: str) -> None:
        """Tell the fleet at once that this worker holds (or loads) ``model``, or no longer."""
        args = [self.keys.config, self.consumer, op + adapter_key(model)]
        script_calls.call(self.redis, HOLD, 1, *args)

    def _residents(self, lookahead: Lookahead, running: Iterable[Held]) -> list[Resident]:
        busy: dict[str, list[Held]] = {}
        for h in [*lookahead.waiting.values(), *running]:
            busy.setdefault(self.model_of[h.stream], []).append(h)
        now = now_ms()
        out = []
        for model, held in self._held.items():
            mine = busy.get(model, [])
            if mine:
                held.used_ms = now
            rank = max((RANK[h.request.priority] for h in mine), default=0)
            out.append(Resident(model, held.loaded_ms, held.used_ms, len(mine), rank))
        return out

    def _measure(self) -> None:
        """This worker's cost a request and drain rate, from what ended since the last look."""
        c = self.counters
        done, tokens = c.finished, c.prompt_tokens + 2 * c.completion_tokens
        before_done, before_tokens, before_s = self._served
        now_s = time.monotonic()
        if done - before_done >= 10:
            self._cost += 0.3 * ((tokens - before_tokens) / (done - before_done) - self._cost)
            rate = (tokens - before_tokens) / max(now_s - before_s, 1e-3)
            self._rate = rate if self._rate is None else self._rate + 0.3 * (rate - self._rate)
            self._served = (done, tokens, now_s)

    def _rules(self) -> PoolRules:
        """The rules, with the drain rate measured here (once it is)."""
        if self._rate is None:
            return self.rules
        return dataclasses.replace(self.rules, drain_tokens_per_s=self._rate)


def pool_rules(settings: Any, capacity: int) -> PoolRules:
    """The policy's rules from a worker's settings."""
    return PoolRules(
        capacity=capacity,
        min_resident_ms=settings.min_resident_ms,
        model_wait_ms=settings.model_wait_ms,
        model_idle_ms=int(settings.model_idle_s * 1000),
        policy=settings.swap_policy,
        look_ms=LOOK_MS,
    )
