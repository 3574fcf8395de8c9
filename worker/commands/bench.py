"""``genq bench``: one seeded workload served several ways, measured in one run (the
scenarios live in ``genq.worker.devtools``)."""

from __future__ import annotations

import json
import sys
import typing
from importlib import import_module
from typing import Any

import click
from genq.common.settings import EngineName, WorkerSettings
from genq.producer.commands.options import AUTO_OR_COUNT
from genq.worker.bench import SCENARIO_HELP
from genq.worker.bench.modes import IN_PROCESS_MODES
from genq.worker.devtools.redis_server import on_redis
from rich.console import Console
from rich.table import Table

QUEUE_ENGINES = [e for e in typing.get_args(EngineName) if e not in ("echo", "auto")]
"""The engines measured through the queue (echo has no model to measure)."""
# scenario -> module of genq.worker.bench
MODULES = {
    "prefix-vllm": "prefix_engine",
    "priority": "preemption",
    "model-pool": "model_pool",
    "embed-priority": "embed_priority",
    "embed-peer": "embed_peer",
    "embed-vllm": "embed_vllm",
}
SELF_RUN = (
    "priority",
    "structured",
    "webhooks",
    "dashboard",
    "prefix",
    "prefix-vllm",
    "flood",
    "attacks",
    "gateway",
    "models",
    "adapters",
    "batch",
    "model-pool",
    "embed",
    "embed-priority",
    "embed-peer",
    "embed-vllm",
)  # run_and_print
SCENARIOS = ("modes", "aging", "fleet", "tenants", *SELF_RUN)


@click.command()
@click.option("--model", default="tiny", show_default=True)
@click.option("--device", default="cpu", show_default=True)
@click.option("--dtype", default="auto", show_default=True)
@click.option("--requests", "n_requests", type=int, default=64, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option(
    "--repeats",
    type=int,
    default=3,
    show_default=True,
    help="run each mode this many times and report the median run",
)
@click.option("--fifo-batch-size", type=int, default=32, show_default=True)
@click.option(
    "--max-batch-tokens",
    type=AUTO_OR_COUNT,
    default="auto",
    show_default=True,
    help="as genq worker's: auto sizes it to the device as a worker would (on a GPU the "
    "continuous engine's paged cache is capped lower than the static modes' budget)",
)
@click.option("--max-batch-size", type=AUTO_OR_COUNT, default="auto", show_default=True)
@click.option(
    "--modes",
    default=",".join(IN_PROCESS_MODES),
    show_default=True,
    help="the in-process modes to run, comma-separated (one_at_a_time is slow on a big model)",
)
@click.option(
    "--queue-engine",
    type=click.Choice([*QUEUE_ENGINES, "none"]),
    default="continuous",
    show_default=True,
    help="engine measured through Redis and a genq worker ('none' to skip)",
)
@click.option("--redis-url", default=None, help="default: a private redis-server")
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
@click.option("--markdown", is_flag=True, help="print a BENCHMARKS.md section")
@click.option(
    "--sweep", is_flag=True, help="instead: throughput and latency against the batch size limit"
)
@click.option(
    "--scenario",
    type=click.Choice(SCENARIOS),
    default="modes",
    show_default=True,
    help=SCENARIO_HELP,
)
@click.option("--quick", is_flag=True, help="fleet: one small burst only (a smoke test)")
@click.option(
    "--engine",
    "bench_engine",
    type=click.Choice(["transformers", "vllm"]),
    default="transformers",
    show_default=True,
    help="vllm: vLLM in-process against vLLM through the queue (runs alternating), and the "
    "--queue-engine (a transformers engine) through the queue",
)
@click.option("--vllm-args", default=None, help="--engine vllm: JSON EngineArgs for every vLLM")
@click.option(
    "--peer-url",
    default=None,
    help="embed-peer: the OpenAI base URL of the embedding server to measure against "
    "(an Infinity server: http://127.0.0.1:7997)",
)
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
    quick: bool,
    bench_engine: str,
    vllm_args: str | None,
    modes: str,
    peer_url: str | None,
) -> None:
    """Serve one seeded workload several ways and compare tokens/s, padding and waits."""
    from genq.worker.policy.sizing import batch_limits

    if bench_engine == "vllm" or scenario != "modes" or sweep:
        # No model of its own on the device (or a CPU-only scenario): auto is a CPU's numbers.
        cpu = batch_limits(tokens=max_batch_tokens, size=max_batch_size, device=None)
        max_batch_tokens, max_batch_size = cpu.tokens, cpu.size
    if bench_engine == "vllm" and scenario == "modes":
        params = click.get_current_context().params
        from genq.worker.bench.vllm_compare import run_and_print

        run_and_print({**params, "max_batch_tokens": cpu.tokens, "max_batch_size": cpu.size})
        return
    if scenario == "aging":
        _aging_scenario(redis_url, model, queue_engine, max_batch_size, as_json)
        return
    if scenario != "modes":
        return _other_scenario(scenario, click.get_current_context().params)

    from genq.worker.bench import modes as b

    in_process = _in_process_modes(modes)
    engine, max_batch_tokens, max_batch_size, paged_tokens = _sized_engine(
        model, device, dtype, max_batch_tokens, max_batch_size
    )
    workload = b.make_workload(engine, n_requests, seed)
    if sweep:
        _sweep(engine, workload, max_batch_tokens, as_json)
        return
    runs = _run_modes(
        engine,
        workload,
        model=model,
        device=device,
        dtype=dtype,
        repeats=repeats,
        fifo_batch_size=fifo_batch_size,
        max_batch_tokens=max_batch_tokens,
        max_batch_size=max_batch_size,
        paged_tokens=paged_tokens,
        queue_engine=queue_engine,
        redis_url=redis_url,
        modes=in_process,
    )
    _report(
        runs,
        as_json=as_json,
        markdown=markdown,
        model=model,
        n_requests=n_requests,
        seed=seed,
        repeats=repeats,
        max_batch_tokens=max_batch_tokens,
        paged_tokens=paged_tokens,
    )


