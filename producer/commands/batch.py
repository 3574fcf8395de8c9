"""``genq batch submit | status | results | cancel``: OpenAI Batch API files."""

from __future__ import annotations

import json
from typing import Any

import click
from genq.common.errors import GenqError
from genq.common.models import DEFAULT_PRIORITY
from genq.producer.commands.options import (
    PRIORITY_CHOICE,
    RefusedInput,
    redis_options,
    tenant_option,
)
from genq.producer.gateway.batch_lines import ENDPOINTS
from rich.console import Console


@click.group()
def batch() -> None:
    """OpenAI Batch API files: submit, status, results, cancel."""


def files_option(func: Any) -> Any:
    """``--files-dir``: the file store a batch's file goes to (the gateways' own)."""
    return click.option(
        "--files-dir",
        envvar="GENQ_FILES_DIR",
        default=None,
        help="the file store (a directory, or s3://bucket/prefix): the gateways' own, so that "
        "they run the batch too [env: GENQ_FILES_DIR; default: $XDG_DATA_HOME/genq/files]",
    )(func)


@batch.command("submit")
@redis_options
@click.argument("path", type=click.Path(exists=True, dir_okay=False, allow_dash=True))
@click.option("--priority", type=PRIORITY_CHOICE, default=DEFAULT_PRIORITY)
@tenant_option
@click.option(
    "--batch-id", default=None, help="continue this batch where it stopped (nothing twice)"
)
@click.option(
    "--endpoint",
    type=click.Choice(sorted(ENDPOINTS)),
    default=None,
    help="refuse lines for any other url (OpenAI: one endpoint per batch)",
)
@files_option
@click.option(
    "--batch-window",
    envvar="GENQ_BATCH_WINDOW",
    type=click.IntRange(min=1),
    default=10_000,
    show_default=True,
    help="most of its requests in Redis at once; the rest are fed in as they end "
    "[env: GENQ_BATCH_WINDOW]",
)
@click.option(
    "--completion-window",
    default="24h",
    show_default=True,
    help="past it, what has not run is expired (OpenAI's 24h; also 30m, 90s, 7d)",
)
def batch_submit(
    redis_url: str,
    queue: str,
    path: str,
    priority: str,
    tenant: str,
    batch_id: str | None,
    endpoint: str | None,
    files_dir: str | None,
    batch_window: int,
    completion_window: str,
) -> None:
    """Submit an OpenAI batch input file (JSON Lines) of any size and print the batch id (only
    that, on stdout). The file is copied to the file store, then fed into the queue in waves
    (at most --batch-window requests in Redis at once) while this runs, with a progress bar;
    stopped, a gateway sharing the store goes on, or run this again with --batch-id. Every line
    is checked as the file is copied: a file with no request in it is refused in one line (the
    first bad line's number and why), exit 2, no batch; otherwise the refused lines are counted
    in the last line on stderr, with where they are, and are in the batch's error file."""
    import os

    from genq.common.connection import is_cluster
    from genq.producer import Client
    from genq.producer.gateway import batch_waves, wave_files
    from rich.progress import Progress

    err = Console(stderr=True)
    checked: list[wave_files.LineVerdicts] = []
    with (
        Client.from_url(redis_url, queue) as client,
        Progress(console=err, transient=True) as progress,
    ):
        store = wave_files.store_of(files_dir)
        task = progress.add_task("uploading", total=None)
        if is_cluster(client.redis):  # every line at once (the wave scripts need one Redis)
            _submit_in_redis(client, path, priority, tenant, batch_id, endpoint, progress)
            return
        try:
            bid = wave_files.upload_and_create(
                client,
                store,
                path,
                batch_id=batch_id,
                source=os.path.basename(path),
                priority=priority,
                tenant=tenant,
                endpoint=endpoint,
                window=batch_window,
                completion_window=completion_window,
                on_verdicts=lambda v: checked.append(v),
            )

            def show(did: batch_waves.Round, rec: Any) -> None:
                lines = int(rec.get("total") or 0) + int(rec.get("refused") or 0)
                progress.update(
                    task, description="feeding", completed=int(rec.get("fed") or 0), total=lines
                )

            rec = wave_files.run_until(
                client, store, bid, lambda rec: rec.get("feeding") != "1", every=show
            )
        except wave_files.NotABatchFile as e:
            raise RefusedInput(f"{e}; no batch was created") from None
        except GenqError as e:
            raise click.ClickException(f"{e} (batch {batch_id or 'not created'})") from None
    fed = int(rec.get("fed") or 0) - int(rec.get("refused") or 0)
    refused = int(rec.get("refused") or 0)
    where = checked[0].where() if checked and checked[0].refused_count else "see"
    why = f" ({where}: genq batch results --errors)" if refused else ""
    click.echo(f"batch {bid}: {fed} submitted, {refused} refused{why}", err=True)
    click.echo(bid)


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
    type=click.Path(dir_okay=False, writable=True, allow_dash=True),
    default="-",
    show_default=True,
    help="where the OpenAI-style output lines go ('-': stdout)",
)
@click.option(
    "--errors",
    "errors",
    type=click.Path(dir_okay=False, writable=True, allow_dash=True),
    default=None,
    help="failed, expired, cancelled and refused ones go here instead",
)
@click.option("--timeout-s", type=float, default=None, help="give up waiting after this long")
@files_option
def batch_results(
    redis_url: str,
    queue: str,
    batch_id: str,
    output: str,
    errors: str | None,
    timeout_s: float | None,
    files_dir: str | None,
) -> None:
    """Wait for a batch (running its rounds meanwhile, and showing progress on stderr) and
    stream its results to --output. On --timeout-s, what is final is written and the command
    exits 1 saying how many are not. A summary goes to stdout (stderr when the lines do)."""
    from genq.producer import Client
    from genq.producer.gateway import batch_waves, wave_files
    from genq.producer.gateway.batch_views import read_batch
    from rich.progress import Progress

    with (
        Client.from_url(redis_url, queue) as client,
        Progress(console=Console(stderr=True), transient=True) as progress,
    ):
        try:
            if not read_batch(client, batch_id, states=False).waves:
                _results_in_redis(client, batch_id, output, errors, timeout_s, progress)
                return
            task = progress.add_task("final", total=None)

            def show(did: batch_waves.Round, rec: Any) -> None:
                lines = int(rec.get("total") or 0) + int(rec.get("refused") or 0)
                progress.update(task, completed=int(rec.get("collected") or 0), total=lines)

            store = wave_files.store_of(files_dir)
            wave_files.run_until(
                client,
                store,
                batch_id,
                lambda rec: bool(rec.get("finished_at_ms")),
                timeout_s=timeout_s,
                every=show,
            )
            view = read_batch(client, batch_id, states=False)
            with click.open_file(output, "wb") as out:
                for kind, to in (("output", out), ("errors", None if errors else out)):
                    if to is not None:
                        parts = wave_files.parts(store, batch_id, kind)
                        to.writelines(wave_files.read_parts(store, parts))
            if errors:
                with click.open_file(errors, "wb") as err_out:
                    parts = wave_files.parts(store, batch_id, "errors")
                    err_out.writelines(wave_files.read_parts(store, parts))
        except GenqError as e:
            raise click.ClickException(str(e)) from None
    summary = {"id": batch_id, "completed": view.completed, "failed": view.failed}
    click.echo(json.dumps(summary), err=output == "-")
    waiting = view.total - view.completed - view.failed
    if not view.finished:
        raise click.ClickException(
            f"{waiting} of {view.total} requests not final after {timeout_s} s; the "
            f"{view.completed + view.failed} final ones are written. Run this again to wait on"
        )


