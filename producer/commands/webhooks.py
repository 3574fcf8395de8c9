"""``genq webhooks list | retry``: webhook deliveries that gave up (the dead letters)."""

from __future__ import annotations

import dataclasses
import json

import click
from genq.producer.commands.options import redis_options
from rich.console import Console
from rich.table import Table


@click.group()
def webhooks() -> None:
    """Webhook deliveries that gave up after --webhook-retry-for-s (genq serve)."""


@webhooks.command("list")
@redis_options
@click.option("--count", type=int, default=100, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
def webhooks_list(redis_url: str, queue: str, count: int, as_json: bool) -> None:
    """Show the oldest dead letters: event, endpoint, last error."""
    from genq.common.connection import connect
    from genq.common.keys import Keys
    from genq.producer.gateway.webhook_letters import list_dead

    with connect(redis_url) as r:
        found = list_dead(r, Keys(queue), count)
    if as_json:
        click.echo(json.dumps([dataclasses.asdict(d) for d in found], indent=2))
        return
    t = Table(title=f"webhook dead letters of queue {queue!r}: {len(found)} shown")
    for col in ("dead id", "event", "type", "object", "endpoint", "tries", "error"):
        t.add_column(col)
    for d in found:
        tries = str(d.deliveries)
        t.add_row(d.dead_id, d.webhook_id, d.type, d.object_id, d.endpoint, tries, d.error)
    Console().print(t)


@webhooks.command("retry")
@redis_options
@click.argument("dead_ids", nargs=-1)
@click.option("--all", "retry_all", is_flag=True, help="every dead letter")
def webhooks_retry(redis_url: str, queue: str, dead_ids: tuple[str, ...], retry_all: bool) -> None:
    """Send dead letters (DEAD_IDS, or --all) again, each to its endpoint, same webhook-id."""
    from genq.common.connection import connect
    from genq.common.keys import Keys
    from genq.producer.gateway.webhook_letters import retry_dead

    if not dead_ids and not retry_all:
        raise click.UsageError("name the dead letters to send again, or pass --all")
    with connect(redis_url) as r:
        sent = retry_dead(r, Keys(queue), None if retry_all else list(dead_ids))
    click.echo(f"sent {len(sent)} webhook events again")
