"""``genq bench --scenario model-pool``'s real-model case: one CPU worker with a pool of three
real models (``REAL_MODELS``), one resident at a time, made to swap ``ROUNDS`` times.

Each round asks ``PROMPTS`` of the next model in turn and waits for their answers, so every
round is a swap. Reported: every answer against the same prompt run alone on its model's
engine (greedy: the texts must be equal), each model's load times (from the worker's swap log
lines: a load from the model's folder on disk, or from the warm tier), and the worker's resident
memory with each model loaded, the first time against the last (a swap must not leak: within
10%). Run twice: without a warm tier, and with ``--warm-models 2`` (every evicted model kept).
"""

from __future__ import annotations

import re
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

REAL_MODELS = ("tiny", "smollm2-135m", "random-250m")
ROUNDS = 20
PROMPTS = ("The capital of France is", "Water boils at", "One, two, three,")
NEW_TOKENS = 12
LOADED = re.compile(r"model pool: loaded (\S+) in (\d+) ms( from host memory)?")
WARM = 2


def _alone(model: str) -> list[str]:
    """Each prompt's greedy text on ``model``'s engine, one at a time."""
    from genq.worker.engines.base import GenerationInput
    from genq.worker.engines.static import StaticEngine

    engine = StaticEngine.load(model)
    out = []
    for prompt in PROMPTS:
        row = GenerationInput(prompt_ids=engine.tokenize([prompt])[0], max_new_tokens=NEW_TOKENS)
        out.append(engine.generate([row]).outputs[0].text)
    return out


def _rss(pid: int) -> int:
    """The resident memory of process ``pid`` in bytes (Linux)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def run_real_pool(redis_url: str, warm: int = 0) -> dict[str, Any]:
    """The case (see the module's docstring), with ``warm`` models kept warm."""
    import redis
    from genq.common.keys import Keys
    from genq.producer import Client
    from genq.worker.devtools.worker_process import start_worker, wait_until_serving

    expected = {m: _alone(m) for m in REAL_MODELS}
    queue, consumer = f"bench-pool-real-{warm}", "r0"
    args: list[str] = [a for m in REAL_MODELS for a in ("--model", m)]
    args += ["--resident-models", "1", "--min-resident-ms", "0", "--max-wait-ms", "0"]
    args += ["--warm-models", str(warm)]
    with tempfile.TemporaryDirectory() as tmp:
        log_path = Path(tmp) / "worker.log"
        with open(log_path, "wb") as log:
            proc = start_worker(
                redis_url=redis_url, queue=queue, consumer=consumer, log=log, extra_args=tuple(args)
            )
        r = redis.Redis.from_url(redis_url)
        stats = Keys(queue).worker(consumer)
        client = Client.from_url(redis_url, queue)
        try:
            wait_until_serving(r, queue, consumer, proc, timeout_s=300)
            while r.hget(stats, "resident") != REAL_MODELS[0].encode():
                time.sleep(0.1)
            rss: dict[str, list[int]] = {m: [] for m in REAL_MODELS}
            equal = asked = 0
            t0 = time.monotonic()
            for k in range(ROUNDS):
                model = REAL_MODELS[(k + 1) % len(REAL_MODELS)]
                ids = [client.submit(p, model=model, max_new_tokens=NEW_TOKENS) for p in PROMPTS]
                results = client.results(ids, timeout=600)
                asked += len(ids)
                equal += sum(
                    1
                    for x, want in zip(results, expected[model], strict=True)
                    if x.status == "succeeded" and x.model == model and x.text == want
                )
                rss[model].append(_rss(proc.pid))
            took_s = time.monotonic() - t0
            swaps = int(r.hget(stats, "model_evictions") or 0)
        finally:
            client.close()
            proc.terminate()
            proc.wait(timeout=60)
        loads: dict[str, list[int]] = {m: [] for m in REAL_MODELS}
        warm_loads: dict[str, list[int]] = {m: [] for m in REAL_MODELS}
        for model, ms, warmed in LOADED.findall(log_path.read_text(errors="replace")):
            (warm_loads if warmed else loads)[model].append(int(ms))
    return {
        "warm": warm,
        "warm_load_ms_p50": {m: int(statistics.median(v)) for m, v in warm_loads.items() if v},
        "warm_loads": {m: len(v) for m, v in warm_loads.items()},
        "requests": asked,
        "equal_alone": equal,
        "swaps": swaps,
        "seconds": round(took_s, 1),
        "load_ms_p50": {m: int(statistics.median(v)) for m, v in loads.items() if v},
        "loads": {m: len(v) for m, v in loads.items()},
        "rss_mib_first_last": {
            m: [round(v[0] / 2**20), round(v[-1] / 2**20)] for m, v in rss.items() if v
        },
        "rss_last_over_first": round(max(v[-1] / v[0] for v in rss.values() if v), 3),
    }


def real_pool_markdown(runs: list[dict[str, Any]]) -> str:
    """The BENCHMARKS.md lines (a run without a warm tier, then one with)."""
    lines = [
        "**Real models**: one CPU worker (`--engine continuous`), `--model "
        + " --model ".join(REAL_MODELS)
        + f" --resident-models 1`; {ROUNDS} rounds of {len(PROMPTS)} requests, each round the "
        "next model (every round a swap), without and with `--warm-models`:",
        "",
        "| warm | model | answers equal alone | loads from disk | p50 ms | from host memory "
        "| p50 ms | RSS MiB first / last |",
        "|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for x in runs:
        for m in REAL_MODELS:
            first, last = x["rss_mib_first_last"].get(m, ["-", "-"])
            lines.append(
                f"| {x['warm']} | {m} | {x['equal_alone']} of {x['requests']} | "
                f"{x['loads'].get(m, 0)} | {x['load_ms_p50'].get(m, '-')} | "
                f"{x['warm_loads'].get(m, 0)} | {x['warm_load_ms_p50'].get(m, '-')} | "
                f"{first} / {last} |"
            )
    worst = ", ".join(f"{x['rss_last_over_first']}x (warm {x['warm']})" for x in runs)
    lines += ["", f"RSS last over first, the worst model: **{worst}**."]
    return "\n".join(lines)
