"""``genq batch submit | status | results | cancel``: OpenAI Batch API files."""

from __future__ import annotations

import json

import click
from genq.common.errors import GenqError
from genq.common.models import DEFAULT_PRIORITY
from genq.worker.commands.options import PRIORITY_CHOICE, redis_options
from rich.console import Console


@click.group()
def batch() -> None:
    """OpenAI Batch API files: submit, status, results, cancel."""


@batch.command("submit")
@redis_options
@click.argument("path", type=click.Path(exists=True, dir_okay=False, allow_dash=True))
@click.option("--priority", type=PRIORITY_CHOICE, default=DEFAULT_PRIORITY)
@click.option("--batch-id", default=None, help="reuse a batch id: its lines are not enqueued twice")
def batch_submit(
    redis_url: str, queue: str, path: str, priority: str, batch_id: str | None
) -> None:
    """Submit an OpenAI batch input file (JSON Lines); print the batch id. Invalid lines are
    reported with their numbers and skipped."""
    import os

    from genq.producer import Client
    from genq.producer.batches import new_batch_id, parse_file, record_batch
    from genq.producer.submitting import SUBMIT_CHUNK
    from rich.progress import Progress

    bid = batch_id or new_batch_id()
    with click.open_file(path, encoding="utf-8") as f:
        good, bad = parse_file(f, bid, priority)
    err = Console(stderr=True)
    for e in bad:
        err.print(f"line {e.line}: {e.message}", markup=False)
    with Client.from_url(redis_url, queue) as client, Progress(console=err) as progress:
        record_batch(client, bid, good, os.path.basename(path))
        task = progress.add_task("submitting", total=len(good))
        try:
            for start in range(0, len(good), SUBMIT_CHUNK):
                part = [item.request for item in good[start : start + SUBMIT_CHUNK]]
                client.submit_requests(part)
                progress.advance(task, len(part))
        except GenqError as e:
            raise click.ClickException(f"{e} (batch {bid})") from None
    click.echo(
        json.dumps({"id": bid, "submitted": len(good), "invalid_lines": [e.line for e in bad]})
    )


@batch.command("status")
@redis_options
@click.argument("batch_id")
def batch_status_cmd(redis_url: str, queue: str, batch_id: str) -> None:
    """OpenAI-style status of a batch: status and request counts, as JSON."""
    from genq.producer import Client
    from genq.producer.batches import batch_status

    with Client.from_url(redis_url, queue) as client:
        try:
            click.echo(json.dumps(batch_status(client, batch_id), indent=2))
        except GenqError as e:
            raise click.ClickException(str(e)) from None


@batch.command("results")
@redis_options
@click.argument("batch_id")
@click.option(
    "-o",
    "--output",
    "output",
    type=click.Path(dir_okay=False, writable=True),
    required=True,
    help="OpenAI-style output lines, keyed by custom_id",
)
@click.option(
    "--errors",
    "errors",
    type=click.Path(dir_okay=False, writable=True),
    default=None,
    help="failed, expired and cancelled ones go here instead",
)
@click.option("--timeout-s", type=float, default=None, help="give up waiting after this long")
def batch_results(
    redis_url: str,
    queue: str,
    batch_id: str,
    output: str,
    errors: str | None,
    timeout_s: float | None,
) -> None:
    """Wait for a batch and write its results (in input order)."""
    import contextlib

    from genq.producer import Client
    from genq.producer.batches import output_lines

    ok = bad = 0
    with contextlib.ExitStack() as stack, Client.from_url(redis_url, queue) as client:
        out = stack.enter_context(open(output, "w", encoding="utf-8"))
        err = stack.enter_context(open(errors, "w", encoding="utf-8")) if errors else out
        try:
            for succeeded, line in output_lines(client, batch_id, timeout_s):
                (out if succeeded else err).write(json.dumps(line) + "\n")
                ok, bad = ok + succeeded, bad + (not succeeded)
        except GenqError as e:
            raise click.ClickException(str(e)) from None
    click.echo(json.dumps({"id": batch_id, "completed": ok, "failed": bad}))


@batch.command("cancel")
@redis_options
@click.argument("batch_id")
def batch_cancel(redis_url: str, queue: str, batch_id: str) -> None:
    """Cancel every request of the batch that has not finished."""
    from genq.producer import Client
    from genq.producer.batches import cancel_batch

    with Client.from_url(redis_url, queue) as client:
        try:
            n = cancel_batch(client, batch_id)
        except GenqError as e:
            raise click.ClickException(str(e)) from None
    click.echo(json.dumps({"id": batch_id, "cancelled": n}))
