"""The prefix affinity's runtime side: which prefixes this worker holds (``policy/prefixes.py``
decides what it keeps), told to the fleet in the start's round trip (``HOLD``, with the
``running`` marks: a request's prefix is known to be held before its result can reach the
client, which may send the next one at once) and in the read's (before ``PULL``, so the read
already knows), and the keys computed for it (``common/prefixes.py``).

A worker holds the key of every request it starts (the engine computes that prefix into its
cache), for a chat it finished, the key of the conversation with its reply (what the next
turn will send), and the key of each LoRA adapter its engine holds (``adapter_key``: the
last ``--max-loras`` it ran). Keys are scoped to their tenant here exactly as the scripts
scope them.
``LoadNote``: when the worker writes its load (the affinity's load bound) with its heartbeat.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from genq.common import script_calls
from genq.common.keys import Keys
from genq.common.lua.hold import HOLD
from genq.common.prefixes import HOLDINGS_TTL_S, adapter_key, scoped
from genq.worker.policy.affinity import ResidentAdapters
from genq.worker.policy.lookahead import Held
from genq.worker.policy.prefixes import Holdings
from genq.worker.runtime.outcomes import Outcome
from genq.worker.runtime.read_trip import Taker


class PrefixAffinity:
    """One worker's holdings and the changes it has not told the fleet yet."""

    def __init__(
        self,
        *,
        keys: Keys,
        consumer: str,
        capacity_tokens: int,
        enabled: bool,
        sharing: Callable[[], set[str]],
        adapters: Sequence[str] = (),
        max_loras: int = 0,
    ) -> None:
        self.keys = keys
        self.consumer = consumer
        self.enabled = enabled
        self.holdings = Holdings(capacity_tokens if enabled else 0)
        self._sharing = sharing
        """The tenants whose keys meet other sharing tenants' (``TenantWeights.sharing``)."""
        self._adapters = frozenset(adapters)
        self._resident = ResidentAdapters(max_loras or len(self._adapters))
        """The adapters loaded in the engine (``--max-loras`` of them, 0: all)."""
        self._slots_told = self._slots_sending = ""
        """The free adapter slots the fleet was told of, and those being told."""
        self._ops: dict[str, str] = {}
        self.tracks_adapters = enabled and bool(self._adapters)
        """Whether it keeps adapters (``read`` has nothing to do without)."""
        self.untold = self.tracks_adapters  # (the free slots, at the first read)
        """Whether there may be changes to tell (``ride`` is not called without)."""
        """Key -> '+' (held, tell again: the holders list is most recent first) or '-'."""

    def scoped(self, tenant: str, raw: str, stream: str | None = None) -> str:
        """``raw`` as the scripts index it for ``tenant`` in the lane of ``stream``."""
        model = self.keys.lane_of(stream).model if stream else None
        return scoped(tenant, raw, tenant in self._sharing(), model)

    def started(self, batch: Sequence[Held]) -> None:
        """These requests started here: their prefixes are in the engine's cache now."""
        if not self.enabled:
            return
        for h in batch:
            if h.request.prefix_key:
                key = self.scoped(h.request.tenant, h.request.prefix_key, h.stream)
                self._hold(key, len(h.prompt_ids))
            if self._adapters and h.request.model in self._adapters:
                self._load(h.request.model)

    def read(self, held: Sequence[Held]) -> None:
        """These requests were read: their adapters count as loaded from now (they will run
        here soon), so that the next read's free slots say so."""
        if self.enabled and self._adapters:
            for h in held:
                if h.request.model in self._adapters:
                    self._load(h.request.model)

    def _load(self, adapter: str) -> None:
        """``adapter`` ran here: it is resident (the least recently used past ``--max-loras``
        is not); the fleet knows this worker holds its key."""
        self._ops[adapter_key(adapter)] = "+"  # again: the holders are most recent first
        self.untold = True
        for gone in self._resident.use(adapter):
            self._ops[adapter_key(gone)] = "-"

    def finished(self, outcomes: Sequence[Outcome]) -> None:
        """Chats that finished here: the conversation with its reply is the next turn's key."""
        if not self.enabled:
            return
        for o in outcomes:
            if o.continuation is not None and o.refund is not None:
                tokens = o.refund.prompt_tokens + o.refund.completion_tokens
                self._hold(self.scoped(o.tenant, o.continuation, o.stream), tokens)

    def _hold(self, key: str, tokens: int) -> None:
        """Hold ``key`` (told '+': most recent first), and let go what it pushed out. A worker
        that keeps nothing (a capacity of 0: the static engine, echo without its simulated
        cache) tells nothing: it would never tell '-', and the fleet's holders hash would grow
        a field per distinct prompt it ran (15 MB at a 200,000-line batch of echo workers)."""
        _, gone = self.holdings.hold(key, tokens)
        if key in self.holdings:
            self._ops[key] = "+"
            self.untold = True
        for k in gone:
            self._ops[k] = "-"

    def ride(self, pipe: Any) -> Taker | None:
        """Queue the untold changes on ``pipe`` (one HOLD call: a rider of every read and
        start); what marks them told once it went through (None: nothing to tell)."""
        if not self.untold:
            return None
        ops = [op + key for key, op in self._ops.items()]
        if self._adapters and self.enabled:
            self._slots_sending = str(self._resident.free)
            if self._slots_sending != self._slots_told:
                ops.append("#" + self._slots_sending)  # free adapter slots (``Keys.adapter_slots``)
        if not ops:
            return None
        script_calls.add(pipe, HOLD, 1, self.keys.config, self.consumer, *ops)
        return self._told

    def _told(self, _replies: list[Any]) -> None:
        self._ops.clear()
        self._slots_told = self._slots_sending
        self.untold = False


class LoadNote:
    """When a worker writes its load (what it holds, for the affinity's load bound) with its
    heartbeat: when it changed, or an hour after it last did (the load hash lives a day), so
    an idle worker does not write the same 0 at every beat."""

    def __init__(self) -> None:
        self._load, self._fresh_until = -1, 0.0

    def due(self, held: int) -> bool:
        """Whether to write ``held`` now (if so, it counts as written)."""
        now_s = time.monotonic()
        if held == self._load and now_s < self._fresh_until:
            return False
        self._load, self._fresh_until = held, now_s + HOLDINGS_TTL_S / 24
        return True
