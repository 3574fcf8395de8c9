"""``genq bench --scenario batch``: a batch file of any size, run in waves.

Each case runs on its own fresh redis-server (so that ``used_memory_peak`` is the case's),
with echo workers (``WORKERS``, steps of 0 ms: the queue's own cost) and one ``genq serve``
on a shared file store. Measured, in one run:

- **Size**: a batch of ``lines`` lines (1,000,000; ``--quick``: 20,000) and one of
  ``small`` lines (10,000; quick: 2,000), each end to end (``genq batch``'s upload and rounds,
  from the file to its last output line written): Redis' peak memory (goal: <= 100 MB, and
  within 1.5x of the small batch's), lines/s, and the output file checked to hold every
  ``custom_id`` exactly once.
- **Plain requests**: the same work submitted as plain requests (``submit_many`` in chunks of
  ``PLAIN_CHUNK``, results read as they come): lines/s and Redis' peak memory. Goal: the batch's
  lines/s >= 0.9x the plain requests'.
- **Status**: ``GET /v1/batches/{id}`` timed while each batch runs (p50; goal: the big batch's
  within 2x of a 1,000-line batch's).
- **Beside online work** (another tenant's single requests beside a batch of the big case's
  size, on the tenants scenario's fleet) and **faults** (a 200,000-line batch through three
  kills): ``batch_faults.py``. Apart from the big case, so that the big case's lines/s and
  Redis peak are the batch's alone.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import redis
from genq.producer import Client
from genq.producer.gateway import wave_files
from genq.producer.gateway.file_store import FileStore

WORKERS = 2
BATCH_SIZE = 256
WINDOW = 10_000
PLAIN_CHUNK = 10_000
PLAIN_IN_FLIGHT = 50_000
"""Plain requests a bench client keeps submitted and not yet read (the queue's default depth
is 100,000)."""
BODY = {"model": "echo", "prompt": "a line of a big batch", "max_tokens": 2}


def write_file(path: Path, n: int, max_tokens: int = 2) -> None:
    body = {**BODY, "max_tokens": max_tokens}
    with path.open("w") as f:
        for i in range(n):
            line = {"custom_id": f"c{i}", "url": "/v1/completions", "body": body}
            f.write(json.dumps(line) + "\n")


def _status_times(base: str, batch_id: str, stop: threading.Event, out: list[float]) -> None:
    """``GET /v1/batches/{id}``, timed, every 50 ms until ``stop``."""
    while not stop.is_set():
        t0 = time.perf_counter()
        with urllib.request.urlopen(f"{base}/batches/{batch_id}", timeout=30) as answer:
            answer.read()
        out.append((time.perf_counter() - t0) * 1000)
        stop.wait(0.05)


def _idle_status_times(base: str, batch_id: str, n: int = 200) -> list[float]:
    """``GET /v1/batches/{id}`` timed ``n`` times one after another, the batch done (the
    read's own cost, without the run's load on the machine)."""
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        with urllib.request.urlopen(f"{base}/batches/{batch_id}", timeout=30) as answer:
            answer.read()
        out.append((time.perf_counter() - t0) * 1000)
    return out


def run_batch_case(n: int, files: Path, name: str) -> dict[str, Any]:
    """One batch of ``n`` lines end to end on a fresh Redis; what it measured."""
    from genq.worker.bench.fleet import Fleet
    from genq.worker.devtools.gateway_process import GatewayProcess
    from genq.worker.devtools.redis_server import RedisServer

    src = files / f"{name}.jsonl"
    write_file(src, n)
    store = FileStore(str(files / "store"))
    with RedisServer() as server:
        queue = f"batch-{name}"
        r = redis.Redis.from_url(server.url)
        gateway = GatewayProcess(server.url, queue, None, ["--files-dir", store.where])
        times: list[float] = []
        stop = threading.Event()
        try:
            with Fleet(server.url, queue, [0.0] * WORKERS, BATCH_SIZE), Client(r, queue) as c:
                t0 = time.perf_counter()
                bid = wave_files.upload_and_create(
                    c, store, str(src), source=src.name, window=WINDOW
                )
                probe = threading.Thread(
                    target=_status_times, args=(gateway.url, bid, stop, times), daemon=True
                )
                probe.start()
                wave_files.run_until(c, store, bid, lambda rec: bool(rec.get("finished_at_ms")))
                seconds = time.perf_counter() - t0
                stop.set()
                probe.join()
                peak = int(r.info("memory")["used_memory_peak"])
                idle = _idle_status_times(gateway.url, bid)
        finally:
            stop.set()
            gateway.stop()
        ids = [
            json.loads(line)["custom_id"]
            for line in b"".join(
                wave_files.read_parts(store, wave_files.parts(store, bid, "output"))
            ).splitlines()
        ]
    return {
        "lines": n,
        "seconds": seconds,
        "lines_per_s": n / seconds,
        "redis_peak_mb": peak / 1e6,
        "status_p50_ms": statistics.median(times) if times else None,
        "status_reads": len(times),
        "status_idle_p50_ms": statistics.median(idle),
        "every_custom_id_once": len(ids) == n and len(set(ids)) == n,
    }


def run_plain_case(n: int) -> dict[str, Any]:
    """The same ``n`` requests as plain requests, in chunks, their results read as they come."""
    from genq.worker.bench.fleet import Fleet
    from genq.worker.devtools.redis_server import RedisServer

    with RedisServer() as server:
        queue = "batch-plain"
        r = redis.Redis.from_url(server.url)
        with Fleet(server.url, queue, [0.0] * WORKERS, BATCH_SIZE), Client(r, queue) as c:
            t0 = time.perf_counter()
            pending: list[str] = []
            done = []
            for start in range(0, n, PLAIN_CHUNK):
                if len(pending) >= PLAIN_IN_FLIGHT:  # as a client under --max-queue-depth would
                    done += c.results(pending[:PLAIN_CHUNK], timeout=3600)
                    pending = pending[PLAIN_CHUNK:]
                chunk = [str(BODY["prompt"])] * min(PLAIN_CHUNK, n - start)
                pending += c.submit_many(chunk, max_new_tokens=2)
            done += c.results(pending, timeout=3600)
            seconds = time.perf_counter() - t0
            peak = int(r.info("memory")["used_memory_peak"])
    ok = sum(1 for x in done if x.status == "succeeded")
    return {
        "lines": n,
        "seconds": seconds,
        "lines_per_s": n / seconds,
        "redis_peak_mb": peak / 1e6,
        "succeeded": ok,
    }


def run_batch_scenario(*, quick: bool) -> dict[str, Any]:
    from genq.worker.bench.batch_faults import ONLINE_TOKENS, run_faults_case, run_online_case

    big, small, tiny = (10_000, 2_000, 1_000) if quick else (1_000_000, 10_000, 1_000)
    with tempfile.TemporaryDirectory(prefix="genq-bench-batch-") as tmp:
        files = Path(tmp)
        cases = {}
        for name, n in (("small", small), ("status_1000", tiny), ("big", big)):
            cases[name] = run_batch_case(n, files, name)
            print(json.dumps({name: cases[name]}), file=sys.stderr)  # kept if a later case fails
            (files / f"{name}.jsonl").unlink(missing_ok=True)
        n = 20_000 if quick else big
        write_file(files / "online.jsonl", n, max_tokens=ONLINE_TOKENS)
        online = run_online_case(files / "online.jsonl", n, files, run_s=3.0 if quick else 30.0)
        print(json.dumps({"online": online}), file=sys.stderr)
        (files / "online.jsonl").unlink(missing_ok=True)
        n = 3_000 if quick else 200_000
        write_file(files / "faults.jsonl", n)
        faults = run_faults_case(files / "faults.jsonl", n, files)
        print(json.dumps({"faults": faults}), file=sys.stderr)
    cases["plain"] = run_plain_case(big)
    b, s, p = cases["big"], cases["small"], cases["plain"]
    t = cases["status_1000"]
    ratios = {
        "peak_big_over_small": b["redis_peak_mb"] / s["redis_peak_mb"],
        "lines_per_s_batch_over_plain": b["lines_per_s"] / p["lines_per_s"],
        "status_p50_big_over_1000": (b["status_p50_ms"] or 0) / (t["status_p50_ms"] or 1),
        "status_idle_p50_big_over_1000": b["status_idle_p50_ms"] / t["status_idle_p50_ms"],
    }
    return {
        "cases": cases,
        "ratios": ratios,
        "faults": faults,
        "online": online,
        "workers": WORKERS,
        "window": WINDOW,
    }


def batch_markdown(res: dict[str, Any]) -> str:
    c, q = res["cases"], res["ratios"]
    rows = [
        "| case | lines | seconds | lines/s | Redis peak MB | status p50 ms, running | "
        "status p50 ms, done | every id once |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for name, x in c.items():
        p50, idle = x.get("status_p50_ms"), x.get("status_idle_p50_ms")
        rows.append(
            f"| {name} | {x['lines']:,} | {x['seconds']:.1f} | {x['lines_per_s']:,.0f} | "
            f"{x['redis_peak_mb']:.1f} | {'' if p50 is None else f'{p50:.2f}'} | "
            f"{'' if idle is None else f'{idle:.2f}'} | "
            f"{x.get('every_custom_id_once', x.get('succeeded') == x['lines'])} |"
        )
    rows += [
        "",
        f"Workers: {res['workers']} echo; window {res['window']:,}.",
        f"Redis peak, big over small: **{q['peak_big_over_small']:.2f}x** (goal <= 1.5x; big "
        "<= 100 MB).",
        f"Lines/s, batch over plain requests: **{q['lines_per_s_batch_over_plain']:.2f}x** "
        "(goal >= 0.9x).",
        f"Status p50, big over 1,000 lines: **{q['status_idle_p50_big_over_1000']:.2f}x** read "
        f"after each finished (goal <= 2x); {q['status_p50_big_over_1000']:.2f}x read while "
        "each ran (the machine's load: the small one ran for under a second).",
        "",
        _online_line(res["online"]),
        _faults_line(res["faults"]),
    ]
    return "\n".join(rows)


def _online_line(o: dict[str, Any]) -> str:
    b, f, i = o["beside_batch"], o["beside_flood"], o["idle"]
    return (
        f"Beside a batch (the tenants scenario's flood vs trickle with the flood a "
        f"{o['lines']:,}-line batch: 3 echo workers, 2 ms steps, batches of 16, 16 tokens), "
        f"tenant `online`'s {b['requests']} requests (one every 50 ms, with "
        f"{o['fed_when_measured']:,} lines fed, at {o['batch_lines_per_s']:,.0f} lines/s) "
        "waited p50 "
        f"{b['wait_p50_ms']:.0f} / p99 **{b['wait_p99_ms']:.0f}** / max {b['wait_max_ms']:.0f} ms; "
        f"beside the same tenant's flood of plain requests: {f['wait_p50_ms']:.0f} / "
        f"{f['wait_p99_ms']:.0f} / {f['wait_max_ms']:.0f} ms; alone on the idle fleet: "
        f"{i['wait_p50_ms']:.0f} / {i['wait_p99_ms']:.0f} ms. Goal p99 <= 2 x idle p99 + one "
        f"batch: {o['goal_ms']:.0f} ms with the {o['batch_ms']:.0f} ms of simulated steps, "
        f"{o['goal_ran_ms']:.0f} ms with the {b['ran_ms']:.0f} ms a batch ran: "
        f"{'met' if o['met'] else 'NOT met'}."
    )


def _faults_line(f: dict[str, Any]) -> str:
    return (
        f"Faults, a {f['lines']:,}-line batch killed (-9) in turn: {'; '.join(f['kills'])}; "
        f"`submit --batch-id` again and `results`: {f['output_lines']:,} output lines, every "
        f"custom_id once: **{f['every_custom_id_once']}**, error lines {f['error_lines']}, "
        f"counters equal the output: **{f['counters_equal_output']}** "
        f"({f['counters']['completed']:,} completed, {f['counters']['failed']} failed), "
        f"{f['seconds']:.0f} s in all."
    )


def run_and_print(params: dict[str, Any]) -> None:
    """``genq bench --scenario batch`` (its cases start their own redis-servers)."""
    import click
    from genq.worker.bench.modes import machine_info

    res = run_batch_scenario(quick=params["quick"])
    if params["as_json"]:
        click.echo(json.dumps({"machine": machine_info(), **res}, indent=2))
        return
    click.echo("Machine: " + ", ".join(f"{k} {v}" for k, v in machine_info().items()))
    click.echo("")
    click.echo(batch_markdown(res))
