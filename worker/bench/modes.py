"""``genq bench``: one seeded workload, several ways of serving it, measured in one run.

Modes (in-process unless said):

- ``one_at_a_time``: each request alone (the naive service);
- ``fifo_static``: static batches of a fixed size, in arrival order;
- ``budgeted_static``: genq's policy: token-budgeted, length-aware static batches;
- ``queue``: the same engine and policy through Redis and a ``genq worker`` process.

Every mode gets the same requests, all "arriving" at the start. Each phase is timed on its own
with ``time.perf_counter()``; model loading is outside every timed phase.
"""

from __future__ import annotations

import platform
import random
import statistics
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from genq.worker.devtools.worker_process import start_worker, wait_until_serving, worker_args
from genq.worker.engines.base import (
    BatchReport,
    Engine,
    GenerationInput,
    GenerationOutput,
    IterationEngine,
)
from genq.worker.policy.batching import BatchPolicy, Candidate, next_batch

IN_PROCESS_MODES = ("one_at_a_time", "fifo_static", "budgeted_static", "continuous")
"""The modes run in the bench's own process (``--modes``), in the order they are run."""
WORDS = (
    "the a queue batch token model worker stream redis prompt result padding length budget "
    "priority request answer fast small large many one two three and of to in on for with"
)


@dataclass(frozen=True, kw_only=True)
class BenchRequest:
    """One request of the workload."""

    prompt: str
    max_new_tokens: int


def make_workload(engine: Engine, n: int, seed: int) -> list[BenchRequest]:
    """``n`` requests: prompt lengths lognormal, clipped to 8..400 tokens; ``max_new_tokens``
    uniform in 8..128. Seeded, so every mode and every run gets the same work."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        target = int(min(400, max(8, rng.lognormvariate(4.0, 0.9))))
        words: list[str] = []
        # Grow to the target in characters (one token each in a byte tokenizer), then in
        # tokens: a real tokenizer packs ~4 characters into a token.
        while len(" ".join(words)) < target:
            words.append(rng.choice(WORDS.split()))
        while len(engine.tokenize([" ".join(words)])[0]) < target:
            words += [rng.choice(WORDS.split()) for _ in range(8)]
        text = " ".join(words)
        ids = engine.tokenize([text])[0]
        while len(ids) > target and len(text) > 1:  # trim to the target length in tokens
            text = text[: max(1, len(text) * target // len(ids) - 1)]
            ids = engine.tokenize([text])[0]
        out.append(BenchRequest(prompt=text, max_new_tokens=rng.randint(8, 128)))
    return out


@dataclass(kw_only=True)
class ModeResult:
    """What one mode measured."""

    mode: str
    requests: int
    batches: int
    mean_batch_size: float
    useful_tokens: int
    """Completion tokens returned to clients."""
    wall_s: float
    tokens_per_s: float
    padding_fraction: float
    wasted_decode_fraction: float
    queue_wait_p50_ms: float
    """From the start of the phase until the request's batch started."""
    queue_wait_p99_ms: float
    latency_p50_ms: float
    """From the start of the phase until the request's result was ready."""
    latency_p99_ms: float


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank ``q`` quantile (0-1) of ``values`` (NaN for none): with fewer than
    ``1 / (1 - q)`` values, the largest. Every bench reports its percentiles this way."""
    v = sorted(values)
    return v[min(len(v) - 1, int(q * len(v)))] if v else float("nan")


def _summarize(
    mode: str,
    reports: list[tuple[BatchReport, int]],
    waits_ms: list[float],
    wall_s: float,
    latencies_ms: list[float],
) -> ModeResult:
    useful = sum(r.completion_tokens for r, _ in reports)
    prompt = sum(r.prompt_tokens for r, _ in reports)
    padded = sum(r.padded_prompt_tokens for r, _ in reports)
    slots = sum(r.decode_slots for r, _ in reports)
    sizes = [n for _, n in reports]
    waits = sorted(waits_ms)
    return ModeResult(
        mode=mode,
        requests=sum(sizes),
        batches=len(sizes),
        mean_batch_size=statistics.fmean(sizes),
        useful_tokens=useful,
        wall_s=wall_s,
        tokens_per_s=useful / wall_s,
        padding_fraction=1 - prompt / padded if padded else 0.0,
        wasted_decode_fraction=max(0.0, 1 - useful / slots) if slots else 0.0,
        queue_wait_p50_ms=percentile(waits, 0.5),
        queue_wait_p99_ms=percentile(waits, 0.99),
        latency_p50_ms=percentile(latencies_ms, 0.5),
        latency_p99_ms=percentile(latencies_ms, 0.99),
    )


def _run_batches(
    engine: Engine, mode: str, rows: list[GenerationInput], batches: Sequence[Sequence[int]]
) -> ModeResult:
    reports = []
    waits: list[float] = []
    latencies: list[float] = []
    t0 = time.perf_counter()
    for batch in batches:
        waits += [(time.perf_counter() - t0) * 1000] * len(batch)
        reports.append((engine.generate([rows[i] for i in batch]), len(batch)))
        latencies += [(time.perf_counter() - t0) * 1000] * len(batch)
    return _summarize(mode, reports, waits, time.perf_counter() - t0, latencies)


def _run_continuous(engine: IterationEngine, rows: list[GenerationInput]) -> ModeResult:
    """Everything submitted at once; the manager admits as its budget allows."""
    t0 = time.perf_counter()
    for i, row in enumerate(rows):
        engine.submit(str(i), row)
    outputs: dict[str, GenerationOutput] = {}
    latencies: list[float] = []
    while len(outputs) < len(rows):
        for key, out in engine.poll(1.0):
            if not isinstance(out, GenerationOutput):
                raise RuntimeError(str(out))
            outputs[key] = out
            latencies.append((time.perf_counter() - t0) * 1000)
    wall_s = time.perf_counter() - t0
    report = BatchReport(
        outputs=list(outputs.values()),
        prompt_tokens=sum(len(r.prompt_ids) for r in rows),
        padded_prompt_tokens=sum(len(r.prompt_ids) for r in rows),
        decode_slots=sum(o.completion_tokens for o in outputs.values()),
    )
    result = _summarize("continuous", [(report, len(rows))], [float("nan")], wall_s, latencies)
    result.batches, result.mean_batch_size = 0, float("nan")  # no batches: one running set
    return result


def plan_budgeted(
    rows: list[GenerationInput], max_batch_tokens: int, max_batch_size: int
) -> list[list[int]]:
    """The batches genq's policy forms when every request is waiting at once."""
    policy = BatchPolicy(max_batch_tokens=max_batch_tokens, max_batch_size=max_batch_size)
    waiting = {
        str(i): Candidate(
            key=str(i),
            prompt_tokens=len(r.prompt_ids),
            max_new_tokens=r.max_new_tokens,
            enqueued_ms=i,
        )
        for i, r in enumerate(rows)
    }
    batches = []
    while waiting:
        d = next_batch(list(waiting.values()), now_ms=len(rows), policy=policy)
        batches.append([int(c.key) for c in d.batch])
        for c in d.batch:
            del waiting[c.key]
    return batches


