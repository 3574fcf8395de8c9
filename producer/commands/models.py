"""``genq models list | default``: the queue's lanes (one per model requests name) and its
default model, whose workers answer requests that name none (``genq.common.keys``: lanes)."""

from __future__ import annotations

import json

import click
from genq.producer.commands.options import WIDE, redis_options


@click.group()
def models() -> None:
    """The models of a queue: what waits for each, who serves it, the default."""


@models.command("list")
@redis_options
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
def models_list(redis_url: str, queue: str, as_json: bool) -> None:
    """Each model's lane: requests waiting, live workers, running, tokens generated; a model
    that requests wait for and no live worker serves is marked; with pools of models, each
    model's oldest wait, holders, loaders, loads, evictions and load time; and each embedding
    model's inputs, tokens, repeats saved and rates."""
    from genq.common.connection import connect
    from genq.common.snapshot import collect
    from genq.producer.commands.stats import embeddings_table, models_table, pool_table
    from rich.console import Console

    with connect(redis_url) as r:
        rows = collect(r, queue)["models"]
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    console = Console(width=max(Console().width, WIDE))
    console.print(models_table(rows))
    for table in (pool_table(rows), embeddings_table(rows)):
        if table is not None:
            console.print(table)


@models.command("default")
@redis_options
@click.argument("name", required=False)
@click.option("--force", is_flag=True, help="change it even while requests wait for the old one")
def models_default(redis_url: str, queue: str, name: str | None, force: bool) -> None:
    """Print the queue's default model, or make NAME the default: requests that name no model
    (or the default) wait for its workers. Workers look when they start: restart those of the
    old and the new default. Refused while requests wait in the unnamed lane (the old
    default's, some naming it), unless --force."""
    from genq.common.connection import connect
    from genq.common.keys import DEFAULT_MODEL_FIELD, Keys
    from genq.common.models import model_problem
    from genq.common.wire import as_text

    keys = Keys(queue)
    with connect(redis_url) as r:
        if name is None:
            current = r.hget(keys.config, DEFAULT_MODEL_FIELD)
            click.echo("-" if current is None else as_text(current))
            return
        problem = model_problem(name)
        if problem is not None:
            raise click.BadParameter(problem, param_hint="NAME")
        old = r.hget(keys.config, DEFAULT_MODEL_FIELD)
        waiting = sum(int(r.xlen(s)) for s in keys.streams())
        if old is not None and as_text(old) != name and waiting and not force:
            raise click.ClickException(
                f"{waiting} requests wait in the unnamed lane for {as_text(old)!r} (some may name "
                "it): let them drain first, or --force"
            )
        r.hset(keys.config, DEFAULT_MODEL_FIELD, name)
    click.echo(
        f"requests on queue {queue!r} that name no model (or {name!r}) now wait for {name!r}: "
        "restart the workers of the old and the new default"
    )
