"""``genq serve``: the OpenAI-compatible HTTP gateway (``genq.producer.gateway``) on uvicorn."""

from __future__ import annotations

import click
from genq.common.errors import ConfigError
from genq.producer.gateway.settings import ENV, GatewaySettings
from genq.worker.commands.options import redis_options

_DEFAULTS = GatewaySettings()


@click.command()
@redis_options
@click.option(
    "--host",
    envvar=ENV["host"],
    default=_DEFAULTS.host,
    show_default=True,
    help=f"interface to listen on [env: {ENV['host']}]",
)
@click.option(
    "--port",
    envvar=ENV["port"],
    type=int,
    default=_DEFAULTS.port,
    show_default=True,
    help=f"TCP port [env: {ENV['port']}]",
)
@click.option(
    "--api-key",
    "api_keys",
    multiple=True,
    help="accepted 'Authorization: Bearer' key, as KEY=TENANT (a bare KEY: tenant default): "
    "the key's requests belong to TENANT and it sees only TENANT's files and batches; repeat "
    f"for several [env: {ENV['api_keys']}, comma-separated]; none: no key needed",
)
@click.option(
    "--admin-key",
    "admin_keys",
    multiple=True,
    help="a key that sees every tenant's files and batches (operators); repeat for several "
    f"[env: {ENV['admin_keys']}, comma-separated]",
)
@click.option(
    "--request-timeout-s",
    envvar=ENV["request_timeout_s"],
    type=float,
    default=_DEFAULTS.request_timeout_s,
    show_default=True,
    help="longest a completion waits for its result; then it is cancelled (504) "
    f"[env: {ENV['request_timeout_s']}]",
)
@click.option(
    "--max-file-bytes",
    envvar=ENV["max_file_bytes"],
    type=int,
    default=_DEFAULTS.max_file_bytes,
    show_default=True,
    help=f"largest batch input file POST /v1/files takes [env: {ENV['max_file_bytes']}]",
)
def serve(
    redis_url: str,
    queue: str,
    host: str,
    port: int,
    api_keys: tuple[str, ...],
    admin_keys: tuple[str, ...],
    request_timeout_s: float,
    max_file_bytes: int,
) -> None:
    """An OpenAI-compatible HTTP API in front of the queue: /v1/models, /v1/completions,
    /v1/chat/completions (streaming), /v1/files, /v1/batches. Stateless: run as many as you
    like. Needs genq[serve]."""
    import os

    try:
        import uvicorn
        from genq.producer.gateway.app import create_app
    except ImportError as err:
        raise click.ClickException(
            f"genq serve needs the serve extra ({err}): pip install 'genq[serve]'"
        ) from None

    def listed(given: tuple[str, ...], env: str) -> tuple[str, ...]:
        return given or tuple(k for k in os.environ.get(ENV[env], "").split(",") if k)

    settings = GatewaySettings(
        redis_url=redis_url,
        queue=queue,
        host=host,
        port=port,
        api_keys=listed(api_keys, "api_keys"),
        admin_keys=listed(admin_keys, "admin_keys"),
        request_timeout_s=request_timeout_s,
        max_file_bytes=max_file_bytes,
    )
    try:
        app = create_app(settings)
    except ConfigError as err:
        raise click.UsageError(str(err)) from None
    uvicorn.run(app, host=host, port=port, log_level="info", access_log=False)