def run_in_process(
    engine: Engine,
    workload: list[BenchRequest],
    *,
    fifo_batch_size: int,
    max_batch_tokens: int,
    max_batch_size: int,
    continuous: IterationEngine | None = None,
    modes: Sequence[str] = IN_PROCESS_MODES,
) -> list[ModeResult]:
    """The in-process ``modes`` on ``engine``; ``continuous`` on ``continuous`` if given."""
    ids = engine.tokenize([w.prompt for w in workload])
    rows = [
        GenerationInput(prompt_ids=p, max_new_tokens=w.max_new_tokens)
        for p, w in zip(ids, workload, strict=True)
    ]
    engine.generate(rows[:2])  # warm-up, untimed
    n = len(rows)
    step = fifo_batch_size
    plans: dict[str, Callable[[], list[list[int]]]] = {
        "one_at_a_time": lambda: [[i] for i in range(n)],
        "fifo_static": lambda: [list(range(i, min(n, i + step))) for i in range(0, n, step)],
        "budgeted_static": lambda: plan_budgeted(rows, max_batch_tokens, max_batch_size),
    }
    results = [_run_batches(engine, m, rows, plans[m]()) for m in modes if m in plans]
    if continuous is not None and "continuous" in modes:
        results.append(_run_continuous(continuous, rows))
    return results


def queue_worker_settings(
    *,
    model: str,
    engine: str,
    device: str,
    dtype: str,
    max_batch_tokens: int,
    max_batch_size: int,
) -> dict[str, object]:
    """The one place the bench says how its ``genq worker`` runs: the bench's own model,
    engine, device, dtype and limits (so a queue mode on ``--device cuda`` measures the GPU,
    not a CPU worker), and no wait to fill a batch."""
    return {
        "model": model,
        "engine": engine,
        "device": device,
        "dtype": dtype,
        "max_batch_tokens": max_batch_tokens,
        "max_batch_size": max_batch_size,
        "max_wait_ms": 0,
    }