def _submit_in_redis(
    client: Any,
    path: str,
    priority: str,
    tenant: str,
    batch_id: str | None,
    endpoint: str | None,
    progress: Any,
) -> None:
    """``genq batch submit`` on a Redis Cluster: every line enqueued now (``submit_batch``)."""
    import os

    from genq.producer.gateway.batches import submit_batch
    from genq.producer.gateway.repeated_ids import CustomIds
    from genq.producer.gateway.wave_files import LineVerdicts, NotABatchFile

    task = progress.add_task("submitting", total=None)
    source = os.path.basename(path)
    with click.open_file(path, encoding="utf-8") as f:
        lines = list(f)
        verdicts = LineVerdicts("check", priority, endpoint, tenant, CustomIds())
        for n, line in enumerate(lines, start=1):
            if line.strip():
                verdicts.add(n, line.encode())
        try:
            verdicts.check(source)
        except NotABatchFile as e:
            raise RefusedInput(f"{e}; no batch was created") from None
        try:
            done = submit_batch(
                client,
                lines,
                source=source,
                batch_id=batch_id,
                priority=priority,
                tenant=tenant,
                endpoint=endpoint,
                progress=lambda n, total: progress.update(task, completed=n, total=total),
            )
        except GenqError as e:
            raise click.ClickException(f"{e} (batch {batch_id or 'not created'})") from None
    refused = len(done.rejected)
    where = verdicts.where() if verdicts.refused_count else "see"
    why = f" ({where}: genq batch results --errors)" if refused else ""
    click.echo(f"batch {done.id}: {done.submitted} submitted, {refused} refused{why}", err=True)
    click.echo(done.id)


