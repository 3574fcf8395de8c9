"""The look-ahead: every request a worker has read and not yet handed to its engine.

A worker holds at most ``max_per_stream`` waiting requests per priority stream, so the rest of the
queue stays available to the other workers of the group. Each held request is in one of two
stages here: **waiting** (a candidate for the next batch) or **starting** (taken for a batch,
being marked running). Once started, the runner holds it; once finished, the writer does.
The claim keeper renews exactly what these three hold, so a request dropped by mistake goes
idle and is taken over by another worker: never stuck.

Pure: no Redis, no torch, no clock.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from genq.common.models import PRIORITY_RANK, Request
from genq.common.settings import WorkerSettings
from genq.worker.policy.batching import Candidate
from genq.worker.policy.fair_share import Refund
from genq.worker.policy.preemption import Waiting


def entry_key(stream: str, entry_id: str) -> str:
    """A held request's key: entry ids are unique only within one stream."""
    return f"{stream} {entry_id}"


@dataclass(slots=True, kw_only=True)
class Held:
    """A request this worker has read and admitted. (Not frozen: one is made per request on the
    hot path, and a frozen dataclass costs several times as much to build.)"""

    stream: str
    """The work stream its entry is in (its priority)."""
    entry_id: str
    """The entry's id in that stream."""
    request: Request
    """The decoded request."""
    prompt_ids: list[int]
    """The prompt in the engine's tokenizer (its exact cost)."""
    enqueued_ms: int
    """When Redis accepted the entry (its id's time)."""
    starts: int = 0
    """How many times workers started it before (its attempts key; read only for entries
    delivered before). Above 0, a worker died running it: it runs alone (``suspect``), so that
    if it is what kills workers it takes no batch-mates with it. An entry that only waited in a
    dead worker's look-ahead, or was handed back, was never tried: it runs as any other."""
    started_ms: int | None = None
    """When a continuous runner started it (its generation time is measured from there)."""
    constraint: Any = None
    """What the engine made of its ``response_format`` (``Engine.constrain``), or None."""
    inputs: list[list[int]] | None = None
    """An embedding request's inputs in the engine's tokenizer, each fitted to the model
    (``prompt_ids`` is them end to end)."""
    charge: tuple[int, int] = (0, 0)
    """What its tenant was charged when a worker read it (``policy/fair_share.py: charge``):
    refunded, less what it used, when it ends."""
    key: str = field(init=False)
    """Unique among held requests (``entry_key``)."""
    candidate: Candidate = field(init=False)
    """The request as the batching policy sees it (built once: the policy runs each turn)."""
    pair: str = field(init=False)
    """``PRIORITY|TENANT``: whose work it is, as a read's probe names it."""

    def __post_init__(self) -> None:
        self.key = entry_key(self.stream, self.entry_id)
        self.pair = f"{self.request.priority}|{self.request.tenant}"
        key = self.request.prefix_key
        self.candidate = Candidate(
            key=self.key,
            prompt_tokens=len(self.prompt_ids),
            max_new_tokens=self.request.max_new_tokens if self.inputs is None else 0,
            enqueued_ms=self.enqueued_ms,
            priority_rank=PRIORITY_RANK[self.request.priority],
            tenant=self.request.tenant,
            choices=self.request.n,
            prefix=None if key is None else f"{self.request.tenant} {key}",
            model=self.request.model,
        )

    def recharge(self) -> Refund:
        """Its charge made exact as soon as its prompt is tokenized: the read charged an
        estimate (``fair_share.charge``); from now on it is charged its real prompt, so a tenant's
        tokens per minute hold within what one read takes. Returns the correction to send."""
        fix = Refund(
            tenant=self.request.tenant,
            charged=self.charge,
            prompt_tokens=len(self.prompt_ids),
            completion_tokens=self.charge[1],
            ended=False,
            started=False,
        )
        self.charge = (len(self.prompt_ids), self.charge[1])
        return fix

    @property
    def suspect(self) -> bool:
        """Started before by a worker that died: it runs alone."""
        return self.starts > 0

    @property
    def cost_tokens(self) -> int:
        """What it takes from the batch's token budget: prompt + max_new_tokens."""
        return self.candidate.cost_tokens


