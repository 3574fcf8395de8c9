"""``genq bench --scenario flood``: one tenant's thousands of waiting chats against another's
single requests, on one ``genq serve``.

A private redis-server (unless ``--redis-url``), one echo worker (slow steps: a batch takes
``STEP_MS`` x ``TOKENS``; alice's chats take ~40 batches), one gateway with two keys.
Measured, in one run:

- **bob idle**: bob's chat (``TOKENS`` tokens) one at a time on the quiet queue: its latency.
- **the flood**: alice opens ``waiting`` chats at once (half streaming), all waiting together;
  meanwhile, from another process (this one's event loop is busy with the flood), bob's chats
  one at a time and ``/health`` every 20 ms. Bob's latency against idle (goal <= 2x: one batch
  of alice's in progress, then his), ``/health`` (goal < 50 ms), alice's answers (all), the
  gateway's Redis connections at the peak (``connected_clients`` less the quiet queue's) and
  its memory per waiting request (RSS at the peak less before, over ``waiting``).
"""

from __future__ import annotations

import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

QUEUE = "flood-bench"
STEP_MS = 20
TOKENS = 16
KEYS = ["--api-key", "key-a=alice", "--api-key", "key-b=bob"]
PROBE = """
import json, sys, time, urllib.request
base, seconds = sys.argv[1], float(sys.argv[2])
body = json.dumps({"model": "echo", "max_tokens": int(sys.argv[3]),
                   "messages": [{"role": "user", "content": "bob"}]}).encode()
bob, health, failed, end = [], [], 0, time.monotonic() + seconds
while time.monotonic() < end:
    t0 = time.perf_counter()
    req = urllib.request.Request(base + "/v1/chat/completions", body, {
        "Authorization": "Bearer key-b", "Content-Type": "application/json"})
    try:
        urllib.request.urlopen(req, timeout=60).read()
        bob.append(time.perf_counter() - t0)
    except OSError:
        failed += 1
    for _ in range(5):
        t0 = time.perf_counter()
        urllib.request.urlopen(base + "/health", timeout=30).read()
        health.append(time.perf_counter() - t0)
        time.sleep(0.02)
print(json.dumps({"bob": bob, "health": health, "failed": failed}))
"""


def _batch(waiting: int) -> int:
    """The worker's batch size: alice's chats take ~40 batches, longer than bob's probe."""
    return max(16, waiting // 40)


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _chat(content: str, stream: bool) -> dict[str, Any]:
    return {
        "model": "echo",
        "messages": [{"role": "user", "content": content}],
        "max_tokens": TOKENS,
        "stream": stream,
    }


async def _alice(port: int, i: int) -> bool:
    """One of alice's chats, over its own connection (plain HTTP/1.1 on asyncio streams: a
    client library's pool costs more CPU than the gateway with thousands in flight, and this
    process must keep up): whether it came back with its answer."""
    body = json.dumps(_chat(f"a{i:05d}", stream=i % 2 == 1)).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        "Authorization: Bearer key-a\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(head.encode() + body)
        data = await reader.read()  # to the end: the gateway closes after the answer
        writer.close()
    except OSError:
        return False
    if not data.startswith(b"HTTP/1.1 200"):
        return False
    return b"[DONE]" in data if i % 2 == 1 else f"a{i:05d}".encode() in data


def run_flood(redis_url: str, *, waiting: int) -> dict[str, Any]:
    """The scenario on ``redis_url``."""
    import logging

    import httpx
    import redis
    from genq.worker.devtools.gateway_process import GatewayProcess
    from genq.worker.devtools.worker_process import start_worker

    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request otherwise
    worker = start_worker(
        redis_url=redis_url,
        queue=QUEUE,
        engine="echo",
        max_queue_depth=0,
        echo_step_ms=STEP_MS,
        max_batch_size=_batch(waiting),
    )
    log = Path(tempfile.mkdtemp()) / "gateway.log"
    gateway = GatewayProcess(redis_url, QUEUE, log, KEYS)
    r = redis.Redis.from_url(redis_url)
    base = gateway.url.removesuffix("/v1")
    try:
        auth = {"Authorization": "Bearer key-b"}
        deadline = time.monotonic() + 60
        while not httpx.get(f"{gateway.url}/models", headers=auth).json()["data"]:
            if time.monotonic() > deadline:
                raise RuntimeError("no echo worker came up")
            time.sleep(0.1)
        idle = _probe(base, 4.0)
        clients_before = int(r.info("clients")["connected_clients"])
        rss_before = _rss_mb(gateway.proc.pid)
        loaded, peak, alice, took_s = asyncio.run(_flood(base, waiting, r, gateway.proc.pid))
        bob_idle = statistics.median(idle["bob"]) * 1000
        bob_loaded = statistics.median(loaded["bob"]) * 1000
        health = sorted(h * 1000 for h in loaded["health"])
        return {
            "waiting": waiting,
            "batch": _batch(waiting),
            "step_ms": STEP_MS,
            "tokens": TOKENS,
            "alice_served": alice,
            "alice_s": took_s,
            "bob_idle_p50_ms": bob_idle,
            "bob_loaded_p50_ms": bob_loaded,
            "bob_loaded_max_ms": max(loaded["bob"]) * 1000,
            "bob_ratio": bob_loaded / bob_idle,
            "bob_requests": len(loaded["bob"]),
            "bob_failed": loaded["failed"],
            "health_p50_ms": statistics.median(health),
            "health_p99_ms": health[int(len(health) * 0.99) - 1],
            "health_max_ms": health[-1],
            "redis_connections": peak["clients"] - clients_before,
            "rss_before_mb": rss_before,
            "rss_peak_mb": peak["rss"],
            "kb_per_waiting": (peak["rss"] - rss_before) * 1024 / waiting,
        }
    finally:
        gateway.stop()
        worker.terminate()
        worker.wait(timeout=30)


def _probe(base: str, seconds: float) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, base, str(seconds), str(TOKENS)],
        capture_output=True,
        text=True,
        check=True,
        timeout=seconds + 120,
    )
    out: dict[str, Any] = json.loads(done.stdout)
    return out


