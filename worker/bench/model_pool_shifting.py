"""``genq bench --scenario model-pool``'s shifting-demand case: the hot model changes between
phases, and a fleet of pool workers must follow it.

``PHASES`` phases of ``PHASE_S`` each: at a phase's start, a backlog of ``HOT`` requests for
that phase's hot model (A, then B, then C), and through the phase one request every
``TRICKLE_EVERY_S`` for each other model. Measured per phase: the fleet's loads, and the hot
model's tokens/s from its first request's start to its last one's end (after the swap to it),
against a fleet of the same size started with the right model (``WORKERS`` workers of the hot
model alone, the same backlog, no trickle): the ratio is what following the demand costs.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

Fleet = Callable[[str, tuple[str, ...]], list[Any]]
"""Starts a fleet serving on a queue: a pool's workers of the models given, or (one model)
workers of that model alone; returns their processes, serving."""

PHASES = ("A", "B", "C")
PHASE_S = 60.0
HOT = 12_000
"""A phase's backlog of its hot model: what the fleet drains in about 40 s of the phase."""
TRICKLE_EVERY_S = 2.0


def _stop(procs: list[Any]) -> None:
    for proc in procs:
        proc.terminate()
    for proc in procs:
        proc.wait(timeout=30)


def _tokens_per_s(results: list[Any]) -> float:
    start = min(int(x.timings.started_unix_ms) for x in results)
    end = max(int(x.timings.finished_unix_ms) for x in results)
    return float(sum(x.usage.completion_tokens for x in results) / max(1e-3, (end - start) / 1000))


def _loads(r: Any, queue: str, workers: int) -> int:
    from genq.common.keys import Keys

    keys = Keys(queue)
    return sum(int(r.hget(keys.worker(f"w{i}"), "model_loads") or 0) for i in range(workers))


def _phase(
    client: Any, hot: str, models: tuple[str, ...], new_tokens: int, trickle: bool
) -> tuple[list[str], dict[str, str]]:
    """One phase's requests: the hot backlog at once, then the trickle through ``PHASE_S``
    (its ids with their models)."""
    bodies = [{"prompt": f"{hot} {i}", "model": hot} for i in range(HOT)]
    hot_ids = client.submit_many(bodies, max_new_tokens=new_tokens)
    others: dict[str, str] = {}
    end = time.monotonic() + (PHASE_S if trickle else 0)
    while time.monotonic() < end:
        for model in models:
            if model != hot:
                others[client.submit(f"t {model}", model=model, max_new_tokens=new_tokens)] = model
        time.sleep(TRICKLE_EVERY_S)
    return hot_ids, others


def run_shifting(
    redis_url: str, fleet: Fleet, models: tuple[str, ...], new_tokens: int, workers: int
) -> list[dict[str, Any]]:
    """Per phase: the pool fleet's loads and tokens/s against the right-model fleet's (both
    of ``workers`` started by ``fleet``; the pool's of ``models``)."""
    import redis
    from genq.producer import Client

    r = redis.Redis.from_url(redis_url)
    rows: list[dict[str, Any]] = []
    queue = "bench-pool-shifting"
    procs = fleet(queue, models)
    client = Client.from_url(redis_url, queue)
    try:
        for hot in PHASES:
            before = _loads(r, queue, workers)
            hot_ids, others = _phase(client, hot, models, new_tokens, trickle=True)
            results = client.results(hot_ids, timeout=600)
            trickled = client.results(list(others), timeout=600)
            rows.append(
                {
                    "hot": hot,
                    "loads": _loads(r, queue, workers) - before,
                    "pool_tokens_per_s": round(_tokens_per_s(results)),
                    "trickle_wait_max_ms": max(int(x.timings.queue_wait_ms or 0) for x in trickled),
                    "wrong_model": sum(1 for x in results if x.model != hot)
                    + sum(1 for x in trickled if x.model != others[x.id]),
                    "succeeded": sum(1 for x in [*results, *trickled] if x.status == "succeeded"),
                    "requests": len(results) + len(trickled),
                }
            )
    finally:
        client.close()
        _stop(procs)
    for row in rows:
        queue = f"bench-pool-right-{row['hot']}"
        procs = fleet(queue, (row["hot"],))
        client = Client.from_url(redis_url, queue)
        try:
            hot_ids, _ = _phase(client, row["hot"], models, new_tokens, trickle=False)
            right = _tokens_per_s(client.results(hot_ids, timeout=600))
        finally:
            client.close()
            _stop(procs)
        row["right_tokens_per_s"] = round(right)
        row["ratio"] = round(row["pool_tokens_per_s"] / right, 3)
    return rows


def shifting_markdown(rows: list[dict[str, Any]], workers: int) -> str:
    """The BENCHMARKS.md lines."""
    lines = [
        f"**Shifting demand**: {len(PHASES)} phases of {PHASE_S:g} s; at each phase's start "
        f"{HOT:,} requests for its hot model, and one request for each other model every "
        f"{TRICKLE_EVERY_S:g} s through the phase. The hot model's tokens/s from its first "
        f"start to its last end, against {workers} workers started with the hot model alone.",
        "",
        "| hot | loads | tokens/s | right-model fleet's | ratio | trickle's longest wait ms "
        "| succeeded | wrong model |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for x in rows:
        lines.append(
            f"| {x['hot']} | {x['loads']} | {x['pool_tokens_per_s']} | "
            f"{x['right_tokens_per_s']} | {x['ratio']} | {x['trickle_wait_max_ms']} | "
            f"{x['succeeded']} of {x['requests']} | {x['wrong_model']} |"
        )
    return "\n".join(lines)
