"""Engines: the part of the worker that turns a batch of prompts into text.

``static`` (transformers ``generate`` per batch), ``continuous`` (transformers' continuous
batching), ``vllm_engine`` (vLLM's engine) and ``echo`` (no model, for load tests) share the
small interface in ``base``. Beside them: ``builtin_models`` (the tiny and random-250m models,
built offline), ``packaged_models`` (smollm2-135m from its PyPI package) and ``chat`` (chat
templates). Engines that need torch import it only when built, so the worker's other modules
stay importable without it.
"""

from __future__ import annotations

from genq.common.settings import WorkerSettings
from genq.worker.engines.base import BatchReport, Engine, GenerationInput, GenerationOutput

__all__ = ["BatchReport", "Engine", "GenerationInput", "GenerationOutput", "make_engine"]


def make_engine(settings: WorkerSettings) -> Engine:
    """The engine the settings ask for, loaded and ready."""
    if settings.engine == "echo":
        from genq.worker.engines.echo import EchoEngine

        return EchoEngine(step_ms=settings.echo_step_ms)
    if settings.engine == "continuous":
        from genq.worker.engines.continuous import ContinuousEngine

        return ContinuousEngine.load(
            settings.model,
            settings.device,
            settings.dtype,
            max_batch_tokens=settings.max_batch_tokens,
            max_batch_size=settings.max_batch_size,
        )
    if settings.engine == "vllm":
        from genq.worker.engines.vllm_engine import VllmEngine

        return VllmEngine.load(
            settings.model,
            settings.device,
            settings.dtype,
            max_batch_tokens=settings.max_batch_tokens,
            max_batch_size=settings.max_batch_size,
            vllm_args=settings.vllm_engine_args,
        )
    from genq.worker.engines.static import StaticEngine

    return StaticEngine.load(settings.model, settings.device, settings.dtype)
