"""The gateway's settings: each a ``genq serve`` flag with an environment twin."""

from __future__ import annotations

import typing
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from genq.common.errors import ConfigError
from genq.common.models import DEFAULT_TENANT, tenant_problem
from genq.common.settings import DEFAULT_QUEUE, DEFAULT_REDIS_URL, DEFAULT_RESULT_TTL_S

OPERATOR_TENANT = "operators"
"""The tenant of what ``--admin-key`` callers submit; no ``--api-key`` may name it."""


def key_tenants(specs: tuple[str, ...]) -> dict[str, str]:
    """``--api-key`` values (``KEY=TENANT``, or a bare ``KEY``: tenant ``default``) as a map
    from key to tenant. A key that ends in ``=`` (base64 padding) is taken whole. Raises
    ConfigError naming a bad tenant or an empty key."""
    out: dict[str, str] = {}
    for spec in specs:
        key, sep, tenant = spec.rpartition("=")
        if not sep or not tenant:
            key, tenant = spec, DEFAULT_TENANT
        problem = tenant_problem(tenant)
        if problem is not None:
            raise ConfigError(f"--api-key ...={tenant}: {problem}")
        if not key:
            raise ConfigError(f"--api-key {spec!r}: the key is empty")
        if tenant == OPERATOR_TENANT:
            raise ConfigError(
                f"--api-key ...={tenant}: tenant {tenant!r} is reserved for --admin-key callers"
            )
        out[key] = tenant
    return out


def _flag(
    default: Any, *, env: str, help: str, flag: str | None = None, secret: bool = False
) -> Any:
    """A setting that is a ``genq serve`` flag (``flag``: its name, when not the field's)
    with an environment twin (``env``); a tuple setting's flag repeats, its twin is
    comma-separated. A ``secret`` one is left out of the settings' ``repr`` (a log line or a
    traceback that shows them shows no key)."""
    return field(
        default=default, repr=not secret, metadata={"env": env, "help": help, "flag": flag}
    )


