"""The ``genq`` command: worker, submit, stats, demo."""

from __future__ import annotations

import json
import logging
import sys
import typing
from collections.abc import Callable
from typing import Any

import click
from genq.common.errors import ConfigError, GenqError
from genq.common.settings import DEFAULT_QUEUE, DEFAULT_REDIS_URL, WorkerSettings
from rich.console import Console
from rich.table import Table

F = Callable[..., Any]
WIDE = 160
"""Columns the stats tables get at least, terminal or not, so that no header is cut."""


def _settings_options(func: F) -> F:
    """One --flag per WorkerSettings field. Flags default to None so that the environment
    twin, then the field's own default, apply: each default is written once, in the model."""
    for name, info in reversed(list(WorkerSettings.model_fields.items())):
        annotation = info.annotation
        args = typing.get_args(annotation)
        click_type: Any = str
        if typing.get_origin(annotation) is typing.Literal:
            click_type = click.Choice([str(a) for a in args])
        elif annotation is int or int in args:
            click_type = int
        elif annotation is float or float in args:
            click_type = float
        default = info.default
        help_text = f"{info.description} [env: {WorkerSettings.env_var(name)}; default: {default}]"
        func = click.option(
            f"--{name.replace('_', '-')}", name, type=click_type, default=None, help=help_text
        )(func)
    return func


def _redis_options(func: F) -> F:
    func = click.option(
        "--queue", envvar="GENQ_QUEUE", default=DEFAULT_QUEUE, show_default=True,
        help="queue name [env: GENQ_QUEUE]",
    )(func)  # fmt: skip
    func = click.option(
        "--redis-url", envvar="GENQ_REDIS_URL", default=DEFAULT_REDIS_URL, show_default=True,
        help="Redis URL [env: GENQ_REDIS_URL]",
    )(func)  # fmt: skip
    return func


@click.group()
@click.option("-v", "--verbose", is_flag=True, help="log debug detail")
def main(verbose: bool) -> None:
    """genq: a Redis Streams queue for batched LLM generation."""
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


@main.command()
@_settings_options
def worker(**flags: Any) -> None:
    """Serve a queue: read, batch, generate, write results. Stop with SIGTERM or Ctrl-C."""
    from genq.worker.engines import make_engine
    from genq.worker.loop import Worker

    try:
        settings = WorkerSettings.build(flags)
    except ConfigError as err:
        raise click.UsageError(str(err)) from None
    if settings.gpus is not None:
        sys.exit(_launch(settings, flags))
    engine = make_engine(settings)
    Worker(settings, engine).run()


def _launch(settings: WorkerSettings, flags: dict[str, Any]) -> int:
    """``genq worker --gpus``: one supervised worker per GPU."""
    import socket

    from genq.worker.launcher import Launcher, parse_gpus

    needs_cuda = settings.engine != "echo"
    try:
        gpus = parse_gpus(str(settings.gpus), needs_cuda)
    except ConfigError as err:
        raise click.UsageError(str(err)) from None
    skip = {"gpus", "consumer", "device", "metrics_port"}
    args = [a for k, v in flags.items() if v is not None and k not in skip
            for a in (f"--{k.replace('_', '-')}", str(v))]  # fmt: skip
    launcher = Launcher(
        gpus, args, consumer_base=settings.consumer or socket.gethostname(),
        device="cuda" if needs_cuda else settings.device,
    )  # fmt: skip
    return launcher.run()


@main.command()
@_redis_options
@click.argument("prompt", required=False)
@click.option("--file", "path", type=click.Path(exists=True, dir_okay=False, allow_dash=True),
              help="submit every line of this file: a prompt per line, or JSON Lines of "
                   "request options; results are printed as JSON Lines")  # fmt: skip
