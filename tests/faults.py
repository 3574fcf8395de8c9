"""Fault injection for the recovery tests: the real worker loop and Redis, with an engine that
fails on purpose. Run as ``python -m tests.faults KIND [worker flags...]`` to get a worker
process that really dies (SIGKILL of itself) on a marked prompt.

Kinds (each is the echo engine plus one fault):

- ``crash``: a batch holding a prompt that contains ``CRASH`` kills the whole process, as a
  request that segfaults a CUDA kernel would;
- ``raise``: a batch holding a prompt that contains ``BOOM`` raises RuntimeError;
- ``oom``: a batch over ``OOM_BATCH_TOKENS`` tokens raises torch.OutOfMemoryError;
- ``vllm-break``: not echo but the real ``--engine vllm``, whose step raises once a prompt with
  ``BREAK`` is in it (a broken engine).
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Sequence
from typing import Any

from genq.worker.engines.base import BatchReport, GenerationInput
from genq.worker.engines.echo import EchoEngine

OOM_BATCH_TOKENS = 300


def _texts(batch: Sequence[GenerationInput]) -> list[str]:
    return [bytes(r.prompt_ids).decode("utf-8", "replace") for r in batch]


class CrashEngine(EchoEngine):
    def generate(self, batch: Sequence[GenerationInput]) -> BatchReport:
        if any("CRASH" in t for t in _texts(batch)):
            os.kill(os.getpid(), signal.SIGKILL)
        return super().generate(batch)


class RaiseEngine(EchoEngine):
    def __init__(self, step_ms: float = 0.0) -> None:
        super().__init__(step_ms)
        self.calls = 0

    def generate(self, batch: Sequence[GenerationInput]) -> BatchReport:
        self.calls += 1
        if any("BOOM" in t for t in _texts(batch)):
            raise RuntimeError("index out of range in self (injected)")
        return super().generate(batch)


class OomEngine(EchoEngine):
    def generate(self, batch: Sequence[GenerationInput]) -> BatchReport:
        import torch

        tokens = sum(len(r.prompt_ids) + r.max_new_tokens for r in batch)
        if tokens > OOM_BATCH_TOKENS:
            raise torch.OutOfMemoryError(f"CUDA out of memory (injected: {tokens} tokens)")
        return super().generate(batch)


ENGINES = {"crash": CrashEngine, "raise": RaiseEngine, "oom": OomEngine}


def vllm_breaking_on_marker(settings: object) -> object:
    """The real vLLM engine (``--engine vllm``), whose step raises once a request whose prompt
    contains ``BREAK`` was added: a request that breaks the engine, as a bad kernel would."""
    from genq.worker.engines import make_engine

    engine: Any = make_engine(settings)  # type: ignore[arg-type]
    inner = engine._engine
    add, step, marked = inner.add_request, inner.step, []

    def add_request(request_id: str, prompt: Any, params: Any, **options: Any) -> Any:
        if "BREAK" in engine.tokenizer.decode(prompt["prompt_token_ids"]):
            marked.append(request_id)
        return add(request_id, prompt, params, **options)

    def breaking_step() -> Any:
        if marked:
            raise RuntimeError("illegal memory access (injected)")
        return step()

    inner.add_request, inner.step = add_request, breaking_step
    return engine


def main(argv: list[str]) -> None:
    """``python -m tests.faults KIND --redis-url ... --queue ...``: a worker on that engine."""
    import logging

    from genq.common.settings import WorkerSettings
    from genq.worker.runtime.builder import build_worker

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    kind, rest = argv[0], argv[1:]
    flags = {rest[i].lstrip("-").replace("-", "_"): rest[i + 1] for i in range(0, len(rest), 2)}
    if kind == "vllm-break":
        settings = WorkerSettings.build({**flags, "engine": "vllm"})
        build_worker(settings, vllm_breaking_on_marker(settings)).run()  # type: ignore[arg-type]
        return
    settings = WorkerSettings.build({**flags, "engine": "echo"})
    build_worker(settings, ENGINES[kind](settings.echo_step_ms)).run()


if __name__ == "__main__":
    main(sys.argv[1:])
