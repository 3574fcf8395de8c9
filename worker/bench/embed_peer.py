"""``genq bench --scenario embed-peer --peer-url URL``: ``genq serve`` and one embedding worker
against another OpenAI-compatible embedding server (the Infinity server, ``infinity-emb``), on
the same model and machine, both loaded, through the same client: the openai SDK.

Infinity's dependencies pin versions genq's do not allow (sentence-transformers < 4, numpy <
2), so it runs from its own environment, started by hand (docs/embeddings.md says how):

    infinity_emb v2 --model-id FOLDER --port 7997 --engine torch --device cpu

Two measures, each side in turn (genq first, then the peer first, ...):

- **saturation**: the ``embed`` scenario's mixed-length inputs as requests of
  ``PER_REQUEST`` inputs, ``CONCURRENCY`` at a time: inputs/s;
- **low load**: ``SINGLES`` requests of one short input, one at a time: p50 latency.

Reported: both sides' medians, genq ÷ peer for inputs/s (the goal: >= 1.0x) and for p50
latency (the goal: <= 1.2x), and the lowest cosine between the two servers' vectors of one
input. ``--quick``: 1,000 inputs, one round.
"""

from __future__ import annotations

import math
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from genq.common.errors import ConfigError
from genq.worker.bench.embed import INPUTS, MODEL, QUICK_INPUTS, workload
from genq.worker.devtools.worker_process import start_worker, stop_worker, wait_until_serving

PER_REQUEST = 32
CONCURRENCY = 8
SINGLES = 50


def _saturate(client: Any, model: str, texts: list[str]) -> tuple[float, list[list[float]]]:
    """Every text in requests of ``PER_REQUEST``, ``CONCURRENCY`` at a time: the seconds and
    the vectors, in order."""
    parts = [texts[i : i + PER_REQUEST] for i in range(0, len(texts), PER_REQUEST)]

    def one(part: list[str]) -> list[list[float]]:
        got = client.embeddings.create(model=model, input=part)
        return [d.embedding for d in sorted(got.data, key=lambda d: d.index)]

    t0 = time.perf_counter()
    with ThreadPoolExecutor(CONCURRENCY) as pool:
        vectors = [v for part in pool.map(one, parts) for v in part]
    return time.perf_counter() - t0, vectors


def _singles(client: Any, model: str, round_no: int) -> float:
    """The p50 seconds of ``SINGLES`` one-input requests, one at a time (new texts)."""
    seconds = []
    for i in range(SINGLES):
        t0 = time.perf_counter()
        client.embeddings.create(model=model, input=f"round {round_no} query {i}: rivers")
        seconds.append(time.perf_counter() - t0)
    return statistics.median(seconds)


def run_embed_peer(url: str, *, peer_url: str, n: int, repeats: int) -> dict[str, Any]:
    """Both servers, taking turns (see the module's docstring)."""
    import openai
    import redis
    from genq.worker.devtools.gateway_process import GatewayProcess

    texts = workload(n)
    peer = openai.OpenAI(base_url=peer_url.rstrip("/"), api_key="-", max_retries=0, timeout=600)
    try:
        peer_model = peer.models.list().data[0].id
    except openai.OpenAIError as err:
        raise ConfigError(f"no embedding server answers at {peer_url}: {err}") from None
    queue, consumer = f"bench-embed-peer-{time.time_ns()}", "embed-peer"
    proc = start_worker(redis_url=url, queue=queue, consumer=consumer, model=MODEL)
    log = Path(tempfile.mkdtemp()) / "gateway.log"
    gateway = GatewayProcess(url, queue, log)
    ours = openai.OpenAI(base_url=gateway.url, api_key="-", max_retries=0, timeout=600)
    sides = {"genq": (ours, MODEL), "peer": (peer, peer_model)}
    rates: dict[str, list[float]] = {name: [] for name in sides}
    p50s: dict[str, list[float]] = {name: [] for name in sides}
    vectors: dict[str, list[list[float]]] = {}
    try:
        wait_until_serving(redis.Redis.from_url(url), queue, consumer, proc)
        for client, model in sides.values():  # warm-up, untimed
            _saturate(client, model, texts[:200])
        for i in range(repeats):
            for name in list(sides) if i % 2 == 0 else list(reversed(sides)):
                client, model = sides[name]
                seconds, vectors[name] = _saturate(client, model, texts)
                rates[name].append(n / seconds)
                p50s[name].append(_singles(client, model, i))
    finally:
        gateway.stop()
        stop_worker(proc)
    pairs = zip(vectors["genq"], vectors["peer"], strict=True)
    rows: dict[str, dict[str, Any]] = {
        name: {
            "model": sides[name][1],
            "inputs_per_s": statistics.median(rates[name]),
            "p50_ms": statistics.median(p50s[name]) * 1000,
            "runs_inputs_per_s": [round(x) for x in rates[name]],
        }
        for name in sides
    }
    return {
        "inputs": n,
        "repeats": repeats,
        "per_request": PER_REQUEST,
        "concurrency": CONCURRENCY,
        "peer_url": peer_url,
        "sides": rows,
        "inputs_per_s_over_peer": rows["genq"]["inputs_per_s"] / rows["peer"]["inputs_per_s"],
        "p50_over_peer": rows["genq"]["p50_ms"] / rows["peer"]["p50_ms"],
        "lowest_cosine": min(cosine(a, b) for a, b in pairs),
    }


def cosine(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    return dot / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


def embed_peer_markdown(res: dict[str, Any]) -> str:
    lines = [
        f"{res['inputs']} inputs in requests of {res['per_request']}, {res['concurrency']} at a "
        f"time, and {SINGLES} single-input requests one at a time; {res['repeats']} round(s) "
        "taking turns, the openai SDK against both",
        "",
        "| server | model | inputs/s at saturation | runs | p50 ms, one input at low load |",
        "|---|---|---|---|---|",
    ]
    for name, row in res["sides"].items():
        lines.append(
            f"| {name} | {row['model']} | {row['inputs_per_s']:.0f} | "
            f"{row['runs_inputs_per_s']} | {row['p50_ms']:.1f} |"
        )
    lines += [
        "",
        f"genq ÷ peer: {res['inputs_per_s_over_peer']:.2f}x inputs/s, "
        f"{res['p50_over_peer']:.2f}x p50 latency; lowest cosine between the two servers' "
        f"vectors of one input: {res['lowest_cosine']:.7f}",
    ]
    return "\n".join(lines)


def run_and_print(params: dict[str, Any]) -> None:
    """``genq bench --scenario embed-peer`` with the command's parameters (``--peer-url``,
    ``--quick``, ``--repeats``, ``--redis-url``, ``--json``)."""
    import click
    from genq.worker.bench.modes import report_on_redis

    peer_url = params.get("peer_url")
    if not peer_url:
        raise click.UsageError("--scenario embed-peer needs --peer-url (the peer's base URL)")
    n, repeats = (QUICK_INPUTS, 1) if params["quick"] else (INPUTS, params["repeats"])
    report_on_redis(
        params,
        lambda url: run_embed_peer(url, peer_url=peer_url, n=n, repeats=repeats),
        embed_peer_markdown,
    )
