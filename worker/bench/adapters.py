"""``genq bench --scenario adapters [--engine vllm]``: LoRA adapters per request.

One worker on smollm2-135m (or ``--model``, on ``--device``), the same greedy workload three
ways, taking turns, each on a fresh worker and queue:

- **base**: no adapters, every request for the base model;
- **4 adapters mixed**: ``--lora`` x 4, the requests naming them in rotation (one batch holds
  rows of several adapters);
- **4 adapters, --max-loras 2**: the same, with two resident at once: the others load on
  demand (static: batches run in parts; the stats hash counts ``adapter_loads``).

And a fleet (static engine): two workers with the same 4 adapters, ``--max-loras 2`` each,
requests for all four arriving in waves, the read's placement off and on: how many adapters
the fleet loads (on: each worker keeps two, and the read gives it their requests).

Reported: generated tokens/s over the makespan (median of the rounds), the ratio to the base,
requests served, and the loads counted. Adapters are built offline
(``build_tiny_adapter``: random non-zero LoRA weights on the attention's projections).
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, TypedDict

import click
from click.core import ParameterSource

REQUESTS = 64
MAX_NEW_TOKENS = 32
ADAPTERS = 4
CONFIGS = ("base", "4 adapters mixed", "4 adapters, --max-loras 2")
ENGINE_ARGS = '{"enforce_eager": true}'
MODEL = "smollm2-135m"
"""The model unless ``--model`` says another (its adapters are built for it, offline)."""


class Model(TypedDict):
    """The worker's model and device (``genq worker --model --device``)."""

    model: str
    device: str


def _prompts() -> list[str]:
    things = ("a lighthouse", "a bakery", "a glacier", "a violin", "a harbor", "an orchard")
    return [
        f"Describe {things[i % len(things)]} in the style of report {i}." for i in range(REQUESTS)
    ]


def run_config(
    redis_url: str, queue: str, config: str, engine: str, paths: list[str], on: Model
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
    proc = start_worker(**where, engine=engine, **on, extra_args=extra)
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


FLEET = ("placement off (--no-prefix-aware)", "placement on")
FLEET_WAVES, FLEET_WAVE, FLEET_TOKENS = 16, 4, 16
"""The fleet case's traffic: FLEET_WAVES waves of FLEET_WAVE requests (the 4 adapters in
rotation), one every FLEET_GAP_S, of FLEET_TOKENS new tokens each: a fleet with room to
spare, where each read finds a few requests of every adapter."""
FLEET_GAP_S = 1.0


def run_fleet(
    redis_url: str, queue: str, placement: bool, paths: list[str], on: Model
) -> dict[str, Any]:
    """Two static workers serving the same 4 adapters, ``--max-loras 2`` each, fed waves of
    requests for them in rotation: how many adapter loads the fleet makes, with the read's
    placement (the worker that has an adapter loaded gets its requests) on or off."""
    import redis
    from genq.common.keys import Keys
    from genq.producer import Client
    from genq.worker.devtools.worker_process import start_worker, wait_until_serving

    names = [f"lora{i}" for i in range(len(paths))]
    extra: tuple[str, ...] = ("--max-batch-size", "16", "--max-batch-tokens", "4096")
    extra += ("--max-loras", "2")
    extra += tuple(f"--lora={n}={p}" for n, p in zip(names, paths, strict=True))
    extra += () if placement else ("--no-prefix-aware",)
    r = redis.Redis.from_url(redis_url)
    consumers = [f"{queue}-w{i}" for i in range(2)]

    def loads() -> int:  # the fleet's adapter loads so far (the workers' stats hashes)
        return sum(int(r.hget(Keys(queue).worker(c), "adapter_loads") or 0) for c in consumers)

    procs = [
        start_worker(
            redis_url=redis_url,
            queue=queue,
            consumer=c,
            engine="static",
            **on,
            extra_args=extra,
            env={"OMP_NUM_THREADS": "1"},  # two torch processes on the cores, one each
        )
        for c in consumers
    ]
    try:
        for c, proc in zip(consumers, procs, strict=True):
            wait_until_serving(r, queue, c, proc, timeout_s=600)
        with Client(r, queue) as client:
            client.generate("Warm up.", max_new_tokens=2, timeout=300)
            loads_before = loads()
            prompts, ids = _prompts(), []
            t0 = time.perf_counter()
            for w in range(FLEET_WAVES):
                wave = [
                    {
                        "prompt": prompts[(w * FLEET_WAVE + j) % len(prompts)],
                        "model": names[j % len(names)],
                    }
                    for j in range(FLEET_WAVE)
                ]
                ids += client.submit_many(wave, max_new_tokens=FLEET_TOKENS, ignore_eos=True)
                time.sleep(max(0.0, t0 + (w + 1) * FLEET_GAP_S - time.perf_counter()))
            results = client.results(ids, timeout=1800)
            makespan = time.perf_counter() - t0
        time.sleep(3.0)  # the workers' last counts reach their stats hashes
        loaded = loads() - loads_before
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=120)
    spread = {n: len({x.worker for x in results if x.model == n}) for n in names}
    return {
        "served": sum(x.status == "succeeded" for x in results),
        "makespan_s": round(makespan, 2),
        "adapter_loads": loaded,
        "workers_per_adapter": round(statistics.mean(spread.values()), 2),
        "wait_p50_ms": statistics.median(x.timings.queue_wait_ms or 0 for x in results),
    }


