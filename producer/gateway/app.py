"""The gateway's ASGI app: its Redis clients, the API-key check, its routes."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import Depends, FastAPI, Request
from genq.common import webhooks
from genq.common.connection import cluster_url, is_cluster
from genq.common.errors import ConfigError
from genq.producer.aio import AsyncClient
from genq.producer.client import Client
from genq.producer.gateway import (
    batch_routes,
    completions,
    dashboard_routes,
    embeddings,
    files,
    openai_errors,
    responses_routes,
    scores,
)
from genq.producer.gateway.batch_runner import BatchRunner
from genq.producer.gateway.body_limit import BodyLimit, limit_for
from genq.producer.gateway.context import Gateway, callers, check_key, file_store, gateway
from genq.producer.gateway.file_store import StoreError
from genq.producer.gateway.fleet import Fleet
from genq.producer.gateway.guards import Guards, is_loopback
from genq.producer.gateway.result_hub import ResultHub
from genq.producer.gateway.settings import GatewaySettings
from genq.producer.gateway.webhook_delivery import Deliverer
from starlette.concurrency import run_in_threadpool

POOL_WAIT_S = 20.0
"""Longest a route waits for a free connection of the shared pool (then 503)."""


def _model(gw: Gateway, model: str) -> dict[str, Any]:
    """OpenAI's model object."""
    return {
        "id": model,
        "object": "model",
        "created": gw.fleet.created(model),
        "owned_by": "genq",
        "kind": gw.fleet.kind(model),  # genq's: generation or embedding (not OpenAI's)
    }


def shared_pool(settings: GatewaySettings) -> dict[str, Any]:
    """redis-py options of the connections the routes share: at most ``redis_connections``,
    and a route that finds none free waits for one (up to ``POOL_WAIT_S``) instead of failing
    at once (a pool limit must never become one tenant's 503 because of another's load)."""
    if cluster_url(settings.redis_url) is not None:
        return {}
    return {"max_connections": settings.redis_connections, "pool_wait_s": POOL_WAIT_S}


def _is_open(settings: GatewaySettings, keys: dict[str, Any]) -> bool:
    """Whether the gateway is open (no keys, and no ``--insecure-open``): then it must bind
    loopback (ConfigError otherwise) and answer loopback host names only."""
    open_gateway = not keys and not settings.insecure_open
    if open_gateway and not is_loopback(settings.host):
        raise ConfigError(
            f"genq serve --host {settings.host} with no --api-key or --admin-key would let "
            "anyone who reaches it use the fleet and see every tenant's work: give keys, bind "
            "127.0.0.1, or pass --insecure-open if your own authentication stands in front"
        )
    return open_gateway


def _gateway(settings: GatewaySettings, keys: dict[str, Any]) -> Gateway:
    """What the routes share: the clients (the async one's pool bounded), the fleet, the
    result readers (none on a Redis Cluster)."""
    client = AsyncClient.from_url(
        settings.redis_url,
        settings.queue,
        result_ttl_s=settings.result_ttl_s,
        **shared_pool(settings),
    )
    sync_client = Client.from_url(
        settings.redis_url, settings.queue, result_ttl_s=settings.result_ttl_s
    )
    fleet = Fleet(client.redis, client.keys, settings.models_cache_s)
    hub = (
        None
        if is_cluster(client.redis)
        else ResultHub(settings.redis_url, client.keys, client.redis)
    )
    return Gateway(settings, client, sync_client, fleet, keys, hub)


@asynccontextmanager
async def _background(gw: Gateway, api: bool) -> AsyncIterator[None]:
    """The gateway's own work while it serves (``api``: not ``genq dashboard``'s): webhook
    deliveries, and the rounds of the queue's running batches."""
    deliverer = Deliverer(gw.client.redis, gw.client.keys, gw.settings)
    runner = BatchRunner(gw.sync_client, gw.files, gw.client.redis)
    tasks = [asyncio.create_task(deliverer.run()), asyncio.create_task(runner.run())] if api else []
    try:
        yield
    finally:
        for task in tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if api:  # another gateway takes this one's batches at once
            with contextlib.suppress(Exception):
                await run_in_threadpool(runner.release)
        await deliverer.close()


def create_app(settings: GatewaySettings, *, api: bool = True) -> FastAPI:
    """The OpenAI-compatible app for ``settings.queue``, with its dashboard. Raises ConfigError
    for a bad ``--api-key``. ``api=False``: the dashboard alone (``genq dashboard``: no
    OpenAI routes, no webhook deliveries)."""
    keys = callers(settings)
    open_gateway = _is_open(settings, keys)
    try:  # a bad file store (an unknown URL scheme, a directory it may not make): one line
        _ = file_store(settings).store
    except StoreError as err:
        raise ConfigError(f"--files-dir: {err}") from None
    if settings.webhook_url or settings.webhook_secret:  # a bad one: one line at start
        webhooks.endpoint(webhooks.GLOBAL_ENDPOINT, settings.webhook_url, settings.webhook_secret)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        gw = app.state.gateway = _gateway(settings, keys)
        try:
            async with _background(gw, api):
                yield
        finally:
            await gw.submitter.close()
            if gw.hub is not None:
                await gw.hub.close()
            await gw.client.close()
            gw.sync_client.close()

    app = FastAPI(
        title="genq",
        summary="OpenAI-compatible gateway to a genq queue",
        lifespan=lifespan,
        dependencies=[Depends(check_key)],
        openapi_url=None,  # no schema or docs pages for anyone who knocks: the docs site has them
        docs_url=None,
        redoc_url=None,
    )
    openai_errors.install(app)
    app.add_middleware(BodyLimit, limit=limit_for(settings.max_body_bytes, settings.max_file_bytes))
    app.add_middleware(Guards, open_gateway=open_gateway)  # outermost: before anything reads
    dashboard_routes.install(app)

    @app.get("/health")
    async def health(request: Request) -> dict[str, Any]:
        gw = gateway(request)
        await gw.client.redis.ping()
        return {"status": "ok", "queue": settings.queue, "models": await gw.fleet.models()}

    if not api:
        return app
    for module in (completions, embeddings, scores, responses_routes, files, batch_routes):
        app.include_router(module.router)

    @app.get("/v1/models")
    async def list_models(request: Request) -> dict[str, Any]:
        gw = gateway(request)
        models = await gw.fleet.models()
        return {"object": "list", "data": [_model(gw, m) for m in sorted(models)]}

    @app.get("/v1/models/{model}")
    async def get_model(model: str, request: Request) -> dict[str, Any]:
        gw = gateway(request)
        if model not in await gw.fleet.models():
            raise openai_errors.not_found(
                f"no live worker serves model {model!r}", "model_not_found"
            )
        return _model(gw, model)

    return app
