"""``genq bench --scenario model-pool``: a fleet of echo workers, each with a pool of models
it swaps between, under the three swap policies taking turns.

Each case starts a fresh fleet on its own queue: workers of ``--engine echo`` with the pool's
models (``--model`` repeated), ``--resident-models 1`` and ``--echo-load-ms LOAD_MS``, so a
load costs real seconds and the fleet's decisions are measured without real models.

- **thrash**: ``REQUESTS`` requests over the pool's models, Zipf-popular, in mixed order (A B A
  A C ...), submitted in ``WAVES`` waves: the makespan (first submission to last result), the
  loads summed over the fleet, and the requests answered by another model than the one they
  named (each must be 0).
- **starvation**: a steady backlog of the popular model and one request for the rarest every
  ``RARE_EVERY_S``, on the fleet and on one worker: how long each rare request waited to start
  (p50, the longest), against the bound (``--model-wait-ms`` plus a load).
- **priority**: a backlog of low requests for the resident model, then ``HIGH`` high ones for a
  cold one: how long the high ones waited to start, against a load plus 1 s.
- **shifting demand** (``model_pool_shifting.py``): the hot model changes phase by phase; the
  fleet's tokens/s against one started with the right model;
- **real models** (``model_pool_real.py``): one CPU worker swapping between three real models;
  its answers against each prompt alone, the load times, and its memory swap after swap.
"""

from __future__ import annotations

import contextlib
import random
import statistics
import time
from collections.abc import Iterator
from typing import Any

from genq.worker.bench.model_pool_real import WARM, real_pool_markdown, run_real_pool
from genq.worker.bench.model_pool_shifting import run_shifting, shifting_markdown

MODELS = ("A", "B", "C", "D")
POLICIES = ("backlog", "arrival", "collate")
WORKERS = 2
LOAD_MS = 1500
REQUESTS = 1200
WAVES = 6
WAVE_GAP_S = 1.0
STEP_MS = 20.0
NEW_TOKENS = 8
MODEL_WAIT_MS = 10_000
MIN_RESIDENT_MS = 2_000
RARE_EVERY_S = 2.0
RARE_REQUESTS = 12
STEADY = 500
"""A's requests every ``RARE_EVERY_S``: more than one worker drains in that time."""
HIGH = 4


def _fleet(redis_url: str, queue: str, policy: str, workers: int = WORKERS) -> list[Any]:
    from genq.worker.devtools.worker_process import start_worker

    args: list[str] = []
    for model in MODELS:
        args += ["--model", model]
    args += ["--engine", "echo", "--resident-models", "1", "--echo-load-ms", str(LOAD_MS)]
    args += ["--echo-step-ms", str(STEP_MS), "--swap-policy", policy]
    args += ["--model-wait-ms", str(MODEL_WAIT_MS), "--min-resident-ms", str(MIN_RESIDENT_MS)]
    return [
        start_worker(redis_url=redis_url, queue=queue, consumer=f"w{i}", extra_args=tuple(args))
        for i in range(workers)
    ]


def _shifting_fleet(redis_url: str, queue: str, models: tuple[str, ...]) -> list[Any]:
    """The shifting case's fleets: the pool's (``backlog``), or workers of one model alone."""
    from genq.worker.devtools.worker_process import start_worker

    if len(models) > 1:
        procs = _fleet(redis_url, queue, "backlog")
    else:
        args: tuple[str, ...] = ("--engine", "echo", "--served-model-name", models[0])
        args += ("--echo-step-ms", str(STEP_MS))
        procs = [
            start_worker(redis_url=redis_url, queue=queue, consumer=f"w{i}", extra_args=args)
            for i in range(WORKERS)
        ]
    _serving(redis_url, queue, procs)
    return procs


def _serving(redis_url: str, queue: str, procs: list[Any]) -> None:
    import redis
    from genq.worker.devtools.worker_process import wait_until_serving

    r = redis.Redis.from_url(redis_url)
    for i, proc in enumerate(procs):
        wait_until_serving(r, queue, f"w{i}", proc, timeout_s=60)


def _loads(redis_url: str, queue: str) -> int:
    import redis
    from genq.common.keys import Keys

    r = redis.Redis.from_url(redis_url)
    keys = Keys(queue)
    return sum(int(r.hget(keys.worker(f"w{i}"), "model_loads") or 0) for i in range(WORKERS))


@contextlib.contextmanager
def _running(redis_url: str, queue: str, policy: str, workers: int = WORKERS) -> Iterator[Any]:
    """A fresh fleet on ``queue`` under ``policy``, serving; a client of it; all stopped after."""
    from genq.producer import Client

    procs = _fleet(redis_url, queue, policy, workers)
    try:
        _serving(redis_url, queue, procs)
        client = Client.from_url(redis_url, queue)
        try:
            yield client
        finally:
            client.close()
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=30)


def _thrash(redis_url: str, policy: str) -> dict[str, Any]:
    queue = f"bench-pool-thrash-{policy}"
    with _running(redis_url, queue, policy) as client:
        rnd = random.Random(7)
        weights = [1 / (k + 1) for k in range(len(MODELS))]  # Zipf
        models = rnd.choices(MODELS, weights=weights, k=REQUESTS)
        per_wave = REQUESTS // WAVES
        t0 = time.monotonic()
        ids: list[str] = []
        for w in range(WAVES):
            wave = models[w * per_wave : (w + 1) * per_wave]
            bodies = [{"prompt": f"row {w}-{j}", "model": m} for j, m in enumerate(wave)]
            ids += client.submit_many(bodies, max_new_tokens=NEW_TOKENS)
            time.sleep(WAVE_GAP_S)
        results = client.results(ids, timeout=600)
        makespan = time.monotonic() - t0
        loads = _loads(redis_url, queue)
    return {
        "policy": policy,
        "makespan_s": round(makespan, 2),
        "loads": loads,
        "succeeded": sum(1 for x in results if x.status == "succeeded"),
        "wrong_model": sum(1 for x, m in zip(results, models, strict=True) if x.model != m),
    }


