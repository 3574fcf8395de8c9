"""``genq serve``: the OpenAI-compatible HTTP gateway (``genq.producer.gateway``) on uvicorn."""

from __future__ import annotations

from typing import Any

import click
from genq.common.errors import ConfigError
from genq.producer.commands.options import redis_options
from genq.producer.gateway.settings import GatewaySettings, serve_flags

LISTEN_BACKLOG = 16_384
"""Connections the kernel may hold for the gateway before it accepts them (capped by
``net.core.somaxconn``). uvicorn's 2,048 overflowed when thousands of clients connected at
once: the kernel dropped their SYNs, and those clients, and anyone connecting meanwhile (a
health probe), waited 1 s, then 3 s, to retry."""


def serve_options(func: Any) -> Any:
    """One option per flag setting of ``GatewaySettings`` (defaults, env twins and help come
    from there: written once)."""
    for f in reversed(serve_flags()):
        env = f"[env: {f.env}" + (", comma-separated]" if f.type_ is tuple else "]")
        if f.type_ is tuple:
            option = click.option(f.flag, f.name, multiple=True, help=f"{f.help} {env}")
        elif f.type_ is bool:
            option = click.option(
                f.flag,
                f.name,
                is_flag=True,
                envvar=f.env,
                default=f.default,
                help=f"{f.help} {env}",
            )
        else:
            option = click.option(
                f.flag,
                f.name,
                envvar=f.env,
                type=f.type_,
                default=f.default,
                show_default=True,
                help=f"{f.help} {env}",
            )
        func = option(func)
    return func


@click.command()
@redis_options
@serve_options
def serve(**flags: Any) -> None:
    """An OpenAI-compatible HTTP API in front of the queue: /v1/models, /v1/completions,
    /v1/chat/completions (streaming), /v1/files, /v1/batches. Stateless: run as many as you
    like. The dashboard is at /dashboard. Needs genq[serve]."""
    _run(flags, api=True)


@click.command()
@redis_options
@serve_options
def dashboard(**flags: Any) -> None:
    """The dashboard alone (genq serve has it too, at /dashboard): the queue, workers,
    tenants, batches, dead letters and requests, live in a browser. Bound to 127.0.0.1 by
    default; with --admin-key, only to that key. Needs genq[serve]."""
    _run(flags, api=False)


def _run(flags: dict[str, Any], *, api: bool) -> None:
    import os

    try:
        import uvicorn
        from genq.common.collector import settle_collector
        from genq.producer.gateway.app import create_app
    except ImportError as err:
        raise click.ClickException(
            f"this command needs the serve extra ({err}): pip install 'genq[serve]'"
        ) from None

    settings = GatewaySettings.from_flags(flags, os.environ)
    try:
        app = create_app(settings, api=api)
    except ConfigError as err:
        raise click.UsageError(str(err)) from None
    settle_collector()  # what start-up made stays out of the collector's passes
    where = f"http://{settings.host}:{settings.port}/dashboard"
    click.echo(f"genq: dashboard at {where}", err=True)
    uvicorn.run(
        app,
        host=settings.host,
        port=settings.port,
        log_level="info",
        access_log=False,
        backlog=LISTEN_BACKLOG,
    )
