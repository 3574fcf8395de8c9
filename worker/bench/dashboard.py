"""``genq bench --scenario dashboard``: what the dashboard costs on a busy queue.

A private redis-server (unless ``--redis-url``), 10 echo workers busy on long steps (each holds
a batch, the rest waits), 10,000 waiting requests over 20 tenants and three priorities, and one
``genq serve``. Measured:

- **Redis' cost of a refresh**: the snapshot script's own execution time, read from Redis'
  SLOWLOG (threshold 0 while measuring), over ``reads`` reads: median and p99 (goal < 5 ms).
  Also the whole read as a client sees it (round trip and JSON), and the gateway's
  ``/dashboard/api/snapshot`` over HTTP.
- **Render**: Debian's chromium (headless, Playwright) loads ``/dashboard`` and draws the
  overview: the time from navigation to the first drawn overview, ``loads`` times (goal < 1 s).
  Skipped where chromium is not installed.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

CHROMIUM = "/usr/bin/chromium"
SCRIPT_MARK = "-- KEYS: the high, normal, low streams"
"""How the snapshot script's calls sent by source (EVAL, once after a flush) are told apart in
the SLOWLOG (its first line); those sent by hash are told by the hash."""


def _ms(values: list[float]) -> dict[str, float]:
    q = statistics.quantiles(values, n=100, method="inclusive") if len(values) > 1 else values
    return {"p50": statistics.median(values), "p99": q[-1] if len(values) < 3 else q[98]}


def run_dashboard(
    redis_url: str, *, workers: int, waiting: int, reads: int, loads: int
) -> dict[str, Any]:
    """The scenario on ``redis_url``."""
    import redis
    from genq.worker.devtools.gateway_process import GatewayProcess

    queue = "bench-dashboard"
    r = redis.Redis.from_url(redis_url)
    procs = _busy_queue(r, redis_url, queue, workers=workers, waiting=waiting)
    gateway = None
    try:
        script_ms, client_ms, stats = _script_reads(r, queue, reads)
        shown_waiting = sum(s["waiting"] + s["handed_back"] for s in stats["streams"].values())
        gateway = GatewayProcess(redis_url, queue, Path(tempfile.mkdtemp()) / "gateway.log")
        http_ms = []
        for _ in range(reads):
            started = time.perf_counter()
            with urllib.request.urlopen(f"{gateway.dashboard}/api/snapshot", timeout=30) as resp:
                size = len(resp.read())
            http_ms.append((time.perf_counter() - started) * 1000)
        render = _render_ms(gateway.dashboard, loads) if Path(CHROMIUM).exists() else []
    finally:
        if gateway is not None:
            gateway.stop()
        for p in procs:
            p.kill()
            p.wait(30)
        r.close()
    return {
        "workers": workers,
        "waiting": shown_waiting,
        "tenants": len(stats["tenants"]),
        "live_workers": len(stats["workers"]),
        "reads": reads,
        "script_ms": _ms(script_ms),
        "script_calls_seen": len(script_ms),
        "client_read_ms": _ms(client_ms),
        "http_snapshot_ms": _ms(http_ms),
        "http_snapshot_bytes": size,
        "render_ms": _ms(render) if render else None,
        "loads": len(render),
        "cpus": os.cpu_count(),
    }


def _busy_queue(r: Any, redis_url: str, queue: str, *, workers: int, waiting: int) -> list[Any]:
    """``workers`` echo workers, each holding a batch of 8 on a 60-s step, and ``waiting``
    requests left waiting (20 tenants, three priorities). Returns the worker processes."""
    from genq.producer import Client
    from genq.worker.devtools.worker_process import start_worker, wait_until_serving

    procs = []
    for i in range(workers):
        procs.append(
            start_worker(
                redis_url=redis_url,
                queue=queue,
                consumer=f"dash{i}",
                engine="echo",
                echo_step_ms=60_000,
                max_batch_size=8,
            )
        )
    for i, p in enumerate(procs):
        wait_until_serving(r, queue, f"dash{i}", p)
    priorities = ("high", "normal", "low")
    Client.from_url(redis_url, queue).submit_many(
        [
            {"prompt": f"p{i}", "tenant": f"team{i % 20}", "priority": priorities[i % 3]}
            for i in range(waiting + workers * 8)
        ],
        max_new_tokens=16,
    )
    time.sleep(3)  # the workers take their batches and beat
    return procs


def _script_reads(r: Any, queue: str, reads: int) -> tuple[list[float], list[float], Any]:
    """``reads`` snapshot reads: the script's time in Redis (SLOWLOG), the client's, and the
    last snapshot."""
    from genq.common import history, script_calls, snapshot
    from genq.common.keys import Keys
    from genq.common.lua.snapshot import SNAPSHOT

    keys = Keys(queue)
    snapshot.read(r, keys, history.BUCKETS)  # untimed: Redis caches the script (by hash after)
    r.config_set("slowlog-log-slower-than", 0)
    r.config_set("slowlog-max-len", 100_000)
    r.slowlog_reset()
    client_ms = []
    for _ in range(reads):
        started = time.perf_counter()
        raw = snapshot.read(r, keys, history.BUCKETS)
        stats = snapshot.stats_of(r, raw, queue)
        client_ms.append((time.perf_counter() - started) * 1000)
    entries: Any = r.slowlog_get(100_000)
    r.config_set("slowlog-log-slower-than", 10_000)
    marks = (SCRIPT_MARK, script_calls.sha_of(SNAPSHOT))  # by its source, or by its hash
    script_ms = [
        e["duration"] / 1000 for e in entries if any(m in _text(e["command"]) for m in marks)
    ]
    return script_ms, client_ms, stats


def _text(command: Any) -> str:
    return command.decode(errors="replace") if isinstance(command, bytes) else str(command)


def _render_ms(base: str, loads: int) -> list[float]:
    """Navigation to the overview's first drawing, in a fresh browser page each time."""
    from playwright.sync_api import sync_playwright

    out = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM)
        try:
            for _ in range(loads + 1):  # the first warms the browser up: not counted
                page = browser.new_page(viewport={"width": 1280, "height": 900})
                page.goto(f"{base}#overview")
                page.wait_for_function("() => document.body.dataset.firstDrawnMs")
                out.append(float(page.evaluate("document.body.dataset.firstDrawnMs")))
                page.close()
        finally:
            browser.close()
    return out[1:]