def _results_in_redis(
    client: Any,
    batch_id: str,
    output: str,
    errors: str | None,
    timeout_s: float | None,
    progress: Any,
) -> None:
    """``genq batch results`` of a batch kept in Redis (``submit_batch``, or a Redis
    Cluster's): its results rendered from its requests' states, in input order."""
    from genq.producer.gateway.batch_views import BatchView
    from genq.producer.gateway.batches import output_files, wait_for_batch

    task = progress.add_task("final", total=None)

    def show(view: BatchView) -> None:
        progress.update(task, completed=view.completed + view.failed, total=view.total)

    view = wait_for_batch(client, batch_id, timeout_s, show)
    ok, failed, waiting = output_files(view)
    with click.open_file(output, "w", encoding="utf-8") as out:
        out.writelines(json.dumps(line) + "\n" for line in ok + ([] if errors else failed))
    if errors:
        with click.open_file(errors, "w", encoding="utf-8") as err:
            err.writelines(json.dumps(line) + "\n" for line in failed)
    summary = {"id": batch_id, "completed": len(ok), "failed": len(failed)}
    click.echo(json.dumps(summary), err=output == "-")
    if waiting:
        raise click.ClickException(
            f"{waiting} of {view.total} requests not final after {timeout_s} s; the "
            f"{len(ok) + len(failed)} final ones are written. Run this again to wait on"
        )


@batch.command("cancel")
@redis_options
@click.argument("batch_id")
@files_option
def batch_cancel(redis_url: str, queue: str, batch_id: str, files_dir: str | None) -> None:
    """Cancel every request of the batch that has not finished, and feed no more of it; its
    error file gets the cancelled ones (written before this returns, within 60 s)."""
    from genq.producer import Client
    from genq.producer.gateway import wave_files
    from genq.producer.gateway.batches import cancel_batch

    with Client.from_url(redis_url, queue) as client:
        try:
            n = cancel_batch(client, batch_id)
            if client.redis.hget(client.keys.batch(batch_id), "waves") == b"1":
                wave_files.run_until(
                    client,
                    wave_files.store_of(files_dir),
                    batch_id,
                    lambda rec: bool(rec.get("finished_at_ms")),
                    timeout_s=60,
                )
        except GenqError as e:
            raise click.ClickException(str(e)) from None
    click.echo(json.dumps({"id": batch_id, "cancelled": n}))