async def _flood(
    base: str, waiting: int, r: Any, pid: int
) -> tuple[dict[str, Any], dict[str, float], int, float]:
    port = int(base.rsplit(":", 1)[1])
    t0 = time.perf_counter()
    tasks = [asyncio.create_task(_alice(port, i)) for i in range(waiting)]
    await asyncio.sleep(2.0)  # all sent
    peak = {"clients": float(r.info("clients")["connected_clients"]), "rss": _rss_mb(pid)}
    probe = asyncio.create_task(asyncio.to_thread(_probe, base, 6.0))
    for _ in range(30):  # the peak while the probe runs
        await asyncio.sleep(0.2)
        peak["clients"] = max(peak["clients"], float(r.info("clients")["connected_clients"]))
        peak["rss"] = max(peak["rss"], _rss_mb(pid))
    loaded = await probe
    served = sum(await asyncio.gather(*tasks))
    return loaded, peak, served, time.perf_counter() - t0


def flood_markdown(res: dict[str, Any]) -> str:
    return "\n".join(
        [
            f"{res['waiting']:,} of alice's chats at once (half streaming; echo worker, batches "
            f"of {res['batch']}, {res['tokens']} tokens x {res['step_ms']} ms steps), bob's one "
            "at a time from another process:",
            "",
            "| measure | value | goal |",
            "|---|---|---|",
            f"| alice's chats served | {res['alice_served']:,} / {res['waiting']:,} "
            f"({res['alice_s']:.1f} s) | all |",
            f"| bob's latency p50, idle / under the flood | {res['bob_idle_p50_ms']:.0f} ms / "
            f"{res['bob_loaded_p50_ms']:.0f} ms (**{res['bob_ratio']:.2f}x**; max "
            f"{res['bob_loaded_max_ms']:.0f} ms, {res['bob_requests']} requests, "
            f"{res['bob_failed']} failed) | <= 2x |",
            f"| `/health` p50 / p99 / max | {res['health_p50_ms']:.1f} / "
            f"{res['health_p99_ms']:.1f} / {res['health_max_ms']:.1f} ms | < 50 ms |",
            f"| the gateway's Redis connections at the peak | {res['redis_connections']:.0f} | "
            "bounded |",
            f"| the gateway's memory | {res['rss_before_mb']:.0f} -> {res['rss_peak_mb']:.0f} MB "
            f"(**{res['kb_per_waiting']:.0f} KB per waiting request**) | reported |",
        ]
    )


def run_and_print(params: dict[str, Any]) -> None:
    """``genq bench --scenario flood`` with the command's parameters."""
    from genq.worker.bench.modes import report_on_redis

    waiting = 500 if params["quick"] else 5000
    report_on_redis(params, lambda url: run_flood(url, waiting=waiting), flood_markdown)
