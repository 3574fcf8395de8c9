"""The gateway's settings: each a ``genq serve`` flag with an environment twin."""

from __future__ import annotations

from dataclasses import dataclass, field

from genq.common.settings import DEFAULT_QUEUE, DEFAULT_REDIS_URL, DEFAULT_RESULT_TTL_S

ENV = {
    "host": "GENQ_SERVE_HOST",
    "port": "GENQ_SERVE_PORT",
    "api_keys": "GENQ_API_KEYS",
    "request_timeout_s": "GENQ_SERVE_REQUEST_TIMEOUT_S",
    "max_file_bytes": "GENQ_SERVE_MAX_FILE_BYTES",
}
"""The environment twin of each gateway setting (``GENQ_API_KEYS``: comma-separated)."""


@dataclass(frozen=True, kw_only=True)
class GatewaySettings:
    """What ``genq serve`` is told."""

    redis_url: str = DEFAULT_REDIS_URL
    queue: str = DEFAULT_QUEUE
    host: str = "127.0.0.1"
    port: int = 8000
    api_keys: tuple[str, ...] = field(default_factory=tuple)
    """Accepted ``Authorization: Bearer`` keys; none: no key needed."""
    request_timeout_s: float = 600.0
    """Longest a completion waits for its result; then it is cancelled and answered 504."""
    max_file_bytes: int = 50_000_000
    """Largest batch input file ``POST /v1/files`` takes (it is kept in Redis)."""
    result_ttl_s: int = DEFAULT_RESULT_TTL_S
    """How long requests' states, batches and uploaded files are kept."""
    models_cache_s: float = 1.0
    """How long the list of served models (live workers) is reused before it is read again."""
