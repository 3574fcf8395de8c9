"""Engines: the part of the worker that turns a batch of prompts into text (or, for an
embedding model, a batch of inputs into vectors).

``static`` (transformers ``generate`` per batch), ``continuous`` (transformers' continuous
batching), ``vllm_engine`` (vLLM's engine, started with ``vllm_args``: its
environment and ``EngineArgs``), ``vllm_embedding`` (vLLM's pooling runner behind the embedding
engine) and ``echo`` (no model, for load tests) share the
small interface in ``base``. Beside them: ``builtin_models`` (the tiny, random-250m and
random-1b models, built offline), ``packaged_models`` (smollm2-135m and all-minilm-l6-v2
from their PyPI packages), ``embedding`` (sentence-transformers embedding models: pooled
vectors, no text), ``scoring`` (cross-encoders: a query's score against each text),
``chat`` (chat templates), ``grammar`` (response formats compiled by xgrammar, and the
logits processor that holds rows to them), ``adapters`` (LoRA adapters on
a transformers model: mixed-adapter batches, loaded on demand; ``lora_layers`` runs them per
row; ``lora_builder`` builds test ones)
``static_group`` (the continuous engine's sampled rows, a static batch in a thread of its own,
stoppable between two decode steps), ``pool`` (a pool of models on a real engine:
one engine a resident model, loaded and evicted by the model pool), ``simulated_cache`` (the echo
engine's prefix cache, an LRU of hashed prompt blocks) and ``reaper`` (a small process that
ends vLLM's processes when their worker dies, SIGKILL included). Engines that need torch import
it only when built, so the worker's other modules stay importable without it.
"""

from __future__ import annotations

from typing import Any

from genq.common.errors import ConfigError
from genq.common.settings import WorkerSettings
from genq.worker.engines.base import BatchReport, Engine, GenerationInput, GenerationOutput
from genq.worker.policy.sizing import BatchLimits, batch_limits, prefix_room

__all__ = ["BatchReport", "Engine", "GenerationInput", "GenerationOutput", "make_engine"]


def make_engine(settings: WorkerSettings) -> Engine:
    """The engine the settings ask for, loaded and ready, with its batch limits (``limits``):
    the settings' numbers, or for ``auto`` sized to the device the model was loaded on."""
    tokens, size = settings.max_batch_tokens, settings.max_batch_size
    if settings.pool_models and settings.engine != "echo":
        return _pool(settings, batch_limits(tokens=tokens, size=size, device=None))
    if settings.engine == "vllm" and _embeds(settings.model):
        return _vllm_embedding(settings)
    if settings.engine == "vllm" and _scores(settings.model):
        raise ConfigError(
            f"{settings.model} is a cross-encoder: genq runs cross-encoders on transformers "
            "(--engine auto); vLLM's scoring runner is not behind --engine vllm"
        )
    if settings.engine in ("echo", "vllm"):
        # Neither loads a model genq can measure: auto is the fixed numbers on every device.
        limits = batch_limits(tokens=tokens, size=size, device=None)
        return _other_engine(settings, limits)
    from genq.worker.engines.embedding import (
        BATCH_SIZE,
        BATCH_TOKENS,
        EmbeddingEngine,
        is_embedding_model,
    )
    from genq.worker.engines.scoring import ScoringEngine, is_scoring_model
    from genq.worker.engines.static import StaticEngine, device_memory, load_model, resolve_model

    path = resolve_model(settings.model)
    if is_embedding_model(path) or is_scoring_model(path):
        kind = EmbeddingEngine if is_embedding_model(path) else ScoringEngine
        embedding = kind.load(path, settings.device, settings.dtype)
        embedding.limits = batch_limits(
            tokens=tokens or BATCH_TOKENS, size=size or BATCH_SIZE, device=None
        )
        return embedding
    model, tokenizer = load_model(path, settings.device, settings.dtype)
    memory = device_memory(model, settings.device)
    paged = settings.engine == "continuous"
    limits = batch_limits(tokens=tokens, size=size, device=memory, paged=paged)
    engine: Engine
    if settings.engine == "continuous":
        from genq.worker.engines.continuous import ContinuousEngine

        engine = ContinuousEngine(
            model,
            tokenizer,
            device=settings.device,
            max_batch_tokens=limits.tokens,
            max_batch_size=limits.size,
            prefix_room_tokens=_room(settings, limits) or 0,
            preempt=settings.preempt,
        )
    else:
        engine = StaticEngine(model, tokenizer, settings.device, _adapters(settings, model))
    engine.limits = limits
    return engine