def run_through_queue(
    workload: list[BenchRequest],
    *,
    redis_url: str,
    worker: dict[str, object],
    queue: str = "bench",
) -> ModeResult:
    """Mode 4: submit everything through Redis to a ``genq worker`` subprocess started with
    ``worker`` (``queue_worker_settings``) and wait."""
    from genq.common.connection import connect
    from genq.common.keys import Keys
    from genq.producer import Client

    r = connect(redis_url)
    consumer = f"bench-{int(time.time() * 1000)}"
    engine = str(worker["engine"])
    proc = start_worker(
        log=subprocess.PIPE,
        extra_args=tuple(worker_args(**worker)),
        redis_url=redis_url,
        queue=queue,
        consumer=consumer,
    )
    try:
        try:
            wait_until_serving(r, queue, consumer, proc)
        except RuntimeError as err:
            stderr = proc.stderr.read().decode() if proc.stderr else ""
            raise RuntimeError(f"bench worker: {err}: {stderr}") from None
        client = Client(r, queue)
        # Untimed: one batch of the workload itself warms the fresh worker's device (kernels
        # for these shapes, the allocator), as the in-process modes had an untimed round.
        warm = workload[: int(str(worker.get("max_batch_size", 8)))]
        client.results(
            client.submit_many(
                [{"prompt": w.prompt, "max_new_tokens": w.max_new_tokens} for w in warm]
            ),
            timeout=600,
        )
        before = _counters(r, Keys(queue).worker(consumer))
        t0 = time.perf_counter()
        submitted_ms = float(time.time() * 1000)
        ids = client.submit_many(
            [{"prompt": w.prompt, "max_new_tokens": w.max_new_tokens} for w in workload]
        )
        results = client.results(ids, timeout=3600)
        wall_s = time.perf_counter() - t0
        # The counters go out in the same pipeline as the results, but not in one transaction:
        # they can land a moment after the last result. Wait until they count every request.
        key, want = Keys(queue).worker(consumer), before.get("succeeded", 0) + len(ids)
        _wait_for(lambda: _counters(r, key).get("succeeded", 0) >= want, timeout_s=30)
        after = _counters(r, key)
        stats = {k: after[k] - before.get(k, 0) for k in after}
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    r.close()
    useful = sum(x.usage.completion_tokens for x in results)
    waits = [float(x.timings.queue_wait_ms or 0) for x in results]
    finish_ms = [float(x.timings.finished_unix_ms or 0) for x in results]
    latencies = [f - submitted_ms for f in finish_ms]
    sizes = [x.batch_size or 1 for x in results]
    return ModeResult(
        mode=f"queue_{engine}",
        requests=len(results),
        batches=round(sum(1 / s for s in sizes)),
        mean_batch_size=len(sizes) / sum(1 / s for s in sizes),
        useful_tokens=useful,
        wall_s=wall_s,
        tokens_per_s=useful / wall_s,
        padding_fraction=1 - stats["prompt_tokens"] / stats["padded_prompt_tokens"],
        wasted_decode_fraction=1 - stats["completion_tokens"] / stats["decode_slots"],
        queue_wait_p50_ms=percentile(waits, 0.5),
        queue_wait_p99_ms=percentile(waits, 0.99),
        latency_p50_ms=percentile(latencies, 0.5),
        latency_p99_ms=percentile(latencies, 0.99),
    )


def _counters(r: Any, key: str) -> dict[str, int]:
    raw: Any = r.hgetall(key)
    return {k.decode(): int(v) for k, v in raw.items() if v.isdigit()}


def _wait_for(pred: Callable[[], object], timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while not pred():
        if time.monotonic() > deadline:
            raise TimeoutError("bench worker did not start")
        time.sleep(0.05)


def report_on_redis(
    params: dict[str, Any],
    run: Callable[[str], dict[str, Any]],
    markdown: Callable[[dict[str, Any]], str],
) -> None:
    """Run a scenario (``run(redis_url)``) on ``--redis-url`` or a private redis-server, and
    print its result: with ``--json`` as JSON with the machine, else the machine and
    ``markdown(result)``."""
    import json

    import click
    from genq.worker.devtools.redis_server import on_redis

    res = on_redis(params["redis_url"], run)
    if params["as_json"]:
        click.echo(json.dumps({"machine": machine_info(), **res}, indent=2))
        return
    click.echo("Machine: " + ", ".join(f"{k} {v}" for k, v in machine_info().items()))
    click.echo("")
    click.echo(markdown(res))


def machine_info() -> dict[str, str]:
    """The machine and versions, recorded next to the numbers."""
    import os

    info = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": str(os.cpu_count()),
    }
    try:
        import torch
        import transformers

        info["torch"] = torch.__version__
        info["transformers"] = transformers.__version__
        info["torch_threads"] = str(torch.get_num_threads())
        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(0)
    except ImportError:
        pass
    return info


