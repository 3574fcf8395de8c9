"""A simulated prefix cache, for ``--engine echo``: what a caching engine (vLLM's automatic
prefix caching, after ``vllm/v1/core/kv_cache_utils.py: hash_block_tokens``; NVIDIA Dynamo's
mocker) would have kept, so that the fleet effect of placing requests by prefix is measurable
without a GPU.

A prompt is cut into full blocks of ``BLOCK_TOKENS``; each block is named by a hash chained over
every block before it, so a block matches only when the whole prefix up to it does. The cache is
an LRU of those names bounded by ``capacity_tokens``. ``lookup`` says how many of a prompt's
leading tokens are cached; ``insert`` keeps a prompt's blocks (most recently used first out
last). Not thread-safe: the engine's own thread uses it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

BLOCK_TOKENS = 16
"""Tokens per cached block: vLLM's default block size on a GPU."""


def block_hashes(token_ids: Sequence[int], block_tokens: int = BLOCK_TOKENS) -> list[int]:
    """The chained names of ``token_ids``' full blocks, first block first."""
    out: list[int] = []
    parent = 0
    for start in range(0, len(token_ids) - block_tokens + 1, block_tokens):
        parent = hash((parent, tuple(token_ids[start : start + block_tokens])))
        out.append(parent)
    return out


class SimulatedPrefixCache:
    """An LRU of prompt blocks, ``capacity_tokens`` in all (0: caches nothing)."""

    def __init__(self, capacity_tokens: int, block_tokens: int = BLOCK_TOKENS) -> None:
        self.block_tokens = block_tokens
        self.capacity_blocks = capacity_tokens // block_tokens
        self._blocks: OrderedDict[int, None] = OrderedDict()

    def lookup(self, token_ids: Sequence[int]) -> int:
        """How many leading tokens of ``token_ids`` the cache holds (whole blocks), touching
        them. The last token is never counted: an engine computes it to sample the first
        output (as vLLM does), so a prompt is never wholly cached."""
        if not self.capacity_blocks:
            return 0
        hit = 0
        for name in block_hashes(token_ids[:-1] if token_ids else token_ids, self.block_tokens):
            if name not in self._blocks:
                break
            self._blocks.move_to_end(name)
            hit += 1
        return hit * self.block_tokens

    def insert(self, token_ids: Sequence[int]) -> None:
        """Keep ``token_ids``' full blocks, evicting the least recently used beyond capacity."""
        if not self.capacity_blocks:
            return
        for name in block_hashes(token_ids, self.block_tokens):
            self._blocks[name] = None
            self._blocks.move_to_end(name)
        while len(self._blocks) > self.capacity_blocks:
            self._blocks.popitem(last=False)

    def __len__(self) -> int:
        """Blocks held."""
        return len(self._blocks)
