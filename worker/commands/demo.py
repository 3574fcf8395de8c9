"""``genq demo``: the whole path on one machine, with nothing to set up but redis-server."""

from __future__ import annotations

import contextlib
import random
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
from genq.common.connection import connect
from genq.common.errors import GenqError, ResultTimeout
from genq.common.models import PRIORITIES, Result
from genq.common.snapshot import collect, derived
from genq.producer import Client
from genq.producer.commands.options import ENGINE_CHOICE, REDIS_URL_ENV
from genq.worker.bench.modes import percentile
from genq.worker.devtools.redis_server import RedisServer
from genq.worker.devtools.worker_process import start_worker, wait_until_serving, worker_args
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

COMPLETIONS = (
    "The capital of France is",
    "The three primary colors are",
    "The largest planet in our solar system is",
    "Python is a programming language that",
    "Once upon a time, in a small village by the sea,",
    "A good way to start the morning is",
)
QUESTIONS = (
    "Write one sentence about a cat.",
    "What is 12 times 12?",
    "Give me two tips for writing clear emails.",
    "Translate 'good morning' into French.",
    "Explain in one sentence what a queue is.",
    "Name three fruits that are red.",
    "Suggest a name for a friendly robot.",
    "Summarize in one sentence: Redis is an in-memory data store that many applications use "
    "as a database, a cache and a message broker, because it keeps data in memory, answers in "
    "well under a millisecond, and offers data structures such as lists, hashes, sorted sets "
    "and streams, which make queues, leaderboards and rate limiters short to write.",
)
DEMO_TIMEOUT_S = 900.0