@click.option("--max-new-tokens", type=int, default=64, show_default=True)
@click.option("--priority", type=click.Choice(["high", "normal", "low"]), default="normal")
@click.option("--temperature", type=float, default=0.0, show_default=True)
@click.option("--seed", type=int, default=None)
@click.option("--stop", multiple=True, help="a stop string (repeatable)")
@click.option("--timeout-s", type=float, default=None, help="give up waiting after this long")
@click.option("--no-wait", is_flag=True, help="print the request id and return")
@click.option("--json", "as_json", is_flag=True, help="print the whole result as JSON")
def submit(
    redis_url: str,
    queue: str,
    prompt: str | None,
    path: str | None,
    max_new_tokens: int,
    priority: str,
    temperature: float,
    seed: int | None,
    stop: tuple[str, ...],
    timeout_s: float | None,
    no_wait: bool,
    as_json: bool,
) -> None:
    """Submit PROMPT and print the generated text (or the result as JSON); or submit every
    line of --file with a progress bar."""
    from genq.producer import Client

    if (prompt is None) == (path is None):
        raise click.UsageError("give a PROMPT or --file, not both")
    options = {"max_new_tokens": max_new_tokens, "priority": priority,
               "temperature": temperature, "seed": seed, "stop": list(stop)}  # fmt: skip
    if path is not None:
        _submit_file(redis_url, queue, path, options, timeout_s, no_wait)
        return
    prompt = prompt or ""  # given: checked above
    with Client.from_url(redis_url, queue) as client:
        try:
            request_id = client.submit(
                prompt, max_new_tokens=max_new_tokens, priority=priority,
                temperature=temperature, seed=seed, stop=list(stop),
            )  # fmt: skip
            if no_wait:
                click.echo(request_id)
                return
            result = client.result(request_id, timeout=timeout_s)
        except GenqError as err:
            raise click.ClickException(str(err)) from None
    if as_json:
        click.echo(result.model_dump_json(indent=2))
    elif result.status == "succeeded":
        click.echo(result.text)
    else:
        msg = result.error.message if result.error else ""
        raise click.ClickException(f"request {result.id} {result.status}: {msg}")


def _submit_file(
    redis_url: str,
    queue: str,
    path: str,
    options: dict[str, Any],
    timeout_s: float | None,
    no_wait: bool,
) -> None:
    """``genq submit --file``: bad lines to stderr with their numbers, the rest submitted in
    chunks under a progress bar; then (unless --no-wait) one JSON line per result."""
    from genq.producer import Client
    from genq.producer.files import read_requests
    from rich.progress import Progress

    with click.open_file(path, encoding="utf-8") as f:
        requests, errors = read_requests(f, options)
    err = Console(stderr=True)
    for e in errors:
        err.print(f"line {e.line}: {e.message}", markup=False)
    chunk = 500
    with Client.from_url(redis_url, queue) as client, Progress(console=err) as progress:
        sent = progress.add_task("submitting", total=len(requests))
        ids: list[str] = []
        try:
            for start in range(0, len(requests), chunk):
                part = [r for _, r in requests[start : start + chunk]]
                ids += client.submit_requests(part)
                progress.advance(sent, len(part))
        except GenqError as e:
            raise click.ClickException(f"{e} ({len(ids)} of {len(requests)} submitted)") from None
        if no_wait:
            progress.stop()
            for (line, _), request_id in zip(requests, ids, strict=True):
                click.echo(json.dumps({"line": line, "id": request_id}))
            return
        done = progress.add_task("waiting", total=len(ids))
        for start in range(0, len(ids), chunk):
            results = client.results(ids[start : start + chunk], timeout=timeout_s)
            progress.advance(done, len(results))
            for (line, _), res in zip(requests[start : start + chunk], results, strict=True):
                out = {"line": line, **res.model_dump(mode="json")}
                click.echo(json.dumps(out))
    if errors:
        raise click.ClickException(f"{len(errors)} line(s) were not submitted (see above)")


@main.command()
@_redis_options
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
def stats(redis_url: str, queue: str, as_json: bool) -> None:
    """Queue depth, pending work and lag per priority; workers and their counters."""
    from genq.common.connection import connect
    from genq.worker.stats import collect

    r = connect(redis_url)
    try:
        snapshot = collect(r, queue)
    finally:
        r.close()
    if as_json:
        click.echo(json.dumps(snapshot, indent=2))
    else:
        print_stats(snapshot, Console(width=max(Console().width, WIDE)))


@main.group()
def dlq() -> None:
    """The dead-letter stream: entries with no usable id, and poison requests."""