@dataclass(frozen=True, kw_only=True)
class GatewaySettings:
    """What ``genq serve`` is told. Each field made with ``_flag`` is a flag of ``genq serve``
    with an environment twin (the command builds them from here: ``serve_flags``)."""

    redis_url: str = DEFAULT_REDIS_URL
    queue: str = DEFAULT_QUEUE
    host: str = _flag("127.0.0.1", env="GENQ_SERVE_HOST", help="interface to listen on")
    port: int = _flag(8000, env="GENQ_SERVE_PORT", help="TCP port")
    insecure_open: bool = _flag(
        False,
        env="GENQ_SERVE_INSECURE_OPEN",
        help="serve with no --api-key/--admin-key on a non-loopback --host, and to any Host "
        "name (every caller is then an operator): only behind your own authentication",
    )
    api_keys: tuple[str, ...] = _flag(
        (),
        env="GENQ_API_KEYS",
        flag="--api-key",
        secret=True,
        help="accepted 'Authorization: Bearer' key, as KEY=TENANT (a bare KEY: tenant "
        "default): the key's requests belong to TENANT and it sees only TENANT's requests, "
        "files and batches; repeat for several; none (and no admin keys): no key needed",
    )
    """Accepted ``Authorization: Bearer`` keys, each ``KEY=TENANT`` (a bare ``KEY``: tenant
    ``default``): a key's requests belong to its tenant, and it sees only that tenant's
    requests, files and batches. No keys at all (and no admin keys): no key needed, everything
    is tenant ``default`` and every caller sees everything."""
    admin_keys: tuple[str, ...] = _flag(
        (),
        env="GENQ_ADMIN_KEYS",
        flag="--admin-key",
        secret=True,
        help="a key that sees every tenant's files and batches (operators; what it submits is "
        "tenant 'operators'); repeat for several",
    )
    """Keys that see every tenant's files and batches (operators, the dashboard); what they
    submit is the reserved tenant ``operators``."""
    request_timeout_s: float = _flag(
        600.0,
        env="GENQ_SERVE_REQUEST_TIMEOUT_S",
        help="longest a completion waits for its result; then it is cancelled (504)",
    )
    max_in_flight: int = _flag(
        10_000,
        env="GENQ_SERVE_MAX_IN_FLIGHT",
        help="most completions and responses this gateway answers at once, every tenant's "
        "together (waiting or streaming); past it, 429 with Retry-After (0: no limit)",
    )
    max_in_flight_per_tenant: int = _flag(
        5_000,
        env="GENQ_SERVE_MAX_IN_FLIGHT_PER_TENANT",
        help="most completions and responses of one tenant (all its keys together) this "
        "gateway answers at once; past it, 429 with Retry-After (0: no limit)",
    )
    redis_connections: int = _flag(
        64,
        env="GENQ_SERVE_REDIS_CONNECTIONS",
        help="Redis connections the gateway's routes share (a route waits for a free one); the "
        "result readers add one per 500 waiting requests",
    )
    max_body_bytes: int = _flag(
        4_000_000,
        env="GENQ_SERVE_MAX_BODY_BYTES",
        help="largest JSON request body, counted as it arrives (413 past it; uploads have "
        "--max-file-bytes)",
    )
    tenant_max_files: int = _flag(
        1_000,
        env="GENQ_SERVE_TENANT_MAX_FILES",
        help="most uploaded files a tenant keeps (genq tenants set --max-files overrides)",
    )
    tenant_max_stored_bytes: int = _flag(
        1_000_000_000_000,
        env="GENQ_SERVE_TENANT_MAX_STORED_BYTES",
        help="most bytes of uploaded files a tenant keeps in the file store (genq tenants set "
        "--max-stored-bytes overrides)",
    )
    tenant_max_batches: int = _flag(
        1_000,
        env="GENQ_SERVE_TENANT_MAX_BATCHES",
        help="most batches a tenant keeps (genq tenants set --max-batches overrides)",
    )
    tenant_max_responses: int = _flag(
        100_000,
        env="GENQ_SERVE_TENANT_MAX_RESPONSES",
        help="most stored responses a tenant keeps (genq tenants set --max-responses overrides)",
    )
    max_file_bytes: int = _flag(
        100_000_000_000,
        env="GENQ_SERVE_MAX_FILE_BYTES",
        help="largest batch input file POST /v1/files takes (100 GB; it goes to the file "
        "store, not Redis)",
    )
    files_dir: str = _flag(
        "",
        env="GENQ_FILES_DIR",
        help="the file store of uploaded batch files: a directory, or an object store's URL "
        "(s3://bucket/prefix; AWS_* variables give its endpoint and credentials); the gateways "
        "of a queue share one (default: $XDG_DATA_HOME/genq/files)",
    )
    batch_window: int = _flag(
        10_000,
        env="GENQ_BATCH_WINDOW",
        help="most requests of one batch in Redis at once: the rest of its file is fed in as "
        "they end (a batch's file may be millions of lines)",
    )
    files_timeout_s: float = _flag(
        30.0,
        env="GENQ_FILES_TIMEOUT_S",
        help="longest one call to an object store may take, retries included, before the "
        "request that made it fails (503)",
    )
    storage_max_redis_fraction: float = _flag(
        0.5,
        env="GENQ_SERVE_STORAGE_MAX_REDIS_FRACTION",
        help="uploads and batches stop (507) while Redis' memory with them would pass this "
        "fraction of its maxmemory, so that requests keep the rest (0: only the quotas)",
    )
    webhook_url: str = _flag(
        "",
        env="GENQ_WEBHOOK_URL",
        help="where every webhook event goes (responses that end); with --webhook-secret",
    )
    webhook_secret: str = _flag(
        "",
        env="GENQ_WEBHOOK_SECRET",
        secret=True,
        help="the whsec_... secret that signs webhook deliveries (prefer the environment twin: "
        "a flag shows in ps)",
    )
    webhook_timeout_s: float = _flag(
        10.0, env="GENQ_WEBHOOK_TIMEOUT_S", help="longest one webhook delivery may take"
    )
    webhook_first_retry_s: float = _flag(
        5.0,
        env="GENQ_WEBHOOK_FIRST_RETRY_S",
        help="wait before a failed webhook delivery's first retry (then doubling, up to 10 min)",
    )
    webhook_retry_for_s: float = _flag(
        86_400.0,
        env="GENQ_WEBHOOK_RETRY_FOR_S",
        help="how long a webhook event is retried before it goes to the dead letters",
    )
    result_ttl_s: int = DEFAULT_RESULT_TTL_S
    """How long requests' states, batches and uploaded files are kept."""
    models_cache_s: float = 1.0
    """How long the list of served models (live workers) is reused before it is read again."""

    @classmethod
    def from_flags(cls, flags: Mapping[str, Any], environ: Mapping[str, str]) -> GatewaySettings:
        """The settings from ``genq serve``'s parsed flags (by field name); a repeated flag
        given no value takes its comma-separated environment twin from ``environ``."""
        values = dict(flags)
        for f in serve_flags():
            if f.name in values and f.type_ is tuple and not values[f.name]:
                values[f.name] = tuple(k for k in environ.get(f.env, "").split(",") if k)
        return cls(**values)


@dataclass(frozen=True)
class ServeFlag:
    """One ``genq serve`` flag, as ``GatewaySettings`` defines it."""

    name: str
    """The setting's field name."""
    flag: str
    env: str
    help: str
    type_: type
    """str, int, float, or tuple (a repeated flag of strings)."""
    default: Any


def serve_flags() -> list[ServeFlag]:
    """The flags of ``genq serve`` (``--redis-url`` and ``--queue`` are every command's)."""
    hints = typing.get_type_hints(GatewaySettings)
    out = []
    for f in fields(GatewaySettings):
        if "env" not in f.metadata:
            continue
        hint = hints[f.name]
        type_ = tuple if typing.get_origin(hint) is tuple else hint
        name = f.metadata["flag"] or "--" + f.name.replace("_", "-")
        out.append(ServeFlag(f.name, name, f.metadata["env"], f.metadata["help"], type_, f.default))
    return out


ENV = {f.name: f.env for f in serve_flags()}
"""The environment twin of each gateway setting."""
