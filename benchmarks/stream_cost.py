"""What a streamed request costs beside one that is not: `genq serve` and one `genq worker` on a
redis-server of their own, rounds of concurrent chat completions through the gateway, each
streamed (SSE) or not; the CPU seconds each process used per request, and the Redis commands
per request counted by Redis (INFO commandstats, the commands inside scripts included).

    python benchmarks/stream_cost.py [--engine continuous --model tiny] [--rounds 10]
        [--concurrency 32] [--max-tokens 32]

The tiny model streams a piece per decode step (the echo engine answers in one piece), so
a request of 32 tokens is 32 pieces: worker -> Redis -> gateway -> client.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

import httpx
import redis
from genq.common.keys import Keys
from genq.worker.devtools.gateway_process import GatewayProcess
from genq.worker.devtools.redis_server import RedisServer

WORDS = ("the", "of", "and", "to", "in", "is", "you", "that", "it", "was", "for", "on", "are")


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def one(client: httpx.AsyncClient, url: str, prompt: str, args: Any, stream: bool) -> int:
    """One chat completion; how many SSE data lines it got (1 when not streamed)."""
    body = {
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": args.max_tokens,
        "stream": stream,
    }
    if not stream:
        response = await client.post(url, json=body)
        response.raise_for_status()
        return 1
    lines = 0
    async with client.stream("POST", url, json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            lines += line.startswith("data: ")
    return lines


async def rounds(url: str, args: Any, stream: bool, n: int, seed: int) -> list[int]:
    rnd = random.Random(seed)
    got: list[int] = []
    limits = httpx.Limits(max_connections=args.concurrency + 8)
    async with httpx.AsyncClient(timeout=300, limits=limits) as client:
        for _ in range(n):
            prompts = [
                " ".join(rnd.choice(WORDS) for _ in range(60)) for _ in range(args.concurrency)
            ]
            got += await asyncio.gather(*(one(client, url, p, args, stream) for p in prompts))
    return got


def measure(args: Any, stream: bool) -> dict[str, float]:
    with RedisServer() as server, TemporaryDirectory() as tmp:
        r = redis.Redis.from_url(server.url)
        worker = subprocess.Popen(
            [sys.executable, "-m", "genq.worker", "worker", "--redis-url", server.url,
             "--queue", "sc", "--engine", args.engine, "--consumer", "w",
             *(["--model", args.model] if args.model else [])],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        gateway = GatewayProcess(server.url, "sc", Path(tmp) / "gateway.log")
        try:
            deadline = time.monotonic() + 300
            while not r.exists(Keys("sc").worker("w")):
                if time.monotonic() > deadline or worker.poll() is not None:
                    raise RuntimeError("the worker did not start")
                time.sleep(0.1)
            url = gateway.url + "/chat/completions"
            asyncio.run(rounds(url, args, stream, 1, seed=1))  # warm: both ends
            r.config_resetstat()
            before = {"gateway": cpu_s(gateway.proc.pid), "worker": cpu_s(worker.pid)}
            redis_before = r.info("cpu")
            t0 = time.perf_counter()
            lines = asyncio.run(rounds(url, args, stream, args.rounds, seed=2))
            wall = time.perf_counter() - t0
            n = len(lines)
            stats: dict[str, Any] = r.info("commandstats")
            redis_after = r.info("cpu")
            used = {k: (cpu_s(p) - before[k]) for k, p in
                    (("gateway", gateway.proc.pid), ("worker", worker.pid))}  # fmt: skip
            used["redis"] = sum(
                float(redis_after[k]) - float(redis_before[k])
                for k in ("used_cpu_user", "used_cpu_sys")
            )
            calls = {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items()}
            calls.pop("info", None)
            return {
                "requests": n,
                "pieces per request": sum(lines) / n,
                "requests/s": n / wall,
                **{f"{k} CPU ms per request": 1000 * v / n for k, v in used.items()},
                "Redis commands per request": sum(calls.values()) / n,
                "XREADs per request": calls.get("xread", 0) / n,
                "XADDs per request": calls.get("xadd", 0) / n,
            }
        finally:
            gateway.stop()
            worker.terminate()
            worker.wait(timeout=60)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--engine", default="continuous")
    p.add_argument("--model", default="tiny")
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--max-tokens", type=int, default=32)
    args = p.parse_args()
    runs = {"streamed": measure(args, True), "not streamed": measure(args, False)}
    names = list(runs["streamed"])
    print(f"Command: `python benchmarks/stream_cost.py --engine {args.engine} --model "
          f"{args.model} --rounds {args.rounds} --concurrency {args.concurrency} "
          f"--max-tokens {args.max_tokens}`\n")  # fmt: skip
    print("| | " + " | ".join(runs) + " |")
    print("|---|" + "---:|" * len(runs))
    for name in names:
        print(f"| {name} | " + " | ".join(f"{run[name]:,.2f}" for run in runs.values()) + " |")


if __name__ == "__main__":
    main()
