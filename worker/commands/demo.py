"""``genq demo``: the whole path on one machine, with nothing to set up but redis-server."""

from __future__ import annotations

import contextlib
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
from genq.common.connection import connect
from genq.common.errors import GenqError, ResultTimeout
from genq.common.models import PRIORITIES, Result
from genq.producer import Client
from genq.worker.commands.options import ENGINE_CHOICE, REDIS_URL_ENV
from genq.worker.commands.stats import collect
from genq.worker.devtools.redis_server import RedisServer
from genq.worker.runtime.heartbeat import derived
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

CORPUS = (
    "The queue keeps requests safe until a worker is free. Each worker reads from a consumer "
    "group, forms batches within a token budget, and writes every result to its own key. "
    "Short prompts and long prompts are grouped apart so that little compute is spent on "
    "padding. High priority requests go first, but low priority requests are never starved. "
)
DEMO_TIMEOUT_S = 600.0


def demo_prompts(n: int, seed: int) -> list[dict[str, object]]:
    """``n`` requests of mixed length (about 8 to 400 characters) and priority, seeded."""
    rng = random.Random(seed)
    text = CORPUS * 4
    out: list[dict[str, object]] = []
    for i in range(n):
        length = int(min(400, max(8, rng.lognormvariate(4.0, 0.9))))
        start = rng.randrange(0, len(text) - length)
        out.append(
            {
                "prompt": text[start : start + length],
                "max_new_tokens": rng.randint(8, 64),
                "priority": rng.choices(PRIORITIES, weights=[2, 5, 3])[0],
                "request_id": f"demo-{seed}-{i:03d}",
            }
        )
    return out


@contextlib.contextmanager
def _redis(url: str | None, console: Console) -> Iterator[str]:
    if url is not None:
        yield url
        return
    with RedisServer() as server:
        console.print(f"started a private redis-server at {server.url}")
        yield server.url


@contextlib.contextmanager
def _worker_process(args: list[str], log_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "genq.worker", "worker", *args], stdout=log, stderr=log
        )
        try:
            yield proc
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


def run_demo(
    *,
    redis_url: str | None,
    queue: str,
    n_requests: int,
    model: str,
    engine: str,
    max_batch_tokens: int,
    max_batch_size: int,
    seed: int,
    console: Console,
) -> list[Result]:
    """Run the demo and return the results (the CLI prints them)."""
    specs = demo_prompts(n_requests, seed)
    with (
        _redis(redis_url, console) as url,
        tempfile.TemporaryDirectory(prefix="genq-demo-") as tmp,
    ):
        log_path = Path(tmp) / "worker.log"
        consumer = f"demo-worker-{seed}"
        worker_args = [
            "--redis-url",
            url,
            "--queue",
            queue,
            "--model",
            model,
            "--engine",
            engine,
            "--consumer",
            consumer,
            "--max-batch-tokens",
            str(max_batch_tokens),
            "--max-batch-size",
            str(max_batch_size),
            "--max-wait-ms",
            "50",
        ]
        with Client.from_url(url, queue) as client:
            ids = client.submit_many(specs)
            console.print(f"submitted {len(ids)} requests to queue {queue!r}")
            t0 = time.perf_counter()
            with _worker_process(worker_args, log_path) as proc:
                results = _wait_with_progress(client, ids, proc, log_path, console)
                elapsed_s = time.perf_counter() - t0
                with connect(url) as r:
                    snapshot = collect(r, queue)
        _print_results(results, console)
        me: dict[str, Any] = next((w for w in snapshot["workers"] if w["consumer"] == consumer), {})
        d = derived(me)
        completion = sum(r.usage.completion_tokens for r in results)
        console.print(
            f"[bold]{len(results)} requests[/bold]: "
            f"{sum(r.status == 'succeeded' for r in results)} succeeded; "
            f"batches formed: {me.get('batches', '?')}, "
            f"sizes: {me.get('recent_batch_sizes', '?')}; "
            f"mean batch size: {d['mean_batch_size']:.1f}; "
            f"padding fraction: {d['padding_fraction']:.1%}; "
            f"engine tokens/s: {d['tokens_per_s']:.0f}; "
            f"end to end (incl. model load): {completion / elapsed_s:.0f} tokens/s"
        )
        return results


def _wait_with_progress(
    client: Client,
    ids: list[str],
    proc: subprocess.Popen[bytes],
    log_path: Path,
    console: Console,
) -> list[Result]:
    results: list[Result] = []
    deadline = time.monotonic() + DEMO_TIMEOUT_S
    columns = (
        TextColumn("generating"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task("generating", total=len(ids))
        for request_id in ids:
            while True:
                if proc.poll() is not None:
                    tail = log_path.read_text(errors="replace")[-3000:]
                    raise GenqError(f"the demo worker exited ({proc.returncode}):\n{tail}")
                if time.monotonic() > deadline:
                    raise GenqError(f"the demo did not finish within {DEMO_TIMEOUT_S} s")
                try:
                    results.append(client.result(request_id, timeout=1.0))
                    break
                except ResultTimeout:
                    continue
            progress.advance(task)
    return results


def _print_results(results: list[Result], console: Console) -> None:
    table = Table(title=f"first 20 of {len(results)} results")
    for col in ("id", "prio", "prompt", "new", "wait ms", "batch", "status / text"):
        table.add_column(col, no_wrap=True)
    for r in results[:20]:
        shown = r.text if r.status == "succeeded" else f"{r.status}: {r.error}"
        table.add_row(
            r.id.rsplit("-", 1)[-1],
            r.priority or "",
            str(r.usage.prompt_tokens),
            str(r.usage.completion_tokens),
            str(r.timings.queue_wait_ms),
            str(r.batch_size),
            repr(shown or "")[:28],
        )
    console.print(table)


@click.command()
@click.option(
    "--redis-url",
    envvar=REDIS_URL_ENV,
    default=None,
    help="use this Redis instead of starting a private redis-server",
)
@click.option("--queue", default="demo", show_default=True)
@click.option("--requests", "n_requests", type=int, default=48, show_default=True)
@click.option("--model", default="tiny", show_default=True)
@click.option(
    "--engine",
    type=ENGINE_CHOICE,
    default="static",
    show_default=True,
    help="static shows the batches it forms",
)
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
    from genq.worker.commands.demo import run_demo

    try:
        run_demo(
            redis_url=redis_url,
            queue=queue,
            n_requests=n_requests,
            model=model,
            engine=engine,
            max_batch_tokens=max_batch_tokens,
            max_batch_size=max_batch_size,
            seed=seed,
            console=Console(),
        )
    except GenqError as err:
        raise click.ClickException(str(err)) from None