def run_adapters(
    redis_url: str, *, engine: str, rounds: int, model: str = MODEL, device: str = "cpu"
) -> dict[str, Any]:
    """``rounds`` of each configuration, taking turns, on ``model`` and ``device``."""
    from genq.worker.engines.lora_builder import build_tiny_adapter

    on: Model = {"model": model, "device": device}
    runs: dict[str, list[dict[str, Any]]] = {c: [] for c in CONFIGS}
    with tempfile.TemporaryDirectory() as tmp:
        paths = [
            str(build_tiny_adapter(Path(tmp) / f"lora{i}", seed=i + 1, base=model))
            for i in range(ADAPTERS)
        ]
        fleet: dict[str, list[dict[str, Any]]] = {c: [] for c in FLEET}
        for k in range(rounds):
            order = CONFIGS[k % 3 :] + CONFIGS[: k % 3]
            for config in order:
                queue = f"bench-adapters-{engine}-{k}-{CONFIGS.index(config)}"
                runs[config].append(run_config(redis_url, queue, config, engine, paths, on))
            for config in (FLEET if k % 2 == 0 else FLEET[::-1]) if engine == "static" else ():
                queue = f"bench-adapters-fleet-{k}-{FLEET.index(config)}"
                placed = config == FLEET[1]
                fleet[config].append(run_fleet(redis_url, queue, placed, paths, on))
    return {"engine": engine, **on, "rounds": rounds, "runs": runs, "fleet": fleet}


def adapters_markdown(res: dict[str, Any]) -> str:
    """The BENCHMARKS.md table."""
    base = statistics.median(r["tokens_per_s"] for r in res["runs"]["base"])
    lines = [
        f"One `{res['engine']}` worker on {res.get('model', MODEL)} "
        f"({res.get('device', 'cpu')}, 16 slots, 4,096-token budget); "
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
    if res.get("fleet", {}).get(FLEET[0]):
        lines += ["", *_fleet_markdown(res["fleet"])]
    return "\n".join(lines)


def _fleet_markdown(fleet: dict[str, list[dict[str, Any]]]) -> list[str]:
    n = FLEET_WAVES * FLEET_WAVE
    lines = [
        f"Two static workers (one torch thread each), the same {ADAPTERS} adapters, "
        f"`--max-loras 2` each; {FLEET_WAVES} waves of {FLEET_WAVE} requests (one per adapter), "
        f"one a second, {FLEET_TOKENS} new tokens each; medians, the two taking turns.",
        "",
        "| placement | adapter loads (runs) | workers per adapter | makespan s | wait p50 ms "
        "| served |",
        "|---|---|---|---|---|---|",
    ]
    for config, runs in fleet.items():
        loads = "/".join(str(r["adapter_loads"]) for r in runs)
        spread = statistics.median(r["workers_per_adapter"] for r in runs)
        makespan = statistics.median(r["makespan_s"] for r in runs)
        wait = statistics.median(r["wait_p50_ms"] for r in runs)
        served = min(r["served"] for r in runs)
        lines.append(
            f"| {config} | {loads} | {spread:.2f} | {makespan:.1f} | {wait:.0f} | {served} / {n} |"
        )
    return lines


def run_and_print(params: dict[str, Any]) -> None:
    """``genq bench --scenario adapters`` with the command's parameters."""
    from genq.worker.bench.modes import report_on_redis

    engine = "vllm" if params.get("bench_engine") == "vllm" else "static"
    rounds = 1 if params["quick"] else 2
    # --model only where given: the bench's own default (tiny) is the modes scenario's.
    ctx = click.get_current_context(silent=True)
    given = ctx is not None and ctx.get_parameter_source("model") is not ParameterSource.DEFAULT
    on = {"model": params["model"] if given else MODEL, "device": params["device"]}
    report_on_redis(
        params,
        lambda url: run_adapters(url, engine=engine, rounds=rounds, **on),
        adapters_markdown,
    )