def _sized_engine(
    model: str, device: str, dtype: str, tokens: int, size: int
) -> tuple[Any, int, int, int]:
    """The static engine on ``device`` and the batch limits (``auto``: sized to the device as
    a worker's would be, and said on stderr): the static modes' tokens and size, and the
    continuous engine's tokens (its paged cache, capped lower on a GPU: ``paged``)."""
    from genq.worker.engines.static import StaticEngine, device_memory
    from genq.worker.policy.sizing import batch_limits

    engine = StaticEngine.load(model, device, dtype)
    memory = device_memory(engine.model, device)
    limits = batch_limits(tokens=tokens, size=size, device=memory)
    paged = batch_limits(tokens=tokens, size=size, device=memory, paged=True)
    click.echo(f"batch limits: {limits.why}; continuous: {paged.tokens} tokens", err=True)
    return engine, limits.tokens, limits.size, paged.tokens


def _sweep(engine: Any, workload: list[Any], max_batch_tokens: int, as_json: bool) -> None:
    from genq.worker.bench import modes as b

    points = b.run_sweep(engine, workload, [1, 4, 8, 16, 32, 64], max_batch_tokens)
    if as_json:
        click.echo(json.dumps({"machine": b.machine_info(), "sweep": points}, indent=2))
    else:
        click.echo(f"Command: `genq {' '.join(sys.argv[1:])}`  ")
        click.echo(b.sweep_markdown(points, max_batch_tokens))


def _in_process_modes(text: str) -> tuple[str, ...]:
    """``--modes``, checked: the in-process modes named, in their usual order."""
    names = {m.strip() for m in text.split(",") if m.strip()}
    unknown = sorted(names - set(IN_PROCESS_MODES))
    if unknown:
        raise click.BadParameter(
            f"unknown mode(s) {unknown}; known: {', '.join(IN_PROCESS_MODES)}", param_hint="--modes"
        )
    return tuple(m for m in IN_PROCESS_MODES if m in names)


