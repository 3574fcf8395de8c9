"""``genq bench --scenario adapters [--engine vllm]``: LoRA adapters per request (#37).

One worker on smollm2-135m, the same greedy workload three ways, taking turns, each on a fresh
worker and queue:

- **base**: no adapters, every request for the base model;
- **4 adapters mixed**: ``--lora`` x 4, the requests naming them in rotation (one batch holds
  rows of several adapters);
- **4 adapters, --max-loras 2**: the same, with two resident at once: the others load on
  demand (static: batches run in parts; the stats hash counts ``adapter_loads``).

Reported: generated tokens/s over the makespan (median of the rounds), the ratio to the base,
requests served, and the loads counted. Adapters are built offline
(``build_tiny_adapter``: random non-zero LoRA weights on the attention's projections).
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

REQUESTS = 64
MAX_NEW_TOKENS = 32
ADAPTERS = 4
CONFIGS = ("base", "4 adapters mixed", "4 adapters, --max-loras 2")
ENGINE_ARGS = '{"enforce_eager": true}'


def _prompts() -> list[str]:
    things = ("a lighthouse", "a bakery", "a glacier", "a violin", "a harbor", "an orchard")
    return [
        f"Describe {things[i % len(things)]} in the style of report {i}." for i in range(REQUESTS)
    ]


def run_config(
    redis_url: str, queue: str, config: str, engine: str, paths: list[str]
) -> dict[str, Any]:
    """One run of the workload on a fresh worker (``config``: one of ``CONFIGS``)."""
    import redis
    from genq.common.keys import Keys
    from genq.producer import Client
    from genq.worker.devtools.worker_process import start_worker, wait_until_serving

    names = [f"lora{i}" for i in range(len(paths))]
    extra: tuple[str, ...] = ("--max-batch-size", "16", "--max-batch-tokens", "4096")
    if engine == "vllm":
        extra += ("--vllm-args", ENGINE_ARGS)
    if config != "base":
        extra += tuple(f"--lora={n}={p}" for n, p in zip(names, paths, strict=True))
    if config.endswith("--max-loras 2"):
        extra += ("--max-loras", "2")
    r = redis.Redis.from_url(redis_url)
    consumer = f"{queue}-w"
    where: dict[str, Any] = {"redis_url": redis_url, "queue": queue, "consumer": consumer}
    proc = start_worker(**where, engine=engine, model="smollm2-135m", extra_args=extra)
    try:
        wait_until_serving(r, queue, consumer, proc, timeout_s=600)
        with Client(r, queue) as client:
            client.generate("Warm up.", max_new_tokens=2, timeout=300)
            items = [
                {"prompt": p, **({} if config == "base" else {"model": names[i % len(names)]})}
                for i, p in enumerate(_prompts())
            ]
            t0 = time.perf_counter()
            results = client.results(
                # Every row runs its MAX_NEW_TOKENS (ignore_eos): the same work in every
                # configuration, whatever text an adapter makes.
                client.submit_many(items, max_new_tokens=MAX_NEW_TOKENS, ignore_eos=True),
                timeout=1800,
            )
            makespan = time.perf_counter() - t0
        loads = int(r.hget(Keys(queue).worker(consumer), "adapter_loads") or 0)
    finally:
        proc.terminate()
        proc.wait(timeout=120)
    generated = sum(x.usage.completion_tokens for x in results)
    return {
        "served": sum(x.status == "succeeded" for x in results),
        "tokens_per_s": round(generated / makespan, 1),
        "makespan_s": round(makespan, 2),
        "adapter_loads": loads,
        "models": sorted({str(x.model) for x in results}),
    }


def run_adapters(redis_url: str, *, engine: str, rounds: int) -> dict[str, Any]:
    """``rounds`` of each configuration, taking turns."""
    from genq.worker.engines.lora_builder import build_tiny_adapter

    runs: dict[str, list[dict[str, Any]]] = {c: [] for c in CONFIGS}
    with tempfile.TemporaryDirectory() as tmp:
        paths = [
            str(build_tiny_adapter(Path(tmp) / f"lora{i}", seed=i + 1, base="smollm2-135m"))
            for i in range(ADAPTERS)
        ]
        for k in range(rounds):
            order = CONFIGS[k % 3 :] + CONFIGS[: k % 3]
            for config in order:
                queue = f"bench-adapters-{engine}-{k}-{CONFIGS.index(config)}"
                runs[config].append(run_config(redis_url, queue, config, engine, paths))
    return {"engine": engine, "rounds": rounds, "runs": runs}


def adapters_markdown(res: dict[str, Any]) -> str:
    """The BENCHMARKS.md table."""
    base = statistics.median(r["tokens_per_s"] for r in res["runs"]["base"])
    lines = [
        f"One `{res['engine']}` worker on smollm2-135m (16 slots, 4,096-token budget); "
        f"{REQUESTS} greedy requests of {MAX_NEW_TOKENS} new tokens (ignore_eos) at once; "
        f"{ADAPTERS} adapters of rank 8 on q/k/v/o, named in rotation; medians of "
        f"{res['rounds']} rounds, configurations taking turns.",
        "",
        "| configuration | tokens/s | x base | served | adapter loads (swaps) |",
        "|---|---|---|---|---|",
    ]
    for config, runs in res["runs"].items():
        tps = statistics.median(r["tokens_per_s"] for r in runs)
        served = min(r["served"] for r in runs)
        loads = "/".join(str(r["adapter_loads"]) for r in runs)
        lines.append(
            f"| {config} | {tps:.1f} | {tps / base:.2f}x | {served} / {REQUESTS} | {loads} |"
        )
    return "\n".join(lines)


def run_and_print(params: dict[str, Any]) -> None:
    """``genq bench --scenario adapters`` with the command's parameters."""
    from genq.worker.bench.modes import report_on_redis

    engine = "vllm" if params.get("bench_engine") == "vllm" else "static"
    rounds = 1 if params["quick"] else 2
    report_on_redis(
        params, lambda url: run_adapters(url, engine=engine, rounds=rounds), adapters_markdown
    )
