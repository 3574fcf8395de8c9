"""``genq bench --scenario gateway``: what ``genq serve`` adds over the Python client.

An echo worker (``--max-wait-ms 0``) serves one queue; the same small completion (4 tokens)
is sent, one at a time and alternating, through the Python client and through the official
openai SDK against one ``genq serve`` process: the added latency is the difference of the
medians. Then many at once (asyncio, ``concurrency`` in flight) through each, and through a
bare HTTP/1.1 client: requests/s, and their ratios. The openai SDK is a dev dependency.
"""

from __future__ import annotations

import asyncio
import json
import logging
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from genq.producer import AsyncClient, Client
from genq.worker.bench.modes import percentile
from genq.worker.devtools.gateway_process import GatewayProcess
from genq.worker.devtools.worker_process import start_worker

PROMPT = "a short prompt for the gateway benchmark"
QUEUE = "gateway-bench"


def run_gateway_scenario(
    redis_url: str, *, sequential: int = 300, concurrent: int = 2000, concurrency: int = 64
) -> dict[str, Any]:
    """Latencies (ms: p50, p99 each way; added = p50 difference) and requests/s each way."""
    import openai

    # --max-wait-ms 0: one request at a time would otherwise wait for a fuller batch (the
    # arrival estimate sees a steady stream), which is the worker's choice, not the path's.
    worker = start_worker(
        redis_url=redis_url, queue=QUEUE, engine="echo", max_queue_depth=0, max_wait_ms=0
    )
    for name in ("httpx", "httpx2", "openai"):  # one INFO line per request otherwise
        logging.getLogger(name).setLevel(logging.WARNING)
    log = Path(tempfile.mkdtemp()) / "gateway.log"
    gateway = GatewayProcess(redis_url, QUEUE, log)
    try:
        sdk = openai.OpenAI(base_url=gateway.url, api_key="-", max_retries=0)
        client = Client.from_url(redis_url, QUEUE)
        _wait_for_models(sdk)
        direct: list[float] = []
        via: list[float] = []
        for i in range(sequential + 20):  # the first 20 warm up
            t = time.perf_counter()
            client.generate(PROMPT, max_new_tokens=4, timeout=30)
            d = time.perf_counter() - t
            t = time.perf_counter()
            sdk.completions.create(model="echo", prompt=PROMPT, max_tokens=4)
            v = time.perf_counter() - t
            if i >= 20:
                direct.append(d * 1000)
                via.append(v * 1000)
        client.close()
        rates = asyncio.run(_throughput(redis_url, gateway.url, concurrent, concurrency))
    finally:
        gateway.stop()
        worker.terminate()
        worker.wait(timeout=30)
    return {
        "client_ms": {"p50": statistics.median(direct), "p99": percentile(direct, 0.99)},
        "gateway_ms": {"p50": statistics.median(via), "p99": percentile(via, 0.99)},
        "added_ms_p50": statistics.median(via) - statistics.median(direct),
        **rates,
        "sequential": sequential,
        "concurrent": concurrent,
        "concurrency": concurrency,
    }


def _wait_for_models(sdk: Any) -> None:
    deadline = time.monotonic() + 60
    while not sdk.models.list().data:
        if time.monotonic() > deadline:
            raise RuntimeError("the gateway saw no live worker within 60 s")
        time.sleep(0.1)


async def _throughput(redis_url: str, url: str, n: int, concurrency: int) -> dict[str, float]:
    import openai

    sdk = openai.AsyncOpenAI(base_url=url, api_key="-", max_retries=0, timeout=120)
    client = AsyncClient.from_url(redis_url, QUEUE)
    gate = asyncio.Semaphore(concurrency)

    async def one_direct() -> None:
        async with gate:
            await client.generate(PROMPT, max_new_tokens=4, timeout=120)

    async def one_via() -> None:
        async with gate:
            await sdk.completions.create(model="echo", prompt=PROMPT, max_tokens=4)

    out: dict[str, float] = {}
    for name, one in (("client_rps", one_direct), ("gateway_rps", one_via)):
        t = time.perf_counter()
        await asyncio.gather(*(one() for _ in range(n)))
        out[name] = n / (time.perf_counter() - t)
    await client.close()
    await sdk.close()
    t = time.perf_counter()
    per_connection = n // concurrency
    await asyncio.gather(*(_raw_http(url, per_connection) for _ in range(concurrency)))
    out["gateway_raw_rps"] = per_connection * concurrency / (time.perf_counter() - t)
    out["gateway_over_client"] = out["gateway_rps"] / out["client_rps"]
    out["gateway_raw_over_client"] = out["gateway_raw_rps"] / out["client_rps"]
    return out


async def _raw_http(url: str, n: int) -> None:
    """``n`` completions over one keep-alive HTTP/1.1 connection, with no client library: what
    one gateway process serves when the client costs next to nothing (the openai SDK's own
    work per request is most of a 2-core machine's time at these rates)."""
    host, port = url.split("//")[1].split("/")[0].split(":")
    body = json.dumps({"model": "echo", "prompt": PROMPT, "max_tokens": 4}).encode()
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        for _ in range(n):
            writer.write(head + body)
            await writer.drain()
            length = 0
            while (line := await reader.readline()) not in (b"\r\n", b""):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            reply = await reader.readexactly(length)
            if b'"choices"' not in reply:
                raise RuntimeError(f"the gateway answered {reply[:200]!r}")
    finally:
        writer.close()


def gateway_markdown(res: dict[str, Any]) -> str:
    c, g = res["client_ms"], res["gateway_ms"]
    return "\n".join(
        [
            "| path | p50 ms | p99 ms | requests/s (concurrent) |",
            "|---|---|---|---|",
            f"| Python client | {c['p50']:.2f} | {c['p99']:.2f} | {res['client_rps']:.0f} |",
            f"| openai SDK via genq serve | {g['p50']:.2f} | {g['p99']:.2f} | "
            f"{res['gateway_rps']:.0f} |",
            f"| bare HTTP/1.1 keep-alive via genq serve | | | {res['gateway_raw_rps']:.0f} |",
            "",
            f"Added by the gateway (p50 difference, {res['sequential']} sequential pairs, "
            f"alternating): **{res['added_ms_p50']:.2f} ms**. Throughput through one gateway "
            f"process: {res['gateway_over_client']:.2f}x the Python client's with the openai "
            f"SDK as the client, {res['gateway_raw_over_client']:.2f}x with a bare HTTP client "
            f"({res['concurrent']} requests, {res['concurrency']} in flight; client, gateway, "
            "worker and Redis share the machine).",
        ]
    )


def run_and_print(params: dict[str, Any]) -> None:
    """``genq bench --scenario gateway`` with the command's parameters."""
    from genq.worker.bench.modes import report_on_redis

    sizes = {"sequential": 20, "concurrent": 100} if params["quick"] else {}
    report_on_redis(params, lambda url: run_gateway_scenario(url, **sizes), gateway_markdown)