def _other_engine(settings: WorkerSettings, limits: BatchLimits) -> Engine:
    engine: Engine
    if settings.engine == "echo":
        from genq.worker.engines.echo import EchoEngine

        engine = EchoEngine(
            step_ms=settings.echo_step_ms,
            prefill_us_per_token=settings.echo_prefill_us_per_token,
            cache_tokens=settings.echo_cache_tokens,
        )
    else:
        from genq.worker.engines.vllm_engine import VllmEngine

        engine = VllmEngine.load(
            settings.model,
            settings.device,
            settings.dtype,
            max_batch_tokens=limits.tokens,
            max_batch_size=limits.size,
            prefix_room_tokens=_room(settings, limits),
            vllm_args={**_vllm_lora(settings), **settings.vllm_engine_args},
            adapters=settings.adapters,
        )
    engine.limits = limits
    return engine


def _vllm_embedding(settings: WorkerSettings) -> Engine:
    """An embedding model on vLLM's pooling runner (``vllm_embedding``), in the budget the
    transformers embedding engine has where the limits are auto."""
    from genq.worker.engines.embedding import BATCH_SIZE, BATCH_TOKENS
    from genq.worker.engines.static import resolve_model
    from genq.worker.engines.vllm_embedding import VllmEmbeddingEngine

    limits = batch_limits(
        tokens=settings.max_batch_tokens or BATCH_TOKENS,
        size=settings.max_batch_size or BATCH_SIZE,
        device=None,
    )
    engine = VllmEmbeddingEngine.start(
        resolve_model(settings.model),
        settings.device,
        settings.dtype,
        max_batch_tokens=limits.tokens,
        max_batch_size=limits.size,
        vllm_args=settings.vllm_engine_args,
    )
    engine.limits = limits
    return engine


def _pool(settings: WorkerSettings, limits: BatchLimits) -> Engine:
    """A pool of models on a real engine (``engines/pool.py``), none loaded yet (the model
    pool loads them): each model checked to be a model folder, and what fits of them in memory
    (``--resident-models`` when not given) counted from their sizes; one that cannot fit even
    its largest model is refused."""
    from genq.worker.engines.pool import EnginePool, IterationPool, free_memory, pool_sizes
    from genq.worker.policy.model_pool import MODELS_SHARE, fits

    kinds = {model: _kind_of(model) for model in settings.pool}
    if set(kinds.values()) != {"generation"} and settings.engine != "static":
        if not settings.engine_why.startswith("auto"):
            raise ConfigError(
                f"--engine {settings.engine}: a pool with an embedding model or a cross-encoder "
                "runs on --engine static (one model's batch at a time)"
            )
        settings = settings.model_copy(update={"engine": "static"})
    sizes = pool_sizes(settings.pool, settings.dtype)
    free = free_memory(settings.device)
    room = fits(list(sizes.values()), free)
    if room == 0:
        largest = max(sizes, key=sizes.__getitem__)
        dtype = "float32" if settings.dtype == "auto" else settings.dtype
        raise ConfigError(
            f"this pool cannot fit one model: {largest} takes {sizes[largest] / 2**30:.1f} GiB "
            f"as {dtype}, more than {MODELS_SHARE:.0%} of the {free / 2**30:.1f} GiB free on "
            f"{settings.device}"
        )

    room = _warm_room(settings, sizes, free, room)

    def build(model: str) -> Engine:  # as a worker of that model alone builds it
        one = settings.model_copy(update={"model": model, "pool_models": ()})
        return make_engine(one)

    cls = EnginePool if settings.engine == "static" else IterationPool
    pool = cls(settings.engine, build, settings.model, limits)
    pool.fit = room
    pool.warm_slots = settings.warm_models
    pool.kinds = kinds
    return pool


