"""``genq bench --scenario embed-priority``: one tenant's big indexing job at low priority and
another tenant's single queries at high, on one embedding worker.

Tenant ``indexer`` embeds ``--inputs`` texts (the ``embed`` scenario's mixed lengths) with the
client's ``embed_many`` at priority ``low``; tenant ``search`` sends one short query at a time
at ``high`` (a new text each time: nothing is a repeat), ``QUERY_GAP_S`` apart. Three phases,
on one private redis-server and one ``genq worker --model all-minilm-l6-v2``:

- **idle**: the queries alone, their latency (submit to result, at the client);
- **indexer alone**: the job alone, its inputs/s;
- **together**: the job again (new texts) and the queries beside it.

The last two take turns over the rounds (``--repeats``). Reported: the queries' p50 and p99
with the job against idle (the goal: within 3x and 5x), and the job's inputs/s beside the
queries against alone (the goal: >= 0.9x). ``--quick``: 1,000 inputs, one round.
"""

from __future__ import annotations

import functools
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

from genq.worker.bench.embed import MODEL, workload
from genq.worker.devtools.worker_process import start_worker, stop_worker, wait_until_serving

INPUTS = 10_000
QUICK_INPUTS = 1_000
IDLE_QUERIES = 40
QUERY_GAP_S = 0.1
"""The pause between one query's answer and the next query (a searcher's pace)."""


def _queries(client: Any, stop: Callable[[], bool], fresh: Callable[[], str]) -> list[float]:
    """One query at a time until ``stop``: each one's seconds from submit to its vector."""
    seconds = []
    while not stop():
        t0 = time.perf_counter()
        client.embed([fresh()], model=MODEL, tenant="search", priority="high", timeout=120)
        seconds.append(time.perf_counter() - t0)
        time.sleep(QUERY_GAP_S)
    return seconds


def _beside(
    job: Callable[[], float], client: Any, fresh: Callable[[], str]
) -> tuple[float, list[float]]:
    """``job``'s inputs/s with the queries running beside it, and the queries' latencies."""
    from concurrent.futures import ThreadPoolExecutor

    done = threading.Event()
    with ThreadPoolExecutor(1) as pool:
        searcher = pool.submit(_queries, client, done.is_set, fresh)
        try:
            rate = job()
        finally:
            done.set()
        return rate, searcher.result()


def run_embed_priority(url: str, *, n: int, repeats: int) -> dict[str, Any]:
    """The three phases (see the module's docstring)."""
    import itertools

    import redis
    from genq.producer import Client

    queue, consumer = f"bench-embed-priority-{time.time_ns()}", "embed-priority"
    proc = start_worker(redis_url=url, queue=queue, consumer=consumer, model=MODEL)
    client = Client.from_url(url, queue)
    numbers = itertools.count()
    words = workload(200, seed=99)

    def fresh() -> str:
        i = next(numbers)
        return f"query {i}: " + words[i % len(words)][:60]

    def job(seed: int) -> float:
        texts = workload(n, seed=seed)
        t0 = time.perf_counter()
        client.embed_many(texts, model=MODEL, tenant="indexer", priority="low", timeout=3600)
        return n / (time.perf_counter() - t0)

    try:
        wait_until_serving(redis.Redis.from_url(url), queue, consumer, proc)
        client.embed_many(workload(200, seed=7), model=MODEL, timeout=600)  # warm-up, untimed
        count = iter(range(IDLE_QUERIES))
        idle = _queries(client, lambda: next(count, None) is None, fresh)
        alone: list[float] = []
        beside: list[float] = []
        busy: list[float] = []
        for i in range(repeats):
            for phase in ("alone", "together") if i % 2 == 0 else ("together", "alone"):
                seed = 1000 + 2 * i + (phase == "together")
                if phase == "alone":
                    alone.append(job(seed))
                    continue
                rate, waits = _beside(functools.partial(job, seed), client, fresh)
                beside.append(rate)
                busy += waits
    finally:
        client.close()
        stop_worker(proc)
    return _summary(n, repeats, idle, busy, alone, beside)


def _summary(
    n: int,
    repeats: int,
    idle: list[float],
    busy: list[float],
    alone: list[float],
    beside: list[float],
) -> dict[str, Any]:
    def pct(values: list[float], q: float) -> float:
        ordered = sorted(values)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000

    queries = {
        name: {"queries": len(v), "p50_ms": pct(v, 0.5), "p99_ms": pct(v, 0.99)}
        for name, v in (("idle", idle), ("beside the job", busy))
    }
    idle_row, busy_row = queries["idle"], queries["beside the job"]
    return {
        "inputs": n,
        "repeats": repeats,
        "queries": queries,
        "p50_over_idle": busy_row["p50_ms"] / idle_row["p50_ms"],
        "p99_over_idle": busy_row["p99_ms"] / idle_row["p99_ms"],
        "job_inputs_per_s": {
            "alone": statistics.median(alone),
            "beside the queries": statistics.median(beside),
            "runs_alone": [round(x) for x in alone],
            "runs_beside": [round(x) for x in beside],
        },
        "job_beside_over_alone": statistics.median(beside) / statistics.median(alone),
    }


def embed_priority_markdown(res: dict[str, Any]) -> str:
    job = res["job_inputs_per_s"]
    lines = [
        f"an indexing job of {res['inputs']} inputs (tenant indexer, low) and single queries "
        f"(tenant search, high), {MODEL}, {res['repeats']} round(s) taking turns",
        "",
        "| search's queries | count | p50 ms | p99 ms |",
        "|---|---|---|---|",
    ]
    for name, row in res["queries"].items():
        lines.append(f"| {name} | {row['queries']} | {row['p50_ms']:.0f} | {row['p99_ms']:.0f} |")
    lines += [
        "",
        f"queries beside the job ÷ idle: p50 {res['p50_over_idle']:.2f}x, p99 "
        f"{res['p99_over_idle']:.2f}x; the job's inputs/s: {job['alone']:.0f} alone "
        f"{job['runs_alone']}, {job['beside the queries']:.0f} beside the queries "
        f"{job['runs_beside']}: {res['job_beside_over_alone']:.2f}x",
    ]
    return "\n".join(lines)


def run_and_print(params: dict[str, Any]) -> None:
    """``genq bench --scenario embed-priority`` with the command's parameters (``--quick``,
    ``--repeats``, ``--redis-url``, ``--json``)."""
    from genq.worker.bench.modes import report_on_redis

    n, repeats = (QUICK_INPUTS, 1) if params["quick"] else (INPUTS, params["repeats"])
    report_on_redis(
        params, lambda url: run_embed_priority(url, n=n, repeats=repeats), embed_priority_markdown
    )
