"""The gateway's settings: each a ``genq serve`` flag with an environment twin."""

from __future__ import annotations

from dataclasses import dataclass, field

from genq.common.errors import ConfigError
from genq.common.models import DEFAULT_TENANT, tenant_problem
from genq.common.settings import DEFAULT_QUEUE, DEFAULT_REDIS_URL, DEFAULT_RESULT_TTL_S

ENV = {
    "host": "GENQ_SERVE_HOST",
    "port": "GENQ_SERVE_PORT",
    "api_keys": "GENQ_API_KEYS",
    "admin_keys": "GENQ_ADMIN_KEYS",
    "request_timeout_s": "GENQ_SERVE_REQUEST_TIMEOUT_S",
    "max_file_bytes": "GENQ_SERVE_MAX_FILE_BYTES",
}
"""The environment twin of each gateway setting (``GENQ_API_KEYS``, ``GENQ_ADMIN_KEYS``:
comma-separated)."""


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
        out[key] = tenant
    return out


@dataclass(frozen=True, kw_only=True)
class GatewaySettings:
    """What ``genq serve`` is told."""

    redis_url: str = DEFAULT_REDIS_URL
    queue: str = DEFAULT_QUEUE
    host: str = "127.0.0.1"
    port: int = 8000
    api_keys: tuple[str, ...] = field(default_factory=tuple)
    """Accepted ``Authorization: Bearer`` keys, each ``KEY=TENANT`` (a bare ``KEY``: tenant
    ``default``): a key's requests belong to its tenant, and it sees only that tenant's
    requests, files and batches. No keys at all (and no admin keys): no key needed, everything
    is tenant ``default`` and every caller sees everything."""
    admin_keys: tuple[str, ...] = field(default_factory=tuple)
    """Keys that see every tenant's files and batches (operators, the dashboard); what they
    submit is tenant ``default``."""
    request_timeout_s: float = 600.0
    """Longest a completion waits for its result; then it is cancelled and answered 504."""
    max_file_bytes: int = 50_000_000
    """Largest batch input file ``POST /v1/files`` takes (it is kept in Redis)."""
    result_ttl_s: int = DEFAULT_RESULT_TTL_S
    """How long requests' states, batches and uploaded files are kept."""
    models_cache_s: float = 1.0
    """How long the list of served models (live workers) is reused before it is read again."""
