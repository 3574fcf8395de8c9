"""``genq bench --scenario aging``: queue waits per priority under a saturating backlog.

A backlog of low-priority requests far larger than a batch is enqueued first; then, while it is
being served, high- and normal-priority requests arrive a few at a time. Each request's queue
wait (enqueue to start, as the worker records it) is collected per priority. The claim to check:
a high-priority request waits about one batch (continuous engine: one free slot), however deep
the low backlog is, and low-priority work still moves (aging bounds its wait).
"""

from __future__ import annotations

import time
from typing import Any

from genq.common.connection import connect
from genq.common.models import PRIORITIES
from genq.producer import Client
from genq.worker.bench.modes import percentile
from genq.worker.devtools.worker_process import start_worker, wait_until_serving

PROMPT = "a request of moderate length for the priority scenario"


def run_aging_scenario(
    redis_url: str,
    *,
    model: str = "tiny",
    engine: str = "continuous",
    backlog: int = 300,
    arrivals: int = 30,
    every_s: float = 0.2,
    max_new_tokens: int = 32,
    max_batch_size: int = 16,
    queue: str = "prio-bench",
    extra_worker_args: tuple[str, ...] = (),
) -> dict[str, Any]:
    """Run the scenario against a fresh ``genq worker``; per priority: count, wait p50/p99
    (ms). Also the median batch (or request) generation time, for scale."""
    r = connect(redis_url)
    consumer = f"prio-{int(time.time() * 1000)}"
    proc = start_worker(
        redis_url=redis_url,
        queue=queue,
        model=model,
        engine=engine,
        consumer=consumer,
        max_batch_size=max_batch_size,
        max_wait_ms=0,
        extra_args=extra_worker_args,
    )
    try:
        wait_until_serving(r, queue, consumer, proc, timeout_s=120)
        client = Client(r, queue)
        client.generate("warm up", max_new_tokens=2, timeout=120)
        ids = {
            "low": client.submit_many(
                [PROMPT] * backlog, max_new_tokens=max_new_tokens, priority="low"
            )
        }
        ids["high"], ids["normal"] = [], []
        for _ in range(arrivals):
            time.sleep(every_s)
            ids["high"] += client.submit_many(
                [PROMPT], max_new_tokens=max_new_tokens, priority="high"
            )
            ids["normal"] += client.submit_many(
                [PROMPT], max_new_tokens=max_new_tokens, priority="normal"
            )
        results = {p: client.results(v, timeout=1200) for p, v in ids.items()}
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    out: dict[str, Any] = {
        "engine": engine,
        "model": model,
        "backlog_low": backlog,
        "arrivals_per_priority": arrivals,
        "every_s": every_s,
        "max_batch_size": max_batch_size,
        "priorities": {},
    }
    gen_ms = []
    for priority, res in results.items():
        waits = [float(x.timings.queue_wait_ms or 0) for x in res]
        gen_ms += [float(x.timings.generation_ms or 0) for x in res]
        out["priorities"][priority] = {
            "requests": len(res),
            "succeeded": sum(1 for x in res if x.status == "succeeded"),
            "wait_p50_ms": percentile(waits, 0.5),
            "wait_p99_ms": percentile(waits, 0.99),
        }
    out["generation_p50_ms"] = percentile(gen_ms, 0.5)
    return out


def aging_markdown(res: dict[str, Any]) -> str:
    """The scenario as a BENCHMARKS.md table."""
    lines = [
        f"Engine {res['engine']}, model {res['model']}, max batch size {res['max_batch_size']}: "
        f"{res['backlog_low']} low-priority requests enqueued at once, then one high and one "
        f"normal every {res['every_s']} s ({res['arrivals_per_priority']} each). Median "
        f"generation time of a batch (static) or request (continuous): "
        f"{res['generation_p50_ms']:.0f} ms.",
        "",
        "| priority | requests | succeeded | wait p50 ms | wait p99 ms |",
        "|---|---|---|---|---|",
    ]
    for p in PRIORITIES:
        d = res["priorities"][p]
        lines.append(
            f"| {p} | {d['requests']} | {d['succeeded']} | {d['wait_p50_ms']:.0f} | "
            f"{d['wait_p99_ms']:.0f} |"
        )
    return "\n".join(lines)