class Lookahead:
    """The waiting and starting requests of one worker, with the room left per stream."""

    def __init__(self, *, streams: Sequence[str], max_per_stream: int) -> None:
        self.streams = list(streams)
        self.max_per_stream = max_per_stream
        self.waiting: dict[str, Held] = {}
        """Candidates for the next batch, by key."""
        self.starting: dict[str, Held] = {}
        """Taken for a batch, not yet handed to the runner."""
        self._per_stream: Counter[str] = Counter()
        self._pairs: Counter[str] = Counter()
        """Waiting requests per ``PRIORITY|TENANT`` (``held_tenants``, asked at every read)."""
        self.suspects = 0
        """How many waiting requests are suspects (``next_suspect`` finds none while 0)."""

    @classmethod
    def for_settings(cls, settings: WorkerSettings, streams: Sequence[str]) -> Lookahead:
        """The look-ahead a worker with these settings keeps over ``streams``: at least one
        full batch per stream, so a large batch limit (256 on a GPU) is not cut to the
        look-ahead (on an H100 a batch cut to 64 ran the queue at 0.6x in-process)."""
        return cls(
            streams=streams, max_per_stream=max(settings.max_lookahead, settings.max_batch_size)
        )

    def __len__(self) -> int:
        return len(self.waiting) + len(self.starting)

    def holds(self, key: str) -> bool:
        """Whether a request with this key is waiting or starting."""
        return key in self.waiting or key in self.starting

    def add(self, held: Held) -> None:
        """A newly admitted request joins the waiting ones."""
        self.waiting[held.key] = held
        self._per_stream[held.stream] += 1
        self._pairs[held.pair] += 1
        self.suspects += held.starts > 0

    def room(self, limit: int | None = None) -> dict[str, int]:
        """How many more entries each stream may deliver to this worker now: up to
        ``max_per_stream`` waiting per stream, and (``limit``) at most that many more in all."""
        left = None if limit is None else max(0, limit - len(self.waiting))
        return {
            s: max(0, self.max_per_stream - self._per_stream[s])
            if left is None
            else min(left, max(0, self.max_per_stream - self._per_stream[s]))
            for s in self.streams
        }

    def held_tenants(self) -> list[str]:
        """The tenants waiting here, per priority (``PRIORITY|TENANT``): a read's probe skips
        them (``common/lua/read.py: PULL``)."""
        return sorted(self._pairs)

    def priorities(self) -> list[str]:
        """The priorities of the requests waiting here (what preemption weighs)."""
        return [h.request.priority for h in self.waiting.values()]

    def asks(self) -> list[Waiting]:
        """The requests waiting here as preemption weighs them (priority, new tokens, since)."""
        return [
            Waiting(h.request.priority, h.request.max_new_tokens, h.enqueued_ms)
            for h in self.waiting.values()
        ]

    def candidates(self) -> list[Candidate]:
        """The waiting requests as the batching policy sees them."""
        return [h.candidate for h in self.waiting.values()]

    def next_suspect(self) -> Held | None:
        """The oldest waiting request that was started before (it runs alone), if any."""
        # ``suspect`` read directly: this runs every turn over every waiting request
        suspects = [h for h in self.waiting.values() if h.starts > 0]
        return min(suspects, key=lambda h: h.enqueued_ms) if suspects else None

    def take(self, keys: Iterable[str]) -> list[Held]:
        """Move these waiting requests to starting; return them in the order given."""
        batch = []
        for key in keys:
            held = self.waiting.pop(key)
            self.suspects -= held.starts > 0
            self._per_stream[held.stream] -= 1
            self._pairs[held.pair] -= 1
            if not self._pairs[held.pair]:
                del self._pairs[held.pair]
            self.starting[key] = held
            batch.append(held)
        return batch

    def put_back(self, batch: Iterable[Held]) -> None:
        """Starting failed before anything ran (Redis away): they wait again."""
        for held in batch:
            if self.starting.pop(held.key, None) is not None:
                self.add(held)

    def started(self, batch: Iterable[Held]) -> None:
        """These left the look-ahead: handed to the runner, handed back to the group, or
        finished without running."""
        for held in batch:
            self.starting.pop(held.key, None)

    def entries(self) -> list[tuple[str, str]]:
        """(stream, entry id) of every request held here. Safe from another thread: a dict's
        copy() is atomic under the GIL."""
        held = [*self.waiting.copy().values(), *self.starting.copy().values()]
        return [(h.stream, h.entry_id) for h in held]
