"""Prefixes inside a worker, pure (no Redis, no torch, no clock): which prefixes it counts
itself as holding (``Holdings``, what the read's affinity is told). The prefix rule of its
order (same-prefix requests in one batch, warm prefixes before cold ones) is
``affinity.Affinity``'s, beside the adapter rule.

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