def demo_prompts(n: int, seed: int) -> list[dict[str, object]]:
    """``n`` requests, seeded: text to continue and chat questions, short and long: the first
    two thirds a ``low`` priority backlog (a batch job), the rest ``high`` priority questions
    (someone waiting), submitted after it."""
    rng = random.Random(seed)
    n_low = n * 2 // 3
    out: list[dict[str, object]] = []
    for i in range(n):
        request: dict[str, object] = {
            "max_new_tokens": rng.randint(12, 48),
            "priority": "low" if i < n_low else "high",
            "request_id": f"demo-{seed}-{i:03d}",
        }
        if i < n_low and i % 2 == 0:
            request["prompt"] = COMPLETIONS[(i // 2) % len(COMPLETIONS)]
        else:
            question = QUESTIONS[i % len(QUESTIONS)]
            request["messages"] = [{"role": "user", "content": question}]
        out.append(request)
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
def _dashboard(url: str, queue: str, console: Console) -> Iterator[None]:
    """``genq dashboard`` on the demo's queue while the block runs; its address printed. Only
    a note if it cannot start (no serve extra)."""
    from genq.worker.devtools.gateway_process import GatewayProcess

    try:
        gateway = GatewayProcess(url, queue, None, command="dashboard")
    except RuntimeError as err:
        console.print(f"(no dashboard: {err}; it needs genq[serve])")
        yield
        return
    console.print(f"[bold]dashboard[/bold]: {gateway.dashboard}  (open it to watch the queue)")
    try:
        yield
    finally:
        gateway.stop()


@contextlib.contextmanager
def _worker_process(log_path: Path, args: list[str]) -> Iterator[subprocess.Popen[bytes]]:
    """A ``genq worker`` with these flags, logging to ``log_path``; stopped with SIGTERM (a
    drain) when the block ends."""
    with log_path.open("wb") as log:
        proc = start_worker(log=log, extra_args=tuple(args))
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
    keep_dashboard: bool = False,
) -> list[Result]:
    """Run the demo and return the results (the CLI prints them): load the model first, then
    submit a low-priority backlog and high-priority questions after it, stream the first
    question's answer live, and show who waited how long. The dashboard runs meanwhile
    (``keep_dashboard``: and after, with the worker, until Ctrl-C)."""
    specs = demo_prompts(n_requests, seed)
    with (
        _redis(redis_url, console) as url,
        tempfile.TemporaryDirectory(prefix="genq-demo-") as tmp,
    ):
        log_path = Path(tmp) / "worker.log"
        consumer = f"demo-worker-{seed}"
        args = worker_args(
            redis_url=url,
            queue=queue,
            model=model,
            engine=engine,
            consumer=consumer,
            max_batch_tokens=max_batch_tokens,
            max_batch_size=max_batch_size,
        )
        with (
            Client.from_url(url, queue) as client,
            _worker_process(log_path, args) as proc,
            _dashboard(url, queue, console),
        ):
            _wait_for_the_model(client, queue, consumer, proc, log_path, model, console)
            t0 = time.perf_counter()
            low = [x for x in specs if x["priority"] == "low"]
            high = [x for x in specs if x["priority"] == "high"]
            ids = client.submit_many(low)
            console.print(f"submitted a backlog of {len(low)} low-priority requests")
            streamed = {**high[0], "stream": True} if high else None
            ids += client.submit_many(([streamed] if streamed else []) + high[1:])
            console.print(f"then {len(high)} high-priority questions: they go first")
            if streamed is not None:
                _stream_live(client, str(streamed["request_id"]), streamed, console)
            results = _wait_with_progress(client, ids, proc, log_path, console)
            elapsed_s = time.perf_counter() - t0
            with connect(url) as r:
                snapshot = collect(r, queue)
            if keep_dashboard:
                _print_results(results, specs, console)
                _keep_up(console)
        if not keep_dashboard:
            _print_results(results, specs, console)
        me: dict[str, Any] = next((w for w in snapshot["workers"] if w["consumer"] == consumer), {})
        d = derived(me)
        completion = sum(r.usage.completion_tokens for r in results)
        console.print(
            f"[bold]{len(results)} requests[/bold]: "
            f"{sum(r.status == 'succeeded' for r in results)} succeeded; "
            f"engine {engine}; batches formed: {me.get('batches', '?')}; "
            f"padding fraction: {d['padding_fraction']:.1%}; "
            f"engine tokens/s: {d['tokens_per_s']:.0f}; "
            f"end to end (model loaded): {completion / elapsed_s:.0f} tokens/s"
        )
        console.print("waits by priority: " + _waits_by_priority(results))
        return results


def _keep_up(console: Console) -> None:
    """Wait for Ctrl-C, the worker and the dashboard still up."""
    console.print("the dashboard, the worker and Redis stay up: Ctrl-C to stop")
    with contextlib.suppress(KeyboardInterrupt):
        while True:
            time.sleep(1)


def _wait_for_the_model(
    client: Client,
    queue: str,
    consumer: str,
    proc: subprocess.Popen[bytes],
    log_path: Path,
    model: str,
    console: Console,
) -> None:
    """Wait until the worker has loaded its model and joined the queue (its heartbeat)."""
    t0 = time.perf_counter()
    with console.status(f"loading {model} (built on first use)..."):
        try:
            wait_until_serving(client.redis, queue, consumer, proc, timeout_s=DEMO_TIMEOUT_S)
        except RuntimeError as err:
            tail = log_path.read_text(errors="replace")[-3000:]
            raise GenqError(f"{err}:\n{tail}") from None
    console.print(f"worker ready: {model} loaded in {time.perf_counter() - t0:.1f} s")


def _stream_live(
    client: Client, request_id: str, spec: dict[str, object], console: Console
) -> None:
    """Print one answer as it is generated."""
    messages: Any = spec.get("messages")
    asked = str(spec.get("prompt") or messages[0]["content"])
    console.print(f"[bold]streaming[/bold] the first question's answer: {asked}")
    for piece in client.stream(request_id, timeout=DEMO_TIMEOUT_S):
        if isinstance(piece, str):
            console.print(piece, end="", markup=False, highlight=False, soft_wrap=True)
    console.print()


def _waits_by_priority(results: list[Result]) -> str:
    """Each priority's queue wait: median and largest, ms."""
    parts = []
    for priority in PRIORITIES:
        waits = [float(r.timings.queue_wait_ms or 0) for r in results if r.priority == priority]
        if waits:
            p50, most = percentile(waits, 0.5), max(waits)
            parts.append(f"{priority} p50 {p50:.0f} ms, max {most:.0f} ms ({len(waits)})")
    return "; ".join(parts)


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


def _print_results(results: list[Result], specs: list[dict[str, object]], console: Console) -> None:
    table = Table(title=f"16 of {len(results)} results, high priority first", show_lines=True)
    for col, width in (("prio", 6), ("asked", 34), ("answer", 60)):
        table.add_column(col, max_width=width, overflow="fold")
    for col in ("new tokens", "batch", "wait ms"):
        table.add_column(col, justify="right")
    rows = sorted(zip(results, specs, strict=True), key=lambda rs: rs[0].priority != "high")
    for r, spec in rows[:16]:
        messages: Any = spec.get("messages")
        asked = str(spec.get("prompt") or messages[0]["content"])
        answer = r.text if r.status == "succeeded" else f"{r.status}: {r.error}"
        table.add_row(
            r.priority or "",
            asked if len(asked) < 80 else asked[:77] + "...",
            (answer or "").strip(),
            str(r.usage.completion_tokens),
            str(r.batch_size),
            str(r.timings.queue_wait_ms),
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
@click.option("--requests", "n_requests", type=int, default=24, show_default=True)
@click.option(
    "--model",
    default="smollm2-135m",
    show_default=True,
    help="a real model by default (built on first use); tiny for a fast look",
)
@click.option(
    "--engine",
    type=ENGINE_CHOICE,
    default="continuous",
    show_default=True,
    help="the worker's default; static shows the batches it forms",
)
@click.option("--max-batch-tokens", type=int, default=4096, show_default=True)
@click.option("--max-batch-size", type=int, default=8, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option(
    "--dashboard",
    "keep_dashboard",
    is_flag=True,
    help="after the demo, keep the dashboard (and the worker) up until Ctrl-C",
)
def demo(
    redis_url: str | None,
    queue: str,
    n_requests: int,
    model: str,
    engine: str,
    max_batch_tokens: int,
    max_batch_size: int,
    seed: int,
    keep_dashboard: bool,
) -> None:
    """Run genq end to end: a private redis-server, a worker on a real model (SmolLM2-135M-
    Instruct) loaded first, then a backlog of low-priority prompts and high-priority chat
    questions after it; stream one answer live, print the answers, who waited how long, and
    the batching stats. The dashboard's address is printed while it runs."""
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
            console=Console(width=max(Console().width, 120)),
            keep_dashboard=keep_dashboard,
        )
    except GenqError as err:
        raise click.ClickException(str(err)) from None
