"""What every route of the gateway uses: the ``Gateway`` (settings, clients, fleet, keys), and
who sent a request (``Caller``: its API key's tenant, or an admin), checked by ``check_key``."""

from __future__ import annotations

import hmac
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from fastapi import Request
from genq.common.models import DEFAULT_TENANT, Result
from genq.producer.aio import AsyncClient
from genq.producer.client import Client
from genq.producer.gateway.file_store import FileStore, default_files_dir
from genq.producer.gateway.fleet import Fleet
from genq.producer.gateway.in_flight import InFlight
from genq.producer.gateway.openai_errors import ApiError
from genq.producer.gateway.quotas import Limits, Quotas
from genq.producer.gateway.redis_room import RedisRoom
from genq.producer.gateway.result_hub import ResultHub
from genq.producer.gateway.settings import OPERATOR_TENANT, GatewaySettings, key_tenants
from genq.producer.gateway.submitter import Submitter


@dataclass(frozen=True)
class Caller:
    """Who sent an HTTP request, by its API key: the tenant its submissions belong to, and
    whether it sees every tenant (an admin key, or a gateway with no keys at all)."""

    tenant: str
    admin: bool

    @property
    def scope(self) -> str | None:
        """The one tenant whose things this caller sees (None: every tenant's)."""
        return None if self.admin else self.tenant

    def sees(self, tenant: str | None) -> bool:
        """Whether this caller may see (read, list, cancel, delete) what ``tenant`` owns
        (None: a record from before tenants, which is tenant ``default``)."""
        return self.admin or (tenant or DEFAULT_TENANT) == self.tenant


OPEN = Caller(DEFAULT_TENANT, admin=True)
"""The caller of a gateway with no keys configured."""
OPERATOR = Caller(OPERATOR_TENANT, admin=True)
"""The caller of an ``--admin-key``: sees every tenant, and what it submits is the reserved
tenant ``operators`` (not ``default``, which a bare ``--api-key`` stands for: a bare key must
not read or delete an operator's files and responses)."""


@dataclass
class Gateway:
    """What every route uses: the settings, an asyncio client for completions, a plain one for
    batches and files (run in threads: they are not on the hot path), the fleet's models."""

    settings: GatewaySettings
    client: AsyncClient
    sync_client: Client
    fleet: Fleet
    keys: dict[str, Caller]
    """Every accepted key, and who it stands for."""
    hub: ResultHub | None
    """The readers that wait for results (None on a Redis Cluster: the client polls)."""
    in_flight: InFlight = field(init=False)
    submitter: Submitter = field(init=False)
    """Completions' and responses' submissions, gathered per turn of the event loop."""
    quotas: Quotas = field(init=False)
    """What each tenant may keep: files, batches, stored responses."""
    room: RedisRoom = field(init=False)
    """Whether Redis has room for a batch's requests (below its share of maxmemory)."""
    files: FileStore = field(init=False)
    """Where uploaded batch files' bytes are (``--files-dir``)."""

    def __post_init__(self) -> None:
        s = self.settings
        self.in_flight = InFlight(s.max_in_flight, s.max_in_flight_per_tenant)
        self.submitter = Submitter(self.client)
        defaults = Limits(
            files=s.tenant_max_files,
            stored_bytes=s.tenant_max_stored_bytes,
            batches=s.tenant_max_batches,
            responses=s.tenant_max_responses,
        )
        self.quotas = Quotas(self.client.redis, self.client.keys, defaults, s.result_ttl_s)
        self.room = RedisRoom(self.client.redis, s.storage_max_redis_fraction)
        self.files = file_store(s)

    def follow(self, request_id: str) -> AsyncIterator[str | Result]:
        """A request's text pieces as they come, then its Result (within the request timeout:
        ResultTimeout after)."""
        timeout_s = self.settings.request_timeout_s
        if self.hub is None:
            return self.client.stream(request_id, timeout=timeout_s)
        return self.hub.follow(request_id, timeout_s)

    async def result(self, request_id: str) -> Result:
        """A request's final Result (within the request timeout: ResultTimeout after)."""
        timeout_s = self.settings.request_timeout_s
        if self.hub is None:
            return await self.client.result(request_id, timeout=timeout_s)
        return await self.hub.result(request_id, timeout_s)

    def enter(self, caller: Caller) -> None:
        """Count one more completion or response of ``caller`` in flight, or raise 429 (with
        Retry-After) if that passes a limit. Every ``enter`` has its ``leave``."""
        refusal = self.in_flight.enter(caller.tenant)
        if refusal is not None:
            raise ApiError(
                429,
                refusal.message(caller.tenant),
                type_="rate_limit_error",
                code="too_many_in_flight",
                headers={"Retry-After": "1"},
            )

    def leave(self, caller: Caller) -> None:
        self.in_flight.leave(caller.tenant)


def file_store(settings: GatewaySettings) -> FileStore:
    """The gateway's file store (``--files-dir``, or the default directory)."""
    return FileStore(settings.files_dir or default_files_dir(), timeout_s=settings.files_timeout_s)


def gateway(request: Request) -> Gateway:
    """The app's Gateway (a FastAPI dependency)."""
    gw: Gateway = request.app.state.gateway
    return gw


def callers(settings: GatewaySettings) -> dict[str, Caller]:
    """Every accepted key and who it stands for (raises ConfigError on a bad ``--api-key``)."""
    keys = {k: Caller(t, admin=False) for k, t in key_tenants(settings.api_keys).items()}
    return {**keys, **{k: OPERATOR for k in settings.admin_keys}}


async def check_key(request: Request) -> None:
    """401 unless the request carries one of the configured keys (none configured: open);
    the caller it stands for goes to ``request.state.caller``."""
    keys: dict[str, Caller] = request.app.state.gateway.keys
    request.state.caller = OPEN
    path = request.scope["path"]
    if not keys or path == "/health":  # a load balancer's probe needs no key
        return
    if path.startswith("/dashboard"):  # its own check: admin keys, or a cookie
        return
    header = request.headers.get("authorization", "")
    given = (header[7:].strip() if header.lower().startswith("bearer ") else "").encode()
    # Every key is compared (in constant time each): how long it takes says nothing of which.
    found = [c for k, c in keys.items() if hmac.compare_digest(given, k.encode())]
    if not found:
        raise ApiError(
            401,
            "Incorrect API key provided: pass one of genq serve's --api-key values as "
            "'Authorization: Bearer KEY'",
            type_="invalid_request_error",
            code="invalid_api_key",
        )
    request.state.caller = found[0]


def caller(request: Request) -> Caller:
    """Who sent ``request`` (set by ``check_key``)."""
    who: Caller = request.state.caller
    return who
