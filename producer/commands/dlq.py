"""``genq dlq list | retry | purge``: the dead-letter stream."""

from __future__ import annotations

import json

import click
from genq.producer.commands.options import redis_options
from rich.console import Console
from rich.table import Table


@click.group()
def dlq() -> None:
    """The dead-letter stream: entries with no usable id, and poison requests."""


@dlq.command("list")
@redis_options
@click.option("--count", type=int, default=100, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
def dlq_list(redis_url: str, queue: str, count: int, as_json: bool) -> None:
    """Show the oldest dead-letter entries, with why each is there."""
    import dataclasses

    from genq.common.connection import connect
    from genq.common.keys import Keys
    from genq.producer.gateway.dead_letters import list_dead

    with connect(redis_url) as r:
        entries = list_dead(r, Keys(queue), count)
    if as_json:
        click.echo(json.dumps([dataclasses.asdict(e) for e in entries], indent=2))
        return
    t = Table(title=f"dead letters of queue {queue!r}: {len(entries)} shown")
    for col in ("dlq id", "request id", "stream", "error"):
        t.add_column(col)
    for e in entries:
        t.add_row(e.dlq_id, e.request_id or "-", e.stream, e.error)
    Console().print(t)


@dlq.command("retry")
@redis_options
@click.argument("dlq_ids", nargs=-1)
@click.option("--all", "retry_all", is_flag=True, help="every dead-letter entry")
@click.option("--result-ttl-s", type=int, default=None, help="TTL of the reset queued state")
def dlq_retry(
    redis_url: str, queue: str, dlq_ids: tuple[str, ...], retry_all: bool, result_ttl_s: int | None
) -> None:
    """Put dead-letter entries (DLQ_IDS, or --all) back into their work streams."""
    from genq.common.connection import connect
    from genq.common.keys import Keys
    from genq.common.settings import DEFAULT_RESULT_TTL_S
    from genq.producer.gateway.dead_letters import retry_dead

    if not dlq_ids and not retry_all:
        raise click.UsageError("name the dead-letter entries to retry, or pass --all")
    with connect(redis_url) as r:
        ids = retry_dead(
            r,
            Keys(queue),
            None if retry_all else list(dlq_ids),
            result_ttl_s or DEFAULT_RESULT_TTL_S,
        )
    click.echo(f"retried {len(ids)} entries")


@dlq.command("purge")
@redis_options
@click.option("--yes", is_flag=True, help="do not ask")
def dlq_purge(redis_url: str, queue: str, yes: bool) -> None:
    """Delete every dead-letter entry of the queue."""
    from genq.common.connection import connect
    from genq.common.keys import Keys
    from genq.producer.gateway.dead_letters import purge_dead

    if not yes:
        click.confirm(f"delete every dead-letter entry of queue {queue!r}?", abort=True)
    with connect(redis_url) as r:
        n = purge_dead(r, Keys(queue))
    click.echo(f"purged {n} entries")
