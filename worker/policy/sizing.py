"""How big a batch may be when the settings say ``auto`` (the default for ``max_batch_tokens``
and ``max_batch_size``): fixed numbers on a CPU, the device's free memory on a GPU.

Measured on an H100 (``random-250m``, float32, ``--engine static``; BENCHMARKS.md): a decode
step cost 16-19 ms for every batch from 1 to 256 rows and 32 ms at 512, so on a GPU the size
limit is 256 and the token budget is what the memory left after the model holds. A budget token
peaked at 2.3x its KV-cache bytes (prompts of 512, 256 new) and 3.5x (prompts of 1,024, 512
new: the prefill's attention grows with the prompt), so each token is given 4x its KV bytes.
If that is still too much, the out-of-memory back-off (``budget``) halves the budget for a while.
The continuous engine's paged cache is capped lower (``PAGED_GPU_TOKENS``).

Pure: the device's numbers are arguments (``engines/static.py: device_memory`` measures them).
"""

from __future__ import annotations

from dataclasses import dataclass

from genq.common.settings import AUTO

__all__ = [
    "AUTO",
    "BatchLimits",
    "DeviceMemory",
    "batch_limits",
    "kv_cache_tokens",
    "prefix_room",
]
CPU_BATCH_TOKENS = 16_384
CPU_BATCH_SIZE = 32
GPU_BATCH_SIZE = 256
MEMORY_FRACTION = 0.9
"""Share of the free device memory (after the model is loaded) a batch may use."""
PEAK_PER_KV_BYTE = 4
"""Peak memory a budget token may take, in multiples of its KV-cache bytes."""
PAGED_GPU_TOKENS = 65_536
"""The continuous engine's paged cache on a GPU: transformers' paged attention (sdpa, no
flash-attn) got slower as the cache grew (H100, 256 slots: 2,217 tokens/s at 65,536 tokens,
1,664 at 458,646), so its auto budget stops here; static batches get the whole memory."""
GIB = 1 << 30
PREFIX_ROOM_BUDGETS = 1
"""A caching engine's room for prefixes beyond its batch, in batch budgets, where genq sizes
the cache (a CPU; the continuous engine on a GPU): as much again as a full batch, so that the
prefixes of one batch survive the next one. On vLLM (smollm2-135m, CPU, BENCHMARKS.md "A
cache that outlives a batch") hits came from this room and none without it; more room than
the prefixes in use bought nothing but memory. On a GPU vLLM sizes its own cache from the
memory left after the model (its ``gpu_memory_utilization``): all of that is prefix room."""


@dataclass(frozen=True, kw_only=True)
class DeviceMemory:
    """What a GPU offers a batch, measured after the model is loaded."""

    free_bytes: int
    kv_bytes_per_token: int
    """Key and value bytes of one token over all layers (2 x layers x kv heads x head size x
    bytes per element)."""
    max_context_tokens: int


@dataclass(frozen=True, kw_only=True)
class BatchLimits:
    """A worker's batch limits and, for its start line, where they came from."""

    tokens: int
    size: int
    why: str


def batch_limits(
    *, tokens: int, size: int, device: DeviceMemory | None, paged: bool = False
) -> BatchLimits:
    """The limits for settings ``tokens`` and ``size`` (``AUTO`` or a number) on ``device``
    (None: a CPU, or an engine that sizes its own memory). ``paged``: the budget is the
    continuous engine's paged KV cache, at most ``PAGED_GPU_TOKENS`` on a GPU."""
    if device is None:
        t, s = tokens or CPU_BATCH_TOKENS, size or CPU_BATCH_SIZE
        why = "set" if tokens and size else "auto on a CPU: fixed"
        return BatchLimits(tokens=t, size=s, why=f"{why}: {s} requests, {t} tokens")
    s = size or GPU_BATCH_SIZE
    fit = int(device.free_bytes * MEMORY_FRACTION) // (PEAK_PER_KV_BYTE * device.kv_bytes_per_token)
    rows = s * device.max_context_tokens
    ceiling = min(rows, PAGED_GPU_TOKENS) if paged else rows
    t = tokens or max(1, min(fit, ceiling))
    parts = [f"{s} requests" + ("" if size else " (auto on a GPU)"), f"{t} tokens"]
    if not tokens:
        which = "a full context per row" if ceiling == rows else "the paged cache's"
        cap = f", capped at {ceiling}: {which}" * (ceiling < fit)
        parts[1] += (
            f" (auto: {MEMORY_FRACTION} x {device.free_bytes / GIB:.1f} GiB free / "
            f"({PEAK_PER_KV_BYTE} x {device.kv_bytes_per_token} KV bytes per token){cap})"
        )
    return BatchLimits(tokens=t, size=s, why=", ".join(parts))


def prefix_room(
    setting: int | None, *, engine: str, budget: int, on_gpu: bool, echo_cache_tokens: int
) -> int | None:
    """KV-cache tokens an engine keeps for prefixes beyond its batch budget: ``setting``
    (``--prefix-cache-tokens``) when given; else echo's simulated cache, nothing for the static
    engine (no cache outlives a ``generate`` call), None for vLLM on a GPU (vLLM sizes its
    cache from the device's free memory), and ``PREFIX_ROOM_BUDGETS`` budgets otherwise."""
    if setting is not None:
        return setting
    if engine == "echo":
        return echo_cache_tokens
    if engine == "static":
        return 0
    if engine == "vllm" and on_gpu:
        return None
    return PREFIX_ROOM_BUDGETS * budget


def kv_cache_tokens(*, budget: int, size: int, block_tokens: int, room: int) -> int:
    """Tokens of KV cache a caching engine needs so that admission never makes it preempt and
    ``room`` tokens of prefixes outlive a batch: the budget, one partly filled block per
    request (every request rounds up to whole blocks of the engine's ``block_tokens``), and
    the room."""
    return budget + block_tokens * size + room
