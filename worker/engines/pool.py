"""A pool of models on a real engine: one engine of the worker's kind per resident model.

A worker started with several ``--model`` on the transformers engines (``static``,
``continuous``) or ``vllm`` gets an ``EnginePool``: it is the worker's engine (the runner hands
it each batch, which is one model's: ``ModelPool.one_model``) and the model pool's loader
(``runtime/model_pool.py`` says when to ``load`` and ``evict``). Each model's engine is built
as a worker of that model alone would build it (``make_engine``), so a pooled answer equals the
one model's; a row goes to the engine of the model its request names (``GenerationInput.adapter``;
None: the queue's default model). An eviction closes the engine (vLLM's processes end with it),
drops it, and gives its memory back (the collector, the CUDA cache, the C heap's free pages).
With ``--warm-models W`` (transformers engines), the last W evicted models stay warm in host
memory instead (W + 1 between a swap's eviction and its load, which may take the oldest back):
on a GPU the weights are moved to the host and a load moves them back (no read from disk, no
build); on a CPU they stay as they are, so a load is immediate and the memory stays taken. A
continuous engine's batching manager (its KV cache) is stopped either way.

``pool_sizes`` reads each model's size from its folder (the safetensors headers) before any
loads, so that ``--resident-models`` defaults to what fits (``policy/model_pool.py: fits``)
and a pool whose largest model cannot fit fails at start, one line.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import json
import math
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, cast

from genq.common.errors import ConfigError, GenqError
from genq.common.formats import ResponseFormat
from genq.common.tools import CALL_FORMAT_MARK
from genq.worker.engines.base import (
    BatchReport,
    Engine,
    GenerationInput,
    GenerationOutput,
    IterationEngine,
    PausingEngine,
    StoppableEngine,
)
from genq.worker.policy.sizing import BatchLimits

ELEMENT_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "auto": 4}
"""Bytes a weight takes loaded, by ``--dtype`` (auto: float32)."""


class EnginePool:
    """A pool's engines, by model; the worker's engine (static: ``generate``) and the model
    pool's loader (``load``, ``evict``). See the module's docstring."""

    tokenizer: Any = None  # (each model's engine has its own: ``of``)
    max_context_tokens: int | None = None  # (each model's: ``of``)
    prefix_room = 0
    stoppable = True  # (a pool of static engines: each one's batch stops between steps)

    def __init__(
        self, name: str, build: Callable[[str], Engine], default: str, limits: BatchLimits
    ) -> None:
        self.name = name
        self.build = build
        """Builds the engine of one model (as ``make_engine`` builds a worker of it alone)."""
        self.default = default
        """The model of a request that names none (the queue's default)."""
        self.limits: BatchLimits | None = limits
        self.engines: dict[str, Engine] = {}
        self.fit = 1
        """How many of its models fit in memory at once (``--resident-models``' default)."""
        self.warm_slots = 0
        """How many evicted models stay warm in host memory (``--warm-models``)."""
        self.warm: OrderedDict[str, Engine] = OrderedDict()  # the least recently evicted first
        self.kinds: dict[str, str] = {}
        """What each model does (``generation``, ``embedding``, ``score``), from its folder:
        told to the fleet (``GET /v1/models``) before it is loaded."""

    def of(self, model: str | None) -> Engine | None:
        """The engine of ``model`` (None: the default model), or None when it is not loaded."""
        return self.engines.get(model or self.default)

    def load(self, model: str) -> str | None:
        if model in self.engines:
            return None
        engine = self.warm.pop(model, None)
        self._trim(self.warm_slots)
        if engine is None:
            self.engines[model] = self.build(model)
            return None
        _move(engine, _device_of(engine))
        self.engines[model] = engine
        return "host memory"

    def _trim(self, most: int) -> None:
        """Drop the warm models evicted longest ago past ``most``."""
        if len(self.warm) > most:
            while len(self.warm) > most:
                self.warm.popitem(last=False)
            release_memory()

    def evict(self, model: str) -> None:
        engine = self.engines.pop(model, None)
        close = getattr(engine, "close", None)
        if close is not None:
            close()  # (a continuous engine's manager starts again at its next request; vLLM ends)
        if engine is not None and self.warm_slots:
            _move(engine, "cpu")
            self.warm[model] = engine
            # (one more than ``warm_slots`` until the next load: a swap evicts first, and the
            # model it loads may be the warm one evicted longest ago)
            self._trim(self.warm_slots + 1)
        del engine
        release_memory()

    def reads_tool_calls(self, model: str | None) -> bool:
        """Whether ``model``'s chat template teaches the Hermes call format."""
        engine = self.of(model)
        template = getattr(getattr(engine, "tokenizer", None), "chat_template", None)
        return isinstance(template, str) and CALL_FORMAT_MARK in template

    def tokenize(self, prompts: Sequence[str]) -> list[list[int]]:
        raise NotImplementedError("a pool tokenizes with each model's engine (of)")

    def constrain(self, fmt: ResponseFormat) -> Any:
        raise NotImplementedError("a pool constrains with each model's engine (of)")

    def generate(
        self, batch: Sequence[GenerationInput], *, stop: threading.Event | None = None
    ) -> BatchReport:
        """Run one model's batch on that model's engine (stoppable: ``StaticEngine``)."""
        engine = self._engine(batch[0].adapter)
        if stop is None:
            return engine.generate(batch)
        return cast(StoppableEngine, engine).generate(batch, stop=stop)

    def _engine(self, model: str | None) -> Engine:
        engine = self.of(model)
        if engine is None:  # (the model pool runs only what it holds: a bug if reached)
            raise RuntimeError(f"model {model or self.default!r} is not loaded on this worker")
        return engine


class IterationPool(EnginePool):
    """A pool of iteration-level engines (``continuous``, ``vllm``): each request is
    submitted to its model's engine and polled from it; pause and resume where it can."""

    stoppable = False  # (its engines pause requests instead: ``PausingEngine``)

    def __init__(
        self, name: str, build: Callable[[str], Engine], default: str, limits: BatchLimits
    ) -> None:
        super().__init__(name, build, default, limits)
        self._runs: dict[str, IterationEngine] = {}  # key -> the engine running it

    def submit(self, key: str, row: GenerationInput) -> None:
        engine = self._engine(row.adapter)
        assert isinstance(engine, IterationEngine)
        engine.submit(key, row)
        self._runs[key] = engine

    def poll(self, timeout_s: float) -> list[tuple[str, GenerationOutput | str | GenqError]]:
        """What finished on every engine that runs something (waiting at most ``timeout_s``
        in all: one engine's poll, or a share each)."""
        busy = list({id(e): e for e in self._runs.values()}.values())
        if not busy:
            time.sleep(min(timeout_s, 0.05))
            return []
        done: list[tuple[str, GenerationOutput | str | GenqError]] = []
        for engine in busy:
            done += engine.poll(timeout_s / len(busy) if not done else 0.0)
        for key, _ in done:
            self._runs.pop(key, None)
        return done

    def cancel(self, key: str) -> None:
        engine = self._runs.pop(key, None)
        if engine is not None:
            engine.cancel(key)

    def pause(self, key: str) -> bool:
        engine = self._runs.get(key)
        return isinstance(engine, PausingEngine) and engine.pause(key)

    def resume(self, key: str) -> None:
        engine = self._runs.get(key)
        if isinstance(engine, PausingEngine):
            engine.resume(key)

    def close(self) -> None:
        self.warm_slots = 0
        self.warm.clear()
        for model in list(self.engines):
            self.evict(model)


def _device_of(engine: Engine) -> str:
    """The device a transformers engine runs on."""
    return str(getattr(engine, "device", "cpu"))


def _move(engine: Engine, device: str) -> None:
    """Move a transformers engine's weights to ``device`` (nothing to do on a CPU engine)."""
    model = getattr(engine, "model", None)
    if model is not None and _device_of(engine) != "cpu":
        model.to(device)


def engine_for(engine: Any, model: str | None) -> Any:
    """The engine that runs a request naming ``model``: a pool's engine of it (None when it is
    not loaded here), else the worker's one engine."""
    return engine.of(model) if isinstance(engine, EnginePool) else engine


def release_memory() -> None:
    """Give an evicted model's memory back: the collector's pass (the model's tensors are in
    reference cycles), the CUDA allocator's cache, and the C heap's free pages (glibc keeps
    them otherwise, and the worker's resident memory would grow swap by swap)."""
    gc.collect()
    import sys

    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()
    with contextlib.suppress(OSError, AttributeError):  # (not glibc)
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def pool_sizes(models: Sequence[str], dtype: str) -> dict[str, int]:
    """Each pool model's weights in bytes as loaded in ``dtype`` (its parameters counted from
    its safetensors headers). Raises ConfigError naming a model that is no model folder."""
    from genq.worker.engines.static import resolve_model

    sizes = {}
    for model in models:
        try:
            path = Path(resolve_model(model))
        except (OSError, ValueError) as err:
            raise ConfigError(f"--model {model}: {err}") from None
        if not (path / "config.json").is_file():
            raise ConfigError(
                f"--model {model}: not a model folder (no config.json at {path}); a pool's "
                "models are built-in names or local folders"
            )
        sizes[model] = parameters(path) * ELEMENT_BYTES[dtype]
    return sizes


def parameters(path: Path) -> int:
    """The parameters of the model in folder ``path``, from its safetensors files' headers
    (their file sizes / 4 where it has none)."""
    files = sorted(path.glob("*.safetensors"))
    if not files:
        return sum(f.stat().st_size for f in path.glob("*.bin")) // 4
    count = 0
    for file in files:
        with open(file, "rb") as f:
            length = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(length))
        for name, tensor in header.items():
            if name != "__metadata__":
                count += math.prod(tensor["shape"])
    return count


def free_memory(device: str) -> int:
    """Bytes free for models on ``device``: the GPU's free memory, or the host's available."""
    if device.startswith("cuda"):
        import torch

        free, _ = torch.cuda.mem_get_info(torch.device(device))
        return int(free)
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES"))