def _started_after_ms(client: Any, ids: list[str]) -> list[int]:
    """How long each request waited to start: its final state's queue wait."""
    results = client.results(ids, timeout=600)
    return [int(x.timings.queue_wait_ms or 0) for x in results]


def _starvation(redis_url: str, policy: str, workers: int = WORKERS) -> dict[str, Any]:
    queue = f"bench-pool-starve-{policy}-{workers}"
    with _running(redis_url, queue, policy, workers) as client:
        steady, rare = [], []
        t_end = time.monotonic() + RARE_EVERY_S * RARE_REQUESTS
        j = 0
        while time.monotonic() < t_end:
            bodies = [{"prompt": f"a {j}-{k}", "model": "A"} for k in range(STEADY)]
            steady += client.submit_many(bodies, max_new_tokens=NEW_TOKENS)
            rare.append(client.submit(f"rare {j}", model="D", max_new_tokens=NEW_TOKENS))
            j += 1
            time.sleep(RARE_EVERY_S)
        waits = _started_after_ms(client, rare)
        client.results(steady, timeout=600)
    return {
        "policy": policy,
        "workers": workers,
        "rare_wait_p50_ms": int(statistics.median(waits)),
        "rare_wait_max_ms": max(waits),
        "bound_ms": MODEL_WAIT_MS + LOAD_MS,
    }


def _priority(redis_url: str, policy: str) -> dict[str, Any]:
    with _running(redis_url, f"bench-pool-priority-{policy}", policy) as client:
        bodies = [{"prompt": f"low {k}", "model": "A"} for k in range(4000)]
        low = client.submit_many(bodies, max_new_tokens=NEW_TOKENS, priority="low")
        time.sleep(MIN_RESIDENT_MS / 1000 + 1.0)  # past the resident model's minimum
        high = [
            client.submit(f"high {k}", model="B", priority="high", max_new_tokens=NEW_TOKENS)
            for k in range(HIGH)
        ]
        waits = _started_after_ms(client, high)
        client.results(low, timeout=600)
    return {
        "policy": policy,
        "high_wait_max_ms": max(waits),
        "bound_ms": LOAD_MS + 1000,
    }


def run_model_pool(redis_url: str) -> dict[str, Any]:
    """Every case under every policy, the policies taking turns."""
    out: dict[str, Any] = {"thrash": [], "starvation": [], "priority": []}
    for policy in POLICIES:
        out["thrash"].append(_thrash(redis_url, policy))
    for workers in (WORKERS, 1):
        for policy in ("backlog", "collate"):
            out["starvation"].append(_starvation(redis_url, policy, workers))
    out["priority"].append(_priority(redis_url, "backlog"))
    out["shifting"] = run_shifting(
        redis_url, lambda q, ms: _shifting_fleet(redis_url, q, ms), MODELS, NEW_TOKENS, WORKERS
    )
    out["real"] = [run_real_pool(redis_url), run_real_pool(redis_url, warm=WARM)]
    return out


def model_pool_markdown(res: dict[str, Any]) -> str:
    """The BENCHMARKS.md lines."""
    lines = [
        f"{WORKERS} echo workers, a pool of {len(MODELS)} models, `--resident-models 1`, "
        f"`--echo-load-ms {LOAD_MS}`, `--echo-step-ms {STEP_MS:g}`, {NEW_TOKENS} new tokens a "
        f"request, `--model-wait-ms {MODEL_WAIT_MS}`, `--min-resident-ms {MIN_RESIDENT_MS}`.",
        "",
        f"**Thrash**: {REQUESTS} requests, Zipf over the models, in {WAVES} waves "
        f"{WAVE_GAP_S:g} s apart.",
        "",
        "| policy | makespan s | loads | succeeded | wrong model |",
        "|---|---:|---:|---:|---:|",
    ]
    for x in res["thrash"]:
        lines.append(
            f"| {x['policy']} | {x['makespan_s']} | {x['loads']} | {x['succeeded']} | "
            f"{x['wrong_model']} |"
        )
    lines += [
        "",
        f"**Starvation**: {STEADY} requests of A and one of D every {RARE_EVERY_S:g} s, "
        f"{RARE_REQUESTS} times.",
        "",
        "| workers | policy | D's wait p50 ms | D's wait max ms | bound ms |",
        "|---:|---|---:|---:|---:|",
    ]
    for x in res["starvation"]:
        lines.append(
            f"| {x['workers']} | {x['policy']} | {x['rare_wait_p50_ms']} | "
            f"{x['rare_wait_max_ms']} | {x['bound_ms']} |"
        )
    lines += [
        "",
        f"**Priority**: 4,000 low requests for A, then {HIGH} high ones for cold B.",
        "",
        "| policy | the high ones' longest wait ms | bound ms |",
        "|---|---:|---:|",
    ]
    for x in res["priority"]:
        lines.append(f"| {x['policy']} | {x['high_wait_max_ms']} | {x['bound_ms']} |")
    if "shifting" in res:
        lines += ["", shifting_markdown(res["shifting"], WORKERS)]
    if "real" in res:
        lines += ["", real_pool_markdown(res["real"])]
    return "\n".join(lines)


def run_and_print(params: dict[str, Any]) -> None:
    """``genq bench --scenario model-pool`` with the command's parameters."""
    from genq.worker.bench.modes import report_on_redis

    report_on_redis(params, run_model_pool, model_pool_markdown)