def _kind_of(model: str) -> str:
    """``generation``, ``embedding`` or ``score``: what a pool's model does, read from its
    folder (a model that is no folder is refused with the pool's sizes)."""
    from genq.worker.engines.embedding import is_embedding_model
    from genq.worker.engines.scoring import is_scoring_model
    from genq.worker.engines.static import resolve_model

    try:
        path = resolve_model(model)
    except (OSError, ValueError, ConfigError):
        return "generation"
    if is_embedding_model(path):
        return "embedding"
    return "score" if is_scoring_model(path) else "generation"


def _warm_room(settings: WorkerSettings, sizes: dict[str, int], free: int, room: int) -> int:
    """``--warm-models`` checked against host memory (a warm model stays there: on a CPU beside
    the resident ones, which then default to what is left); the resident models' room."""
    from genq.worker.engines.pool import free_memory
    from genq.worker.policy.model_pool import MODELS_SHARE, fits

    warm = settings.warm_models
    if not warm:
        return room
    on_cpu = settings.device == "cpu"
    host = free if on_cpu else free_memory("cpu")
    held = (settings.resident_models or 1) + warm if on_cpu else warm
    if fits(list(sizes.values()), host) < held:
        where = "resident and warm" if on_cpu else "warm"
        raise ConfigError(
            f"--warm-models {warm}: {held} of this pool's largest models ({where}) do not fit "
            f"in {MODELS_SHARE:.0%} of the {host / 2**30:.1f} GiB of free host memory"
        )
    return max(1, room - warm) if on_cpu else room


def _room(settings: WorkerSettings, limits: BatchLimits) -> int | None:
    """KV-cache tokens kept for prefixes beyond the batch (``sizing.prefix_room``)."""
    return prefix_room(
        settings.prefix_cache_tokens,
        engine=settings.engine,
        budget=limits.tokens,
        on_gpu=settings.device.startswith("cuda"),
        echo_cache_tokens=settings.echo_cache_tokens,
    )


def _adapters(settings: WorkerSettings, model: Any) -> Any:
    """The ``--lora`` adapters on ``model`` (each loaded once to check it), or None."""
    if not settings.adapters:
        return None
    from genq.worker.engines.adapters import Adapters
    from genq.worker.engines.static import resolve_model

    names = [settings.model, resolve_model(settings.model)]
    return Adapters(model, settings.adapters, max_loras=settings.max_loras, base_names=names)


def _vllm_lora(settings: WorkerSettings) -> dict[str, Any]:
    """vLLM's LoRA arguments for the ``--lora`` adapters (checked first), or none."""
    from genq.worker.engines.static import resolve_model
    from genq.worker.engines.vllm_args import lora_engine_args

    names = [settings.model, resolve_model(settings.model)]
    cpu = settings.device == "cpu"  # base rows through a zero adapter there (zero_adapter)
    return lora_engine_args(settings.adapters, settings.max_loras, names, base_slot=cpu)


def _scores(model: str) -> bool:
    """Whether ``model`` names a local folder of a cross-encoder."""
    from genq.worker.engines.scoring import is_scoring_model

    return is_scoring_model(model)


def _embeds(model: str) -> bool:
    """Whether ``model`` names an embedding model: a packaged one, or a local folder of one."""
    from genq.worker.engines.embedding import is_embedding_model
    from genq.worker.engines.packaged_models import PACKAGED_FOLDERS

    return model in PACKAGED_FOLDERS or is_embedding_model(model)