def queue_ratio(results: Sequence[ModeResult]) -> float | None:
    """Tokens/s through the queue ÷ the best in-process mode's (None without both)."""
    queue = [r.tokens_per_s for r in results if r.mode.startswith("queue_")]
    local = [r.tokens_per_s for r in results if not r.mode.startswith("queue_")]
    return queue[0] / max(local) if queue and local else None


def results_table(results: list[ModeResult]) -> list[dict[str, Any]]:
    """Rows for printing, with each mode's speed relative to one-at-a-time."""
    base = next((r.tokens_per_s for r in results if r.mode == "one_at_a_time"), None)
    rows = []
    for r in results:
        row = asdict(r)
        row["speedup_vs_one_at_a_time"] = r.tokens_per_s / base if base else float("nan")
        rows.append(row)
    return rows


def markdown_section(
    rows: list[dict[str, Any]], info: dict[str, str], argv: list[str], requests: int, repeats: int
) -> str:
    """A BENCHMARKS.md section: the command, the machine and versions, and the table."""
    lines = [
        f"Command: `genq {' '.join(argv)}`  ",
        f"Workload: {requests} requests, prompts lognormal 8-400 tokens, max_new_tokens 8-128; "
        f"each mode run {repeats} times, taking turns after an untimed warm-up of every mode, "
        "the median run shown.  ",
        "Machine: " + ", ".join(f"{k} {v}" for k, v in info.items()),
        "",
        "| mode | batches | mean batch | tokens/s | x one-at-a-time | padding | wasted decode "
        "| wait p50 ms | latency p50 ms | latency p99 ms |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['mode']} | {r['batches']} | {r['mean_batch_size']:.1f} | "
            f"{r['tokens_per_s']:.0f} | {r['speedup_vs_one_at_a_time']:.2f} | "
            f"{r['padding_fraction']:.1%} | {r['wasted_decode_fraction']:.1%} | "
            f"{r['queue_wait_p50_ms']:.0f} | {r['latency_p50_ms']:.0f} | "
            f"{r['latency_p99_ms']:.0f} |"
        )
    return "\n".join(lines)


def run_sweep(
    engine: Any, workload: list[BenchRequest], sizes: Sequence[int], max_batch_tokens: int
) -> list[dict[str, Any]]:
    """Throughput and per-request latency against the batch size limit, for budgeted static
    batches and for continuous batching (a fresh manager per size), on the same workload."""
    from genq.worker.engines.continuous import ContinuousEngine

    ids = engine.tokenize([w.prompt for w in workload])
    rows = [
        GenerationInput(prompt_ids=p, max_new_tokens=w.max_new_tokens)
        for p, w in zip(ids, workload, strict=True)
    ]
    out = []
    for size in sizes:
        static = _run_batches(
            engine, "budgeted_static", rows, plan_budgeted(rows, max_batch_tokens, size)
        )
        cont_engine = ContinuousEngine(
            engine.model,
            engine.tokenizer,
            device=engine.device,
            max_batch_tokens=max_batch_tokens,
            max_batch_size=size,
        )
        cont_engine.generate(rows[:2])  # warm-up, untimed
        cont = _run_continuous(cont_engine, rows)
        cont_engine.close()
        for r in (static, cont):
            out.append(
                {
                    "max_batch_size": size,
                    "mode": r.mode,
                    "tokens_per_s": r.tokens_per_s,
                    "latency_p50_ms": r.latency_p50_ms,
                    "latency_p99_ms": r.latency_p99_ms,
                }
            )
    return out


def sweep_markdown(rows: list[dict[str, Any]], max_batch_tokens: int) -> str:
    """The sweep as a BENCHMARKS.md table."""
    lines = [
        f"Budget {max_batch_tokens} tokens; one run per point.",
        "",
        "| max batch size | mode | tokens/s | latency p50 ms | latency p99 ms |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['max_batch_size']} | {r['mode']} | {r['tokens_per_s']:.0f} | "
        f"{r['latency_p50_ms']:.0f} | {r['latency_p99_ms']:.0f} |"
        for r in rows
    ]
    return "\n".join(lines)