def _continuous_engine(engine: Any, paged_tokens: int, max_batch_size: int) -> Any:
    """The in-process continuous engine on the static engine's model, sized as a worker's."""
    from genq.worker.engines.continuous import ContinuousEngine
    from genq.worker.policy.sizing import prefix_room

    return ContinuousEngine(
        engine.model,
        engine.tokenizer,
        device=engine.device,
        max_batch_tokens=paged_tokens,
        max_batch_size=max_batch_size,
        # The room for prefixes a worker's continuous engine keeps (in this environment: its
        # GENQ_PREFIX_CACHE_TOKENS), so that both measure the same engine, the ratio the queue.
        prefix_room_tokens=prefix_room(
            WorkerSettings.build().prefix_cache_tokens,
            engine="continuous",
            budget=paged_tokens,
            on_gpu=engine.device.startswith("cuda"),
            echo_cache_tokens=0,
        )
        or 0,
    )


def _run_modes(
    engine: Any,
    workload: list[Any],
    *,
    model: str,
    device: str,
    dtype: str,
    repeats: int,
    fifo_batch_size: int,
    max_batch_tokens: int,
    max_batch_size: int,
    paged_tokens: int,
    queue_engine: str,
    redis_url: str | None,
    modes: tuple[str, ...] = IN_PROCESS_MODES,
) -> dict[str, list[Any]]:
    """Every mode ``repeats`` times, the modes taking turns (each round: the in-process modes,
    then through the queue), after an untimed round of the in-process modes (a cold device runs
    the first round slower) and, in each queue run, an untimed batch on its fresh worker
    (``run_through_queue``): the runs by mode."""
    from genq.worker.bench import modes as b
    from genq.worker.devtools.redis_server import RedisServer

    continuous = _continuous_engine(engine, paged_tokens, max_batch_size)

    def in_process() -> list[b.ModeResult]:
        return b.run_in_process(
            engine,
            workload,
            fifo_batch_size=fifo_batch_size,
            max_batch_tokens=max_batch_tokens,
            max_batch_size=max_batch_size,
            continuous=continuous,
            modes=modes,
        )

    worker = b.queue_worker_settings(
        model=model,
        engine=queue_engine,
        device=device,
        dtype=dtype,
        max_batch_tokens=paged_tokens if queue_engine == "continuous" else max_batch_tokens,
        max_batch_size=max_batch_size,
    )
    server = None if redis_url or queue_engine == "none" else RedisServer().start()
    url = server.url if server else str(redis_url)
    runs: dict[str, list[b.ModeResult]] = {}
    try:
        in_process()  # the warm-up round, untimed
        for i in range(repeats):
            results = in_process()
            if queue_engine != "none":
                results.append(
                    b.run_through_queue(workload, redis_url=url, worker=worker, queue=f"bench{i}")
                )
            for res in results:
                runs.setdefault(res.mode, []).append(res)
                # Progress on stderr: a GPU model's round can take minutes.
                click.echo(
                    f"round {i + 1}/{repeats}: {res.mode} {res.tokens_per_s:.0f} tokens/s "
                    f"in {res.wall_s:.1f} s",
                    err=True,
                )
    finally:
        continuous.close()
        if server is not None:
            server.stop()
    return runs


def _report(
    runs: dict[str, list[Any]],
    *,
    as_json: bool,
    markdown: bool,
    model: str,
    n_requests: int,
    seed: int,
    repeats: int,
    max_batch_tokens: int,
    paged_tokens: int,
) -> None:
    """Print each mode's median run: as JSON, a BENCHMARKS.md section, or a table."""
    import statistics

    from genq.worker.bench import modes as b

    medians = []
    for mode_runs in runs.values():
        speed = statistics.median_low([r.tokens_per_s for r in mode_runs])
        medians.append(next(r for r in mode_runs if r.tokens_per_s == speed))
    rows = b.results_table(medians)
    info = b.machine_info()
    ratio = b.queue_ratio(medians)
    if as_json:
        click.echo(
            json.dumps(
                {
                    "machine": info,
                    "model": model,
                    "requests": n_requests,
                    "seed": seed,
                    "repeats": repeats,
                    "max_batch_tokens": max_batch_tokens,
                    "continuous_batch_tokens": paged_tokens,
                    "modes": rows,
                    "all_runs": {m: [r.tokens_per_s for r in rs] for m, rs in runs.items()},
                    "queue_vs_best_in_process": ratio,
                },
                indent=2,
            )
        )
        return
    if markdown:
        click.echo(b.markdown_section(rows, info, sys.argv[1:], n_requests, repeats))
        if ratio is not None:
            click.echo(f"\nQueue ÷ best in-process (median runs): {ratio:.3f}")
        return
    _print_table(
        rows,
        info,
        ratio,
        f"genq bench: {n_requests} requests, model {model}, "
        f"seed {seed}, median of {repeats}, budget {max_batch_tokens} tokens",
    )


