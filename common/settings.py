"""Worker settings: one object, each default written once, units in the names.

Every field is a CLI flag of ``genq worker`` and has an environment twin: ``max_batch_tokens`` is
``--max-batch-tokens`` and ``GENQ_MAX_BATCH_TOKENS``. A flag wins over its variable, a variable
over the default. Unknown fields, and unknown ``GENQ_*`` variables, raise ConfigError.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from genq.common.errors import ConfigError
from genq.common.keys import check_queue_name
from genq.common.model_settings import DType as DType
from genq.common.model_settings import EngineName as EngineName
from genq.common.model_settings import ModelSettings, auto_engine
from genq.common.models import MAX_NEW_TOKENS
from pydantic import (
    Field,
    ValidationError,
    field_validator,
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

AUTO = 0
"""``max_batch_tokens`` and ``max_batch_size``: sized by the worker for its device (``auto``)."""


class WorkerSettings(ModelSettings):
    """Everything a worker can be told. See the configuration table (docs/workers.md). What it
    serves (its models, engine and device) is ``ModelSettings``'s (``model_settings.py``)."""

    redis_url: str = Field(
        DEFAULT_REDIS_URL,
        description="Redis URL: redis://, rediss:// (TLS), unix://, or redis+cluster://host:port "
        "(any node of a Redis Cluster)",
    )
    queue: str = Field(DEFAULT_QUEUE, description="queue name; one consumer group per queue")
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
        description="on the continuous and vLLM engines, a waiting request of a higher "
        "priority takes the place of the lowest-priority running one, which is paused and run "
        "again (greedy or seeded: the same text) once there is room; on the static engine a "
        "lower batch stops between two decode steps (an embedding batch: two passes) for it "
        "and runs again after it "
        "(--no-preempt: what runs is never interrupted)",
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
    oom_backoff_s: Annotated[float, Field(ge=0)] = Field(
        60.0, description="after out-of-memory, run with half the batch budget for this long"
    )

    @field_validator("max_batch_tokens", "max_batch_size", mode="before")
    @classmethod
    def _auto(cls, v: Any) -> Any:
        return AUTO if isinstance(v, str) and v.strip().lower() == "auto" else v

    @field_validator("queue")
    @classmethod
    def _queue_name(cls, v: str) -> str:
        return check_queue_name(v)

    @property
    def consumer_name(self) -> str:
        """This worker's consumer name in the group."""
        return self.consumer or f"{socket.gethostname()}-{os.getpid()}"

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
            settings = cls.model_validate(values, strict=False)
        except ValidationError as err:
            raise ConfigError("invalid setting: " + _problems(cls, err)) from None
        if values.get("engine", "auto") == "auto":
            warm = bool(settings.warm_models)
            why = auto_engine(settings.device, lora=bool(settings.lora), warm=warm)[1]
            settings._engine_why = f"auto: {why}"
        return settings


def _problems(cls: type[WorkerSettings], err: ValidationError) -> str:
    """Each invalid setting, named with its flag and its environment twin."""
    msgs = []
    for e in err.errors():
        msg = str(e["msg"]).removeprefix("Value error, ")
        if not e["loc"]:  # a rule over several settings: its message names them
            msgs.append(msg)
            continue
        name = str(e["loc"][0])
        msgs.append(f"{name} (--{name.replace('_', '-')} / {cls.env_var(name)}): {msg}")
    return "; ".join(msgs)


def check_env(env: Mapping[str, str]) -> None:
    """Raise ConfigError for a ``GENQ_*`` variable that is no setting (a typo would be ignored)."""
    known = {WorkerSettings.env_var(n) for n in WorkerSettings.model_fields} | OTHER_ENV_VARS
    unknown = sorted(k for k in env if k.startswith(ENV_PREFIX) and k not in known)
    if unknown:
        raise ConfigError(f"unknown environment variable(s) {unknown}; known: {sorted(known)}")
