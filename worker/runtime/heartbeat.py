"""What a worker has done, and the stats hash it publishes (``genq stats``, ``genq top``).

The loop owns the counters; the writer thread publishes the stats fields with a batch of results
when the loop built them for it (the worker drained, or a heartbeat due: ``refresh``), and the
loop refreshes them at most once a second otherwise.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from genq.common import history
from genq.common.scripts import Applied
from genq.common.snapshot import derived
from genq.worker.engines.base import BatchReport
from genq.worker.policy.lookahead import Held
from genq.worker.runtime.clock import now_ms

log = logging.getLogger("genq.worker")

HEARTBEAT_S = 1.0
"""The loop refreshes the stats hash at most this often (the writer adds it to its writes)."""
IDLE_HEARTBEAT_S = 10.0
"""...and, while nothing it would publish changed (an idle worker), this often: its stats
hash lives ``--heartbeat-ttl-s`` (30 s; a third of that if shorter), and an idle fleet costs
Redis next to nothing."""
RECENT = 1000
"""How many batch sizes and queue waits the counters keep for the published percentiles."""


class StatsSink(Protocol):
    """Where the stats hash goes (the worker's QueueIO)."""

    def add_stats(self, pipe: Any, fields: dict[str, Any], recent: dict[str, int]) -> None: ...

    def publish_stats(self, fields: dict[str, Any], recent: dict[str, int]) -> None: ...


class Ended(Protocol):
    """What the counters need of a request that ended (an Outcome)."""

    status: str
    queue_wait_ms: int | None


@dataclass
class Counters:
    """What the worker has done since it started; published in its stats hash."""

    batches: int = 0
    model_loads: int = 0
    model_evictions: int = 0
    model_load_ms: int = 0
    succeeded: int = 0
    failed: int = 0
    expired: int = 0
    dead_lettered: int = 0
    already_final: int = 0
    """Requests found final when about to start or write (cancelled, or finished elsewhere)."""
    duplicates: int = 0
    """Entries whose id another entry owns (a second plain XADD of an id): acknowledged only."""
    reclaimed: int = 0
    handed_back: int = 0
    """Entries given back to the group unstarted (this worker was about to be busy)."""
    oom_splits: int = 0
    spacing_holds: int = 0
    """Batches a static worker held to space its start from the others' (``spacing.py``)."""
    preempted: int = 0
    """Running requests that gave their place to a higher-priority one (paused, run again)."""
    adapter_loads: int = 0
    """LoRA adapters loaded on demand (past ``--max-loras``: swaps; static engine)."""
    prompt_tokens: int = 0
    padded_prompt_tokens: int = 0
    cached_tokens: int = 0
    """Prompt tokens the engine took from its prefix cache (``usage.cached_tokens``)."""
    completion_tokens: int = 0
    decode_slots: int = 0
    generation_ms: int = 0
    embedded_inputs: int = 0
    """Embedding inputs answered (an embedding engine's; each repeat counted)."""
    embedded_tokens: int = 0
    """Input tokens computed for them (a repeat once; in ``prompt_tokens`` too)."""
    saved_inputs: int = 0
    """Embedding inputs not computed: an identical one of their scope was (in the batch, or
    among the engine's recent vectors)."""
    batch_sizes: list[int] = field(default_factory=list)
    """Sizes of the last ``RECENT`` batches (static) or starts (continuous)."""
    recent_waits_ms: list[int] = field(default_factory=list)
    """Queue waits of the last ``RECENT`` requests that started (for the published percentiles)."""
    unsent_waits_ms: list[int] = field(default_factory=list)
    """Queue waits not yet added to the queue's history (``Heartbeat.recent``)."""

    def as_hash(self) -> dict[str, int]:
        """The integer counters, as the stats hash holds them."""
        return {k: v for k, v in vars(self).items() if isinstance(v, int)}

    def ended(self, outcomes: Sequence[Ended]) -> None:
        """Count requests that reached a final state, and keep their waits."""
        for o in outcomes:
            if o.status == "succeeded":
                self.succeeded += 1
            elif o.status == "failed":
                self.failed += 1
            elif o.status == "expired":
                self.expired += 1
        waits = [o.queue_wait_ms for o in outcomes if o.queue_wait_ms is not None]
        self.recent_waits_ms += waits
        del self.recent_waits_ms[:-RECENT]
        self.unsent_waits_ms += waits
        del self.unsent_waits_ms[:-RECENT]

    @property
    def finished(self) -> int:
        """Requests that reached a final state here."""
        return self.succeeded + self.failed + self.expired

    def count_answers(self, answers: Sequence[int]) -> None:
        """Count what APPLY found instead of writing: already final, or a duplicate entry."""
        for a in answers:
            if a == Applied.ALREADY_FINAL:
                self.already_final += 1
            elif a == Applied.DUPLICATE:
                self.duplicates += 1
                log.info("acknowledged an entry whose id another entry owns (a duplicate)")

    def batch(self, size: int) -> None:
        """A batch (static) or a start (continuous) of ``size`` requests."""
        self.batches += 1
        self.batch_sizes.append(size)
        del self.batch_sizes[:-RECENT]

    def generated(self, report: BatchReport, generation_ms: int) -> None:
        """What a static batch computed (one batch of ``len(report.outputs)``)."""
        self.batches += 1
        self.batch_sizes.append(len(report.outputs))
        del self.batch_sizes[:-RECENT]
        self.prompt_tokens += report.prompt_tokens
        self.padded_prompt_tokens += report.padded_prompt_tokens
        self.cached_tokens += report.cached_tokens
        self.completion_tokens += report.completion_tokens
        self.decode_slots += report.decode_slots
        self.adapter_loads += report.adapter_loads
        self.generation_ms += generation_ms
        if report.inputs:
            self.embedded_inputs += report.inputs
            self.embedded_tokens += report.prompt_tokens - report.cached_tokens
            self.saved_inputs += report.saved_inputs

    def generated_one(
        self, *, prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0
    ) -> None:
        """What one request of a continuous engine computed (packed: no padding)."""
        self.prompt_tokens += prompt_tokens
        self.padded_prompt_tokens += prompt_tokens
        self.cached_tokens += cached_tokens
        self.completion_tokens += completion_tokens
        self.decode_slots += completion_tokens

    def summary(self) -> str:
        """The one line a worker logs when it stops."""
        d = derived(self.as_hash())
        return (
            f"succeeded={self.succeeded} failed={self.failed} expired={self.expired} "
            f"dead_lettered={self.dead_lettered} already_final={self.already_final} "
            f"duplicates={self.duplicates} "
            f"reclaimed={self.reclaimed} batches={self.batches} "
            f"mean_batch_size={d['mean_batch_size']:.1f} "
            f"padding_fraction={d['padding_fraction']:.3f} tokens_per_s={d['tokens_per_s']:.1f}"
        )


class Identity:
    """Who a worker is, in its stats hash: fixed for its life (read once, not per batch)."""

    def __init__(
        self,
        *,
        consumer: str,
        engine: str,
        model: str,
        device: str = "cpu",
        adapters: list[str] | None = None,
        kind: str = "generation",
        model_kinds: dict[str, str] | None = None,
    ) -> None:
        self.fields: dict[str, Any] = {
            "consumer": consumer,
            "device": device,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "engine": engine,
            "model": model,
            "kind": kind,  # generation, embedding or score: GET /v1/models says which
            "started_unix_ms": now_ms(),
        }
        if adapters:  # the LoRA adapters it serves as models too (--lora), space-separated
            self.fields["adapters"] = " ".join(adapters)
        if model_kinds and set(model_kinds.values()) != {"generation"}:
            # a pool of several kinds: MODEL:KIND for each, space-separated
            self.fields["model_kinds"] = " ".join(f"{m}:{k}" for m, k in model_kinds.items())


class Heartbeat:
    """Publishes a worker's stats hash: from the loop at most every ``HEARTBEAT_S``, and with
    a batch of results the writer writes (``latest``, built by ``refresh`` for the writer).
    Each publication also adds what the worker did since the last one to the queue's history
    (``genq.common.history``): the loop gathers it when it builds the fields, the thread that
    publishes takes it (under a lock: the loop and the writer both publish)."""

    def __init__(
        self,
        *,
        queue: StatsSink,
        identity: Identity,
        counters: Counters,
        holdings: Callable[[], tuple[list[Held], list[Held]]],
        idle_every_s: float = IDLE_HEARTBEAT_S,
    ) -> None:
        self.queue = queue
        self.idle_every_s = idle_every_s
        self.identity = identity
        self.counters = counters
        self.holdings = holdings
        """``() -> (waiting, in flight)``: what the worker holds now."""
        self.latest: dict[str, Any] = {}
        """Fields built for the writer to publish with its next write ({}: none new)."""
        self.due_s = HEARTBEAT_S
        """When ``beat`` may publish again, ``HEARTBEAT_S`` after the last publication
        (monotonic s): the loop calls it only from then."""
        self._published: dict[str, Any] = {}  # the last fields published, less the time
        self._lock = threading.Lock()
        self._recent: dict[str, int] = {}
        """History increments gathered and not yet published."""
        self._finished_seen = counters.finished
        self._tokens_seen = counters.completion_tokens

    def fields(self, drained: bool = False) -> dict[str, Any]:
        """The stats hash's fields, now (and gather the history increments since the last
        call; the loop's thread only). Built in one place: a closed loop builds them for every
        request (``refresh``). ``drained``: the worker holds nothing (none waiting, starting
        or running)."""
        c = self.counters
        finished = c.succeeded + c.failed + c.expired  # (``Counters.finished``)
        gathered = history.increments(
            finished - self._finished_seen,
            c.completion_tokens - self._tokens_seen,
            c.unsent_waits_ms,
        )
        self._finished_seen, self._tokens_seen = finished, c.completion_tokens
        c.unsent_waits_ms.clear()
        with self._lock:
            for k, v in gathered.items():
                self._recent[k] = self._recent.get(k, 0) + v
        waiting, in_flight = ([], []) if drained else self.holdings()
        waits = sorted(c.recent_waits_ms)
        oldest: dict[str, int] = {}  # per priority: when the oldest request waiting here came in
        for h in waiting:
            p = h.request.priority
            oldest[p] = min(oldest.get(p, h.enqueued_ms), h.enqueued_ms)
        return {
            **{k: v for k, v in vars(c).items() if isinstance(v, int)},  # (``as_hash``)
            **self.identity.fields,
            "last_seen_unix_ms": now_ms(),
            "held": len(waiting),
            "oldest_held_unix_ms": json.dumps(oldest),
            "in_flight": len(in_flight),
            "in_flight_by_tenant": json.dumps(Counter(h.request.tenant for h in in_flight)),
            "in_flight_tokens": sum(h.cost_tokens for h in in_flight),
            "wait_p50_ms": waits[len(waits) // 2] if waits else 0,
            "wait_p99_ms": waits[min(len(waits) - 1, len(waits) * 99 // 100)] if waits else 0,
            "recent_batch_sizes": json.dumps(c.batch_sizes[-100:]),
        }

    def recent(self) -> dict[str, int]:
        """Take the history increments gathered so far (to publish them)."""
        with self._lock:
            taken, self._recent = self._recent, {}
        return taken

    def beat(self, *, force: bool = False) -> bool:
        """Publish now if ``HEARTBEAT_S`` passed since the last time (``idle_every_s`` while
        nothing changed), or ``force``; True if it did."""
        since = time.monotonic() - (self.due_s - HEARTBEAT_S)  # since the last publication
        if not force and since < HEARTBEAT_S:
            return False
        fields = self.fields()
        same = {k: v for k, v in fields.items() if k != "last_seen_unix_ms"}
        with self._lock:
            quiet = same == self._published and not self._recent
        if not force and quiet and since < self.idle_every_s:
            return False
        self.due_s, self._published = time.monotonic() + HEARTBEAT_S, same
        self.queue.publish_stats(fields, self.recent())
        return True

    def refresh(self, *, drained: bool) -> None:
        """The loop's call with each batch of results: build the fields the writer publishes
        with them when the worker holds nothing more (``drained``: whoever reads the hash right
        after its last result sees it counted) or a heartbeat is due; a busy worker's hash is
        then at most ``HEARTBEAT_S`` old, and the loop does not rebuild it for every batch."""
        if drained or time.monotonic() >= self.due_s:
            fields = self.fields(drained)
            with self._lock:  # not lost to the writer taking the last ones at that moment
                self.latest = fields

    def add_latest(self, pipe: Any) -> None:
        """The writer thread's call: add ``latest`` to its round trip, if the loop built new
        fields since the last time."""
        with self._lock:
            latest, self.latest = self.latest, {}
            recent, self._recent = (self._recent, {}) if latest else (None, self._recent)
        if recent is not None:
            self.due_s = time.monotonic() + HEARTBEAT_S
            self.queue.add_stats(pipe, latest, recent)