def _print_table(
    rows: list[dict[str, Any]], info: dict[str, str], ratio: float | None, title: str
) -> None:
    console = Console(width=max(Console().width, 130))
    t = Table(title=title)
    cols = (
        "mode",
        "batches",
        "mean batch",
        "tokens/s",
        "x one",
        "padding",
        "wasted decode",
        "wait p50 ms",
        "latency p50 ms",
        "latency p99 ms",
    )
    for c in cols:
        t.add_column(c, justify="right")
    for row in rows:
        t.add_row(
            row["mode"],
            str(row["batches"]),
            f"{row['mean_batch_size']:.1f}",
            f"{row['tokens_per_s']:.0f}",
            f"{row['speedup_vs_one_at_a_time']:.2f}",
            f"{row['padding_fraction']:.1%}",
            f"{row['wasted_decode_fraction']:.1%}",
            f"{row['queue_wait_p50_ms']:.0f}",
            f"{row['latency_p50_ms']:.0f}",
            f"{row['latency_p99_ms']:.0f}",
        )
    console.print(t)
    if ratio is not None:
        console.print(f"queue ÷ best in-process: {ratio:.3f}")
    console.print(" ".join(f"{k}={v}" for k, v in info.items()))


def _aging_scenario(
    redis_url: str | None, model: str, engine: str, max_batch_size: int, as_json: bool
) -> None:
    from genq.worker.bench.aging import aging_markdown, run_aging_scenario

    res = on_redis(
        redis_url,
        lambda url: run_aging_scenario(
            url,
            model=model,
            engine="continuous" if engine == "none" else engine,
            max_batch_size=max_batch_size,
        ),
    )
    if as_json:
        click.echo(json.dumps(res, indent=2))
    else:
        click.echo(f"Command: `genq {' '.join(sys.argv[1:])}`  ")
        click.echo(aging_markdown(res))


def _markdown(body: str) -> None:
    """A BENCHMARKS.md section: the command, the machine, then ``body``."""
    from genq.worker.bench.modes import machine_info

    click.echo(f"Command: `genq {' '.join(sys.argv[1:])}`  ")
    click.echo("Machine: " + ", ".join(f"{k} {v}" for k, v in machine_info().items()))
    click.echo("")
    click.echo(body)


def _fleet_scenario(redis_url: str | None, *, quick: bool, as_json: bool) -> None:
    import dataclasses

    from genq.worker.bench.fleet import fleet_markdown, run_fleet_scenarios
    from genq.worker.bench.modes import machine_info

    results = on_redis(redis_url, lambda url: run_fleet_scenarios(url, quick=quick))
    if as_json:
        out = {"machine": machine_info(), "scenarios": [dataclasses.asdict(x) for x in results]}
        click.echo(json.dumps(out, indent=2))
    else:
        _markdown(fleet_markdown(results))


def _other_scenario(scenario: str, params: dict[str, Any]) -> None:
    """The scenarios that take only ``--redis-url``, ``--quick`` and ``--json`` (and
    ``structured``, which reads the rest of the parameters itself)."""
    if scenario in SELF_RUN:
        module = import_module(f"genq.worker.bench.{MODULES.get(scenario, scenario)}")
        return module.run_and_print(params)  # type: ignore[no-any-return]
    run = {"fleet": _fleet_scenario, "tenants": _tenants_scenario}
    run[scenario](params["redis_url"], quick=params["quick"], as_json=params["as_json"])


def _tenants_scenario(redis_url: str | None, *, quick: bool, as_json: bool) -> None:
    from genq.worker.bench.modes import machine_info
    from genq.worker.bench.tenants import as_dict, run_tenants, tenants_markdown

    report = on_redis(redis_url, lambda url: run_tenants(url, quick=quick))
    if as_json:
        click.echo(json.dumps({"machine": machine_info(), **as_dict(report)}, indent=2))
    else:
        _markdown(tenants_markdown(report))
