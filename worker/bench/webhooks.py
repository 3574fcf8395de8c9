"""``genq bench --scenario webhooks``: how soon a webhook follows a final state, and how many
deliveries one gateway makes per second.

A private redis-server (unless ``--redis-url``), one echo worker, one ``genq serve`` with
``--webhook-url`` pointing at a receiver in this process (``webhook_receiver.py``: a threaded
HTTP server that answers 200 at once and notes when each delivery arrived). **Latency**:
background responses created one by one, each delivery's arrival against its response's
``finished_unix_ms`` (the final state's time, Redis' clock on this same host): median and p99.
**Throughput**: with the gateway stopped, events are put in the outbox directly; a fresh gateway
delivers them all: deliveries per second from its first delivery to its last (a lower bound: the
receiver is Python's http.server, one connection per delivery).
"""

from __future__ import annotations

import base64
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from genq.worker.devtools.webhook_receiver import Receiver

SECRET = "whsec_" + base64.b64encode(b"genq bench webhook secret").decode()


def run_webhooks(redis_url: str, *, responses: int, events: int) -> dict[str, Any]:
    """The scenario on ``redis_url``: latency over ``responses`` background responses, and
    the throughput of delivering ``events`` queued events."""
    import logging

    import httpx
    import redis
    from genq.common.keys import Keys
    from genq.worker.devtools.gateway_process import GatewayProcess
    from genq.worker.devtools.worker_process import start_worker, wait_until_serving

    logging.getLogger("httpx").setLevel(logging.WARNING)
    queue, log = "bench-hooks", Path(tempfile.mkdtemp())
    keys, r = Keys(queue), redis.Redis.from_url(redis_url)
    receiver = Receiver()
    flags = ["--webhook-url", receiver.url, "--webhook-secret", SECRET]
    worker = start_worker(redis_url=redis_url, queue=queue, consumer="hooks0", engine="echo")
    gateway = GatewayProcess(redis_url, queue, log / "gateway.log", flags)
    try:
        wait_until_serving(r, queue, "hooks0", worker)
        finished: dict[str, float] = {}
        with httpx.Client(base_url=gateway.url, timeout=30) as http:
            for i in range(responses):
                body = {"model": "echo", "input": f"n{i}", "background": True}
                finished[http.post("/responses", json=body).json()["id"]] = 0.0
                time.sleep(0.01)  # one at a time, as a steady stream of jobs ends
        _wait(lambda: set(_first_arrivals(receiver)) >= set(finished), 120)
        for response_id in finished:
            raw = r.get(keys.result(response_id.removeprefix("resp_")))
            finished[response_id] = json.loads(raw or "{}")["timings"]["finished_unix_ms"]
        arrived = _first_arrivals(receiver)
        latencies = [arrived[i] - f for i, f in finished.items()]
        gateway.stop()
        before = len(receiver.deliveries)
        pipe = r.pipeline(transaction=False)
        for i in range(events):
            pipe.xadd(keys.webhook_events, {"type": "response.completed", "id": f"resp_b{i}"})
        pipe.execute()
        gateway = GatewayProcess(redis_url, queue, log / "gateway2.log", flags)
        _wait(lambda: len(receiver.deliveries) - before >= events, 300)
        times = [d.at_ms for d in receiver.deliveries[before:]]
        span_s = (max(times) - min(times)) / 1000
    finally:
        gateway.stop()
        worker.terminate()
        worker.wait(30)
        receiver.close()
        r.close()
    q = statistics.quantiles(latencies, n=100, method="inclusive")
    return {
        "responses": responses,
        "latency_p50_ms": statistics.median(latencies),
        "latency_p99_ms": q[98],
        "latency_max_ms": max(latencies),
        "events": events,
        "deliveries_per_s": (events - 1) / span_s if span_s > 0 else float("inf"),
        "cpus": os.cpu_count(),
    }


def _first_arrivals(receiver: Receiver) -> dict[str, float]:
    """Each event's object id -> when its first delivery arrived (Unix ms)."""
    out: dict[str, float] = {}
    for d in list(receiver.deliveries):
        out.setdefault(json.loads(d.body)["data"]["id"], d.at_ms)
    return out


def _wait(done: Any, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > deadline:
            raise TimeoutError("webhook deliveries did not all arrive")
        time.sleep(0.05)


def webhooks_markdown(res: dict[str, Any]) -> str:
    """The BENCHMARKS.md table of one run."""
    return "\n".join(
        [
            "| measure | value |",
            "|---|---|",
            f"| responses (background, echo worker) | {res['responses']} |",
            f"| delivery after the final state, p50 / p99 / max ms | "
            f"{res['latency_p50_ms']:.1f} / {res['latency_p99_ms']:.1f} / "
            f"{res['latency_max_ms']:.1f} |",
            f"| events delivered by one fresh gateway | {res['events']} |",
            f"| deliveries per second (first to last) | {res['deliveries_per_s']:.0f} |",
        ]
    )


def run_and_print(params: dict[str, Any]) -> None:
    """``genq bench --scenario webhooks`` with the command's parameters."""
    from genq.worker.bench.modes import report_on_redis

    sizes = (50, 500) if params["quick"] else (300, 3000)
    report_on_redis(
        params,
        lambda url: run_webhooks(url, responses=sizes[0], events=sizes[1]),
        webhooks_markdown,
    )