@dlq.command("list")
@_redis_options
@click.option("--count", type=int, default=100, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
def dlq_list(redis_url: str, queue: str, count: int, as_json: bool) -> None:
    """Show the oldest dead-letter entries, with why each is there."""
    import dataclasses

    from genq.common.connection import connect
    from genq.common.keys import Keys
    from genq.worker.dead_letter import list_dead

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
@_redis_options
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
    from genq.worker.dead_letter import retry_dead

    if not dlq_ids and not retry_all:
        raise click.UsageError("name the dead-letter entries to retry, or pass --all")
    with connect(redis_url) as r:
        ids = retry_dead(
            r, Keys(queue), None if retry_all else list(dlq_ids),
            result_ttl_s or DEFAULT_RESULT_TTL_S,
        )  # fmt: skip
    click.echo(f"retried {len(ids)} entries")


@dlq.command("purge")
@_redis_options
@click.option("--yes", is_flag=True, help="do not ask")
def dlq_purge(redis_url: str, queue: str, yes: bool) -> None:
    """Delete every dead-letter entry of the queue."""
    from genq.common.connection import connect
    from genq.common.keys import Keys
    from genq.worker.dead_letter import purge_dead

    if not yes:
        click.confirm(f"delete every dead-letter entry of queue {queue!r}?", abort=True)
    with connect(redis_url) as r:
        n = purge_dead(r, Keys(queue))
    click.echo(f"purged {n} entries")


@main.group()
def batch() -> None:
    """OpenAI Batch API files: submit, status, results, cancel."""


@batch.command("submit")
@_redis_options
@click.argument("path", type=click.Path(exists=True, dir_okay=False, allow_dash=True))
@click.option("--priority", type=click.Choice(["high", "normal", "low"]), default="normal")
@click.option("--batch-id", default=None,
              help="reuse a batch id: its lines are not enqueued twice")  # fmt: skip
def batch_submit(
    redis_url: str, queue: str, path: str, priority: str, batch_id: str | None
) -> None:
    """Submit an OpenAI batch input file (JSON Lines); print the batch id. Invalid lines are
    reported with their numbers and skipped."""
    import os

    from genq.producer import Client
    from genq.producer.batches import new_batch_id, parse_file, record_batch
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
            for start in range(0, len(good), 500):
                part = [item.request for item in good[start : start + 500]]
                client.submit_requests(part)
                progress.advance(task, len(part))
        except GenqError as e:
            raise click.ClickException(f"{e} (batch {bid})") from None
    click.echo(json.dumps({"id": bid, "submitted": len(good),
                           "invalid_lines": [e.line for e in bad]}))  # fmt: skip


@batch.command("status")
@_redis_options
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
@_redis_options
@click.argument("batch_id")
@click.option("-o", "--output", "output", type=click.Path(dir_okay=False, writable=True),
              required=True, help="OpenAI-style output lines, keyed by custom_id")  # fmt: skip
@click.option("--errors", "errors", type=click.Path(dir_okay=False, writable=True),
              default=None, help="failed, expired and cancelled ones go here instead")  # fmt: skip
@click.option("--timeout-s", type=float, default=None, help="give up waiting after this long")
def batch_results(
    redis_url: str, queue: str, batch_id: str, output: str, errors: str | None,
    timeout_s: float | None,
) -> None:  # fmt: skip
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
@_redis_options
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


def print_stats(snapshot: dict[str, Any], console: Console) -> None:
    """Render a stats snapshot as two tables."""
    for table in stats_tables(snapshot):
        console.print(table)


def stats_tables(snapshot: dict[str, Any]) -> list[Table]:
    """A stats snapshot as two tables: streams by priority, and workers."""
    from genq.common.models import now_ms
    from genq.worker.stats import derived

    t = Table(title=f"queue {snapshot['queue']!r}")
    for col in ("priority", "length", "pending", "lag", "oldest waiting ms"):
        t.add_column(col, justify="right")
    for priority, s in snapshot["streams"].items():
        t.add_row(
            priority, str(s["length"]), str(s["pending"]), str(s["lag"]),
            str(s.get("oldest_waiting_ms", "-")),
        )  # fmt: skip
    w = Table(title=f"workers (dead-letter entries: {snapshot['dead_letter']})")
    for col in ("consumer", "alive", "last seen ms", "pending", "in flight", "batches",
                "succeeded", "failed", "wait p50/p99 ms", "mean batch", "padding",
                "tokens/s"):  # fmt: skip
        w.add_column(col, justify="right")
    now = now_ms()
    for worker in snapshot["workers"]:
        d = derived(worker)
        seen = worker.get("last_seen_unix_ms")
        w.add_row(
            str(worker["consumer"]), "yes" if worker["alive"] else "no",
            str(now - int(seen)) if seen else "-",
            str(worker["pending"]), str(worker.get("in_flight", "-")),
            str(worker.get("batches", "-")),
            str(worker.get("succeeded", "-")), str(worker.get("failed", "-")),
            f"{worker.get('wait_p50_ms', '-')}/{worker.get('wait_p99_ms', '-')}",
            f"{d['mean_batch_size']:.1f}", f"{d['padding_fraction']:.1%}",
            f"{d['tokens_per_s']:.0f}",
        )  # fmt: skip
    return [t, w]


@main.command()
@_redis_options
@click.option("--interval-s", type=float, default=1.0, show_default=True)
@click.option("--iterations", type=int, default=0, help="stop after this many (0: until Ctrl-C)")
def top(redis_url: str, queue: str, interval_s: float, iterations: int) -> None:
    """`genq stats`, live: refreshed every --interval-s until Ctrl-C."""
    import time

    from genq.common.connection import connect
    from genq.worker.stats import collect
    from rich.console import Group
    from rich.live import Live

    def render(r: Any) -> Group:
        return Group(*stats_tables(collect(r, queue)))

    with (
        connect(redis_url) as r,
        Live(
            render(r), console=Console(width=max(Console().width, WIDE)), auto_refresh=False
        ) as live,
    ):
        n = 1
        try:
            while iterations == 0 or n < iterations:
                time.sleep(interval_s)
                live.update(render(r), refresh=True)
                n += 1
        except KeyboardInterrupt:
            pass


@main.command()
@click.option("--redis-url", envvar="GENQ_REDIS_URL", default=None,
              help="use this Redis instead of starting a private redis-server")  # fmt: skip
@click.option("--queue", default="demo", show_default=True)
@click.option("--requests", "n_requests", type=int, default=48, show_default=True)
@click.option("--model", default="tiny", show_default=True)
@click.option("--engine", type=click.Choice(["static", "continuous", "echo"]), default="static",
              show_default=True, help="static shows the batches it forms")  # fmt: skip
@click.option("--max-batch-tokens", type=int, default=4096, show_default=True)
@click.option("--max-batch-size", type=int, default=16, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
def demo(
    redis_url: str | None,
    queue: str,
    n_requests: int,
    model: str,
    engine: str,
    max_batch_tokens: int,
    max_batch_size: int,
    seed: int,
) -> None:
    """Run genq end to end: a private redis-server, a worker on the tiny model, a few dozen
    prompts of mixed length and priority; print the results and the batching stats."""
    from genq.worker.demo import run_demo

    try:
        run_demo(
            redis_url=redis_url, queue=queue, n_requests=n_requests, model=model, engine=engine,
            max_batch_tokens=max_batch_tokens, max_batch_size=max_batch_size, seed=seed,
            console=Console(),
        )  # fmt: skip
    except GenqError as err:
        raise click.ClickException(str(err)) from None


@main.command()
@click.option("--model", default="tiny", show_default=True)
@click.option("--device", default="cpu", show_default=True)
@click.option("--dtype", default="auto", show_default=True)
@click.option("--requests", "n_requests", type=int, default=64, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--repeats", type=int, default=3, show_default=True,
              help="run each mode this many times and report the median run")  # fmt: skip
@click.option("--fifo-batch-size", type=int, default=32, show_default=True)
@click.option("--max-batch-tokens", type=int, default=16384, show_default=True)
@click.option("--max-batch-size", type=int, default=32, show_default=True)
@click.option("--queue-engine", type=click.Choice(["static", "continuous", "none"]),
              default="continuous", show_default=True,
              help="engine measured through Redis and a genq worker ('none' to skip)")  # fmt: skip
@click.option("--redis-url", default=None, help="default: a private redis-server")
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
@click.option("--markdown", is_flag=True, help="print a BENCHMARKS.md section")
@click.option("--sweep", is_flag=True,
              help="instead: throughput and latency against the batch size limit")  # fmt: skip
@click.option("--scenario", type=click.Choice(["modes", "priority"]), default="modes",
              show_default=True,
              help="priority: waits per priority under a low-priority backlog")  # fmt: skip
def bench(
    model: str,
    device: str,
    dtype: str,
    n_requests: int,
    seed: int,
    repeats: int,
    fifo_batch_size: int,
    max_batch_tokens: int,
    max_batch_size: int,
    queue_engine: str,
    redis_url: str | None,
    as_json: bool,
    markdown: bool,
    sweep: bool,
    scenario: str,
) -> None:
    """Serve one seeded workload several ways and compare tokens/s, padding and waits."""
    import statistics

    if scenario == "priority":
        _priority_scenario(redis_url, model, queue_engine, max_batch_size, as_json)
        return

    from genq.worker import bench as b
    from genq.worker.engines.continuous import ContinuousEngine
    from genq.worker.engines.static import StaticEngine
    from genq.worker.redis_server import RedisServer

    engine = StaticEngine.load(model, device, dtype)
    continuous = ContinuousEngine(
        engine.model, engine.tokenizer, device, max_batch_tokens, max_batch_size
    )
    workload = b.make_workload(engine, n_requests, seed)
    if sweep:
        continuous.close()
        points = b.run_sweep(engine, workload, [1, 4, 8, 16, 32, 64], max_batch_tokens)
        if as_json:
            click.echo(json.dumps({"machine": b.machine_info(), "sweep": points}, indent=2))
        else:
            click.echo(f"Command: `genq {' '.join(sys.argv[1:])}`  ")
            click.echo(b.sweep_markdown(points, max_batch_tokens))
        return
    runs: dict[str, list[b.ModeResult]] = {}
    for _ in range(repeats):
        for res in b.run_in_process(
            engine, workload, fifo_batch_size=fifo_batch_size,
            max_batch_tokens=max_batch_tokens, max_batch_size=max_batch_size,
            continuous=continuous,
        ):  # fmt: skip
            runs.setdefault(res.mode, []).append(res)
    continuous.close()
    if queue_engine != "none":
        server = None if redis_url else RedisServer().start()
        url = server.url if server else str(redis_url)
        try:
            for i in range(repeats):
                res = b.run_through_queue(
                    workload, redis_url=url, model=model, engine=queue_engine,
                    max_batch_tokens=max_batch_tokens, max_batch_size=max_batch_size,
                    queue=f"bench{i}",
                )  # fmt: skip
                runs.setdefault(res.mode, []).append(res)
        finally:
            if server is not None:
                server.stop()
    medians = []
    for mode_runs in runs.values():
        speed = statistics.median_low([r.tokens_per_s for r in mode_runs])
        medians.append(next(r for r in mode_runs if r.tokens_per_s == speed))
    rows = b.results_table(medians)
    info = b.machine_info()
    if as_json:
        click.echo(json.dumps({"machine": info, "model": model, "requests": n_requests,
                               "seed": seed, "repeats": repeats,
                               "max_batch_tokens": max_batch_tokens, "modes": rows,
                               "all_runs": {m: [r.tokens_per_s for r in rs]
                                            for m, rs in runs.items()}}, indent=2))  # fmt: skip
        return
    if markdown:
        click.echo(b.markdown_section(rows, info, sys.argv[1:], n_requests, repeats))
        return
    console = Console(width=max(Console().width, 130))
    t = Table(title=f"genq bench: {n_requests} requests, model {model}, seed {seed}, "
                    f"median of {repeats}, budget {max_batch_tokens} tokens")  # fmt: skip
    cols = ("mode", "batches", "mean batch", "tokens/s", "x one", "padding",
            "wasted decode", "wait p50 ms", "latency p50 ms", "latency p99 ms")  # fmt: skip
    for c in cols:
        t.add_column(c, justify="right")
    for row in rows:
        t.add_row(
            row["mode"], str(row["batches"]), f"{row['mean_batch_size']:.1f}",
            f"{row['tokens_per_s']:.0f}", f"{row['speedup_vs_one_at_a_time']:.2f}",
            f"{row['padding_fraction']:.1%}", f"{row['wasted_decode_fraction']:.1%}",
            f"{row['queue_wait_p50_ms']:.0f}", f"{row['latency_p50_ms']:.0f}",
            f"{row['latency_p99_ms']:.0f}",
        )  # fmt: skip
    console.print(t)
    console.print(" ".join(f"{k}={v}" for k, v in info.items()))


def _priority_scenario(
    redis_url: str | None, model: str, engine: str, max_batch_size: int, as_json: bool
) -> None:
    from genq.worker.priority_bench import priority_markdown, run_priority_scenario
    from genq.worker.redis_server import RedisServer

    server = None if redis_url else RedisServer().start()
    try:
        res = run_priority_scenario(
            server.url if server else str(redis_url), model=model,
            engine="continuous" if engine == "none" else engine, max_batch_size=max_batch_size,
        )  # fmt: skip
    finally:
        if server is not None:
            server.stop()
    if as_json:
        click.echo(json.dumps(res, indent=2))
    else:
        click.echo(f"Command: `genq {' '.join(sys.argv[1:])}`  ")
        click.echo(priority_markdown(res))


if __name__ == "__main__":
    sys.exit(main())
