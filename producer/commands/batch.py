"""``genq batch submit | status | results | cancel``: OpenAI Batch API files."""

from __future__ import annotations

import json

import click
from genq.common.errors import GenqError
from genq.common.models import DEFAULT_PRIORITY
from genq.producer.commands.options import PRIORITY_CHOICE, redis_options, tenant_option
from genq.producer.gateway.batch_lines import ENDPOINTS
from rich.console import Console


@click.group()
def batch() -> None:
    """OpenAI Batch API files: submit, status, results, cancel."""


@batch.command("submit")
@redis_options
@click.argument("path", type=click.Path(exists=True, dir_okay=False, allow_dash=True))
@click.option("--priority", type=PRIORITY_CHOICE, default=DEFAULT_PRIORITY)
@tenant_option
@click.option("--batch-id", default=None, help="reuse a batch id: its lines are not enqueued twice")
@click.option(
    "--endpoint",
    type=click.Choice(sorted(ENDPOINTS)),
    default=None,
    help="refuse lines for any other url (OpenAI: one endpoint per batch)",
)
def batch_submit(
    redis_url: str,
    queue: str,
    path: str,
    priority: str,
    tenant: str,
    batch_id: str | None,
    endpoint: str | None,
) -> None:
    """Submit an OpenAI batch input file (JSON Lines) and print the batch id (only that, on
    stdout). Invalid lines are reported on stderr with their numbers, skipped, and appear in
    the batch's error file."""
    import os

    from genq.producer import Client
    from genq.producer.gateway.batches import submit_batch
    from rich.progress import Progress

    err = Console(stderr=True)
    with (
        click.open_file(path, encoding="utf-8") as f,
        Client.from_url(redis_url, queue) as client,
        Progress(console=err, transient=True) as progress,
    ):
        task = progress.add_task("submitting", total=None)
        try:
            done = submit_batch(
                client,
                f,
                source=os.path.basename(path),
                batch_id=batch_id,
                priority=priority,
                tenant=tenant,
                endpoint=endpoint,
                progress=lambda n, total: progress.update(task, completed=n, total=total),
            )
        except GenqError as e:
            raise click.ClickException(f"{e} (batch {batch_id or 'not created'})") from None
    for bad in done.rejected:
        err.print(f"line {bad.line}: {bad.message}", markup=False)
    err.print(f"batch {done.id}: {done.submitted} submitted, {len(done.rejected)} refused")
    click.echo(done.id)


@batch.command("status")
@redis_options
@click.argument("batch_id")
def batch_status_cmd(redis_url: str, queue: str, batch_id: str) -> None:
    """The batch as OpenAI's Batch object (status, request_counts, ...), as JSON."""
    from genq.producer import Client
    from genq.producer.gateway.batches import batch_status

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
    help="failed, expired, cancelled and refused ones go here instead",
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
    """Wait for a batch (showing progress on stderr) and write its results, in input order. On
    --timeout-s, what is final is written and the command exits 1 saying how many are not."""
    from genq.producer import Client
    from genq.producer.gateway.batch_views import BatchView
    from genq.producer.gateway.batches import output_files, wait_for_batch
    from rich.progress import Progress

    with (
        Client.from_url(redis_url, queue) as client,
        Progress(console=Console(stderr=True), transient=True) as progress,
    ):
        task = progress.add_task("final", total=None)

        def show(view: BatchView) -> None:
            progress.update(task, completed=view.completed + view.failed, total=view.total)

        try:
            view = wait_for_batch(client, batch_id, timeout_s, show)
        except GenqError as e:
            raise click.ClickException(str(e)) from None
    ok, failed, waiting = output_files(view)
    with open(output, "w", encoding="utf-8") as out:
        out.writelines(json.dumps(line) + "\n" for line in ok + ([] if errors else failed))
    if errors:
        with open(errors, "w", encoding="utf-8") as err:
            err.writelines(json.dumps(line) + "\n" for line in failed)
    click.echo(json.dumps({"id": batch_id, "completed": len(ok), "failed": len(failed)}))
    if waiting:
        raise click.ClickException(
            f"{waiting} of {view.total} requests not final after {timeout_s} s; the "
            f"{len(ok) + len(failed)} final ones are written. Run this again to wait on"
        )


@batch.command("cancel")
@redis_options
@click.argument("batch_id")
def batch_cancel(redis_url: str, queue: str, batch_id: str) -> None:
    """Cancel every request of the batch that has not finished."""
    from genq.producer import Client
    from genq.producer.gateway.batches import cancel_batch

    with Client.from_url(redis_url, queue) as client:
        try:
            n = cancel_batch(client, batch_id)
        except GenqError as e:
            raise click.ClickException(str(e)) from None
    click.echo(json.dumps({"id": batch_id, "cancelled": n}))
