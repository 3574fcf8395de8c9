"""``genq tenants set | list | delete``: each tenant's weight, limits and webhook, kept in
Redis and seen by every worker and gateway of the queue without a restart."""

from __future__ import annotations

import json
import sys

import click
from genq.common.errors import ConfigError
from genq.producer.commands.options import redis_options
from rich.console import Console
from rich.table import Table


@click.group()
def tenants() -> None:
    """Tenants' weights and limits (a tenant with none set: weight 1, no limits)."""


@tenants.command("set")
@redis_options
@click.argument("name")
@click.option("--weight", type=float, default=None, help="share against other tenants (> 0)")
@click.option(
    "--tokens-per-minute", type=int, default=None, help="most tokens served in any 60 s (0: none)"
)
@click.option("--max-queued", type=int, default=None, help="most requests waiting (0: no limit)")
@click.option("--max-files", type=int, default=None, help="most uploaded files kept (0: default)")
@click.option(
    "--max-stored-bytes", type=int, default=None, help="most bytes of files kept (0: default)"
)
@click.option("--max-batches", type=int, default=None, help="most batches kept (0: default)")
@click.option(
    "--max-responses", type=int, default=None, help="most stored responses kept (0: default)"
)
@click.option(
    "--max-priority",
    type=click.Choice(["high", "normal", "low", "any"]),
    default=None,
    help="the highest priority NAME's requests may have (above it: refused); any: no limit",
)
@click.option("--webhook-url", default=None, help="where NAME's webhook events go too ('': none)")
@click.option(
    "--webhook-secret",
    default=None,
    envvar="GENQ_TENANT_WEBHOOK_SECRET",
    help="whsec_... secret that signs them; '-' reads it from stdin (a flag shows in ps)",
)
@click.option(
    "--share-prefixes/--no-share-prefixes",
    default=None,
    help="let NAME's prompts share cached prefixes with other sharing tenants (default: not)",
)
def tenants_set(
    redis_url: str,
    queue: str,
    name: str,
    weight: float | None,
    tokens_per_minute: int | None,
    max_queued: int | None,
    max_files: int | None,
    max_stored_bytes: int | None,
    max_batches: int | None,
    max_responses: int | None,
    max_priority: str | None,
    webhook_url: str | None,
    webhook_secret: str | None,
    share_prefixes: bool | None,
) -> None:
    """Set NAME's weight, limits and webhook (those not given keep their values); print them
    all (the webhook secret only as set)."""
    from genq.common import tenants as registry
    from genq.common.connection import connect
    from genq.common.keys import Keys

    if webhook_secret == "-":
        webhook_secret = sys.stdin.readline().strip()
    with connect(redis_url) as r:
        try:
            settings = registry.update(
                r,
                Keys(queue),
                name,
                weight=weight,
                tokens_per_minute=tokens_per_minute,
                max_queued=max_queued,
                max_files=max_files,
                max_stored_bytes=max_stored_bytes,
                max_batches=max_batches,
                max_responses=max_responses,
                max_priority=None if max_priority is None else max_priority.replace("any", ""),
                webhook_url=webhook_url,
                webhook_secret=webhook_secret,
                share_prefixes=share_prefixes,
            )
        except ConfigError as err:
            raise click.UsageError(f"tenant {name!r}: {err}") from None
    click.echo(json.dumps({"name": name, **settings.public()}))


@tenants.command("list")
@redis_options
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
def tenants_list(redis_url: str, queue: str, as_json: bool) -> None:
    """Every tenant with settings of its own (all others: weight 1, no limits)."""
    from genq.common import tenants as registry
    from genq.common.connection import connect
    from genq.common.keys import Keys

    with connect(redis_url) as r:
        found = registry.read_all(r, Keys(queue))
    rows = [{"name": n, **s.public()} for n, s in sorted(found.items())]
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    t = Table(title=f"tenants of queue {queue!r} (others: weight 1, no limits)")
    for col in ("tenant", "weight", "tokens/min", "max queued", "webhook"):
        t.add_column(col, justify="left" if col == "tenant" else "right")
    for row in rows:
        limits = [str(row[k]) if row[k] else "-" for k in ("tokens_per_minute", "max_queued")]
        t.add_row(row["name"], f"{row['weight']:g}", *limits, row["webhook_url"] or "-")
    Console().print(t)


@tenants.command("delete")
@redis_options
@click.argument("name")
def tenants_delete(redis_url: str, queue: str, name: str) -> None:
    """Put NAME back to the defaults (weight 1, no limits)."""
    from genq.common import tenants as registry
    from genq.common.connection import connect
    from genq.common.keys import Keys

    with connect(redis_url) as r:
        try:
            had = registry.delete(r, Keys(queue), name)
        except ConfigError as err:
            raise click.UsageError(str(err)) from None
    click.echo(f"tenant {name!r}: " + ("back to the defaults" if had else "had no settings"))
