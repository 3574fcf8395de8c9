"""``genq functions load | code``: genq's Redis Functions library (FCALL genq_submit, ...)."""

from __future__ import annotations

import click
from genq.producer.commands.options import redis_options


@click.group()
def functions() -> None:
    """genq's Redis Functions library, for clients in other languages."""


@functions.command("load")
@redis_options
def functions_load(redis_url: str, queue: str) -> None:
    """Load (or replace) the library; on a Redis Cluster, on every primary. Workers also load
    it when they start."""
    from genq.common import functions as library
    from genq.common.connection import connect

    r = connect(redis_url)
    try:
        library.load(r)
    finally:
        r.close()
    click.echo(f"loaded the {library.LIBRARY} library, version {library.VERSION}")


@functions.command("code")
def functions_code() -> None:
    """Print the library's Lua source, for FUNCTION LOAD REPLACE by hand (redis-cli -x)."""
    from genq.common import functions as library

    click.echo(library.library_code(), nl=False)