def dashboard_markdown(res: dict[str, Any]) -> str:
    """The BENCHMARKS.md table of one run."""
    render = res["render_ms"]
    rows = [
        "| measure | p50 | p99 |",
        "|---|---|---|",
        f"| snapshot script in Redis (SLOWLOG), ms | {res['script_ms']['p50']:.2f} | "
        f"{res['script_ms']['p99']:.2f} |",
        f"| snapshot read by a client (round trip + JSON), ms | "
        f"{res['client_read_ms']['p50']:.2f} | {res['client_read_ms']['p99']:.2f} |",
        f"| GET /dashboard/api/snapshot over HTTP, ms | {res['http_snapshot_ms']['p50']:.1f} | "
        f"{res['http_snapshot_ms']['p99']:.1f} |",
    ]
    if render:
        rows.append(
            f"| overview drawn after navigation (chromium), ms | {render['p50']:.0f} | "
            f"{render['p99']:.0f} |"
        )
    return "\n".join(
        [
            f"{res['live_workers']} workers, {res['waiting']:,} requests waiting over "
            f"{res['tenants']} tenants; {res['reads']} reads, {res['loads']} page loads",
            "",
            *rows,
        ]
    )


def run_and_print(params: dict[str, Any]) -> None:
    """``genq bench --scenario dashboard`` with the command's parameters."""
    from genq.worker.bench.modes import report_on_redis

    quick = params["quick"]
    sizes = {
        "workers": 3 if quick else 10,
        "waiting": 1_000 if quick else 10_000,
        "reads": 20 if quick else 200,
        "loads": 2 if quick else 10,
    }
    report_on_redis(params, lambda url: run_dashboard(url, **sizes), dashboard_markdown)
