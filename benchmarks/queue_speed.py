"""The queue's own speed: N no-op jobs through genq (echo engine) and peer task queues on one
redis-server, one worker process each, end to end (enqueue until every result is readable by
the producer); each phase timed on its own, medians of --repeats runs.

    python3 -m venv .venv-peers && .venv-peers/bin/pip install torch==2.13.0 -e ".[bench-peers]"
    .venv-peers/bin/python benchmarks/queue_speed.py --jobs 20000 --repeats 3

A venv of its own: arq pins redis-py below 6, which genq's own venv should not get.
``--json``: the medians (and genq's CPU seconds per process) as one JSON line, for
``benchmarks/queue_speed_turns.py``, which runs this script against other trees of genq.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import redis
from genq.worker.devtools.redis_server import RedisServer

try:
    from genq.worker.bench.modes import machine_info
except ImportError:  # an older tree run by queue_speed_turns.py (before worker/bench existed)
    from genq.worker.devtools.bench_modes import machine_info  # type: ignore[no-redef]

ROOT = Path(__file__).resolve().parent.parent
Result = dict[str, float]


PADDING = {"bytes": 0}
"""``--prompt-bytes``: what each job's prompt carries besides its number (a chat's history)."""


def job(i: int) -> str:
    """The payload of job ``i``: its number, and ``--prompt-bytes`` more."""
    return f"job {i} " + "x" * PADDING["bytes"]


def _spawn(args: list[str], port: int) -> subprocess.Popen[bytes]:
    # The caller's PYTHONPATH first: queue_speed_turns.py puts another tree of genq there.
    path = os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), str(ROOT)) if p)
    env = {**os.environ, "PYTHONPATH": path, "BENCH_REDIS_PORT": str(port)}
    return subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)  # fmt: skip


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _wait(pred: Callable[[], object], timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not pred():
        if time.monotonic() > deadline:
            raise TimeoutError("worker did not start")
        time.sleep(0.05)


def versions() -> str:
    """The versions of what the numbers depend on: the Redis client stack and the peers."""
    from importlib.metadata import PackageNotFoundError, version

    out = []
    for name in ("redis", "hiredis", "pydantic", "orjson", "rq", "arq"):
        with contextlib.suppress(PackageNotFoundError):
            out.append(f"{name} {version(name)}")
    server = redis_server_version()
    return ", ".join(([f"redis-server {server}"] if server else []) + out)


def redis_server_version() -> str:
    try:
        out = subprocess.run(["redis-server", "--version"], capture_output=True, text=True)
    except OSError:
        return ""
    return next((w.split("=")[1] for w in out.stdout.split() if w.startswith("v=")), "")


def _redis_counters(r: redis.Redis) -> tuple[int, float]:
    """(commands run so far, CPU seconds used so far) of the redis-server."""
    stats: dict[str, dict[str, float]] = r.info("commandstats")  # type: ignore[assignment]
    cpu: dict[str, float] = r.info("cpu")  # type: ignore[assignment]
    calls = sum(int(v["calls"]) for k, v in stats.items() if k != "cmdstat_info")
    return calls, float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])


def _cpu_s(proc: subprocess.Popen[bytes]) -> float:
    """CPU seconds (user and system) a running child has used so far (Linux: 0 elsewhere)."""
    try:
        with open(f"/proc/{proc.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_genq(server: RedisServer, n: int, run: int, workers: int = 1) -> Result:
    from genq.common.keys import Keys
    from genq.producer import Client

    queue = f"speed{run}w{workers}"
    r = redis.Redis(port=server.port)
    procs = [
        _spawn(
            [
                sys.executable,
                "-m",
                "genq.worker",
                "worker",
                "--redis-url",
                server.url,
                "--queue",
                queue,
                "--engine",
                "echo",
                "--consumer",
                f"w{i}",
                "--max-batch-size",
                "256",
                "--max-lookahead",
                "512",
                "--max-queue-depth",
                "0",
            ],
            server.port,
        )
        for i in range(workers)
    ]
    try:
        _wait(lambda: all(r.exists(Keys(queue).worker(f"w{i}")) for i in range(workers)))
        client = Client.from_url(server.url, queue)
        calls0, cpu0 = _redis_counters(r)
        worker0, client0 = sum(_cpu_s(p) for p in procs), time.process_time()
        t0 = time.perf_counter()
        ids = client.submit_many([job(i) for i in range(n)], max_new_tokens=16)
        t1 = time.perf_counter()
        results = client.results(ids, timeout=600)
        t2 = time.perf_counter()
        calls1, cpu1 = _redis_counters(r)
        worker1, client1 = sum(_cpu_s(p) for p in procs), time.process_time()
        assert all(x.status == "succeeded" for x in results)
    finally:
        for proc in procs:
            _stop(proc)
    return {"enqueue_s": t1 - t0, "rest_s": t2 - t1, "total_s": t2 - t0,
            "redis_commands_per_job": (calls1 - calls0) / n,
            "redis_cpu_s": cpu1 - cpu0, "worker_cpu_s": worker1 - worker0,
            "client_cpu_s": client1 - client0}  # fmt: skip


def run_rq(server: RedisServer, n: int, run: int) -> Result:
    from rq import Queue
    from rq.job import Job, JobStatus

    r = redis.Redis(port=server.port)
    name = f"speed{run}"
    proc = _spawn([sys.executable, "-m", "rq.cli", "worker", "--url", server.url,
                   "--worker-class", "rq.worker.SimpleWorker", name], server.port)  # fmt: skip
    try:
        _wait(lambda: any(True for _ in r.scan_iter("rq:worker:*")))
        sys.path.insert(0, str(ROOT))
        from benchmarks.peer_jobs import noop

        q = Queue(name, connection=r)
        t0 = time.perf_counter()
        jobs = q.enqueue_many([Queue.prepare_data(noop, (job(i),)) for i in range(n)])
        t1 = time.perf_counter()
        ids = [j.id for j in jobs]
        pending = ids
        while pending:
            # RQ has no way to wait for many results at once: poll the statuses of the oldest
            # 500 unfinished (jobs finish in order), every 10 ms, like a fair client would.
            head = pending[:500]
            got = Job.fetch_many(head, connection=r)
            done = {
                i
                for i, j in zip(head, got, strict=True)
                if j is not None and j.get_status(refresh=False) == JobStatus.FINISHED
            }
            pending = [i for i in pending if i not in done] if done else pending
            if pending and not done:
                time.sleep(0.01)
        t2 = time.perf_counter()
    finally:
        _stop(proc)
    return {"enqueue_s": t1 - t0, "rest_s": t2 - t1, "total_s": t2 - t0}


def run_arq(server: RedisServer, n: int, run: int) -> Result:
    from arq import create_pool
    from arq.connections import RedisSettings

    r = redis.Redis(port=server.port)
    r.flushdb()  # arq uses fixed key names: start each run clean
    proc = _spawn([sys.executable, "-m", "arq", "benchmarks.peer_jobs.ArqSettings"], server.port)

    async def main() -> Result:
        pool = await create_pool(RedisSettings(port=server.port))
        _wait(lambda: r.exists("arq:queue:health-check"), 60)
        t0 = time.perf_counter()
        jobs = await asyncio.gather(*(pool.enqueue_job("arq_noop", job(i)) for i in range(n)))
        t1 = time.perf_counter()
        await asyncio.gather(*(j.result(timeout=600, poll_delay=0.01) for j in jobs if j))
        t2 = time.perf_counter()
        await pool.aclose()
        return {"enqueue_s": t1 - t0, "rest_s": t2 - t1, "total_s": t2 - t0}

    try:
        return asyncio.run(main())
    finally:
        _stop(proc)


SYSTEMS = {"genq": run_genq, "rq": run_rq, "arq": run_arq}


def scaling(n: int, repeats: int, counts: list[int]) -> None:
    """genq's echo throughput with 1, 2, 4... worker processes on one redis-server, with the
    Redis commands per job and the redis-server's CPU seconds (what limits the curve)."""
    lines = [
        f"Command: `python benchmarks/queue_speed.py --jobs {n} --repeats {repeats} "
        f"--genq-workers {','.join(map(str, counts))}`  ",
        "Machine: " + ", ".join(f"{k} {v}" for k, v in machine_info().items()) + "  ",
        "Versions: " + versions() + "  ",
        "",
        "| workers | jobs/s end to end (median) | runs | vs 1 worker | Redis commands per job "
        "| redis-server CPU s per 10k jobs |",
        "|---|---|---|---|---|---|",
    ]
    base = 0.0
    with RedisServer() as server:
        for k in counts:
            runs = [run_genq(server, n, i, workers=k) for i in range(repeats)]
            redis.Redis(port=server.port).flushdb()
            rate = n / statistics.median(r["total_s"] for r in runs)
            base = base or rate
            cmds = statistics.median(r["redis_commands_per_job"] for r in runs)
            cpu = statistics.median(r["redis_cpu_s"] for r in runs) / n * 10_000
            per_run = [round(n / r["total_s"]) for r in runs]
            lines.append(f"| {k} | {rate:,.0f} | {per_run} | {rate / base:.2f}x | {cmds:.2f} "
                         f"| {cpu:.2f} |")  # fmt: skip
            print(lines[-1], file=sys.stderr)
    print("\n".join(lines))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--jobs", type=int, default=20000)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--systems", default="genq,rq,arq")
    p.add_argument("--markdown", action="store_true")
    p.add_argument("--json", action="store_true", help="the medians as one JSON line")
    p.add_argument("--genq-workers", default="", help="e.g. 1,2,4: genq alone, scaling workers")
    p.add_argument("--prompt-bytes", type=int, default=0, help="more in each job's prompt")
    a = p.parse_args()
    PADDING["bytes"] = a.prompt_bytes
    medians: dict[str, Result] = {}
    if a.genq_workers:
        scaling(a.jobs, a.repeats, [int(x) for x in a.genq_workers.split(",")])
        return
    with RedisServer() as server:
        for name in a.systems.split(","):
            runs = [SYSTEMS[name](server, a.jobs, i) for i in range(a.repeats)]
            redis.Redis(port=server.port).flushdb()
            medians[name] = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
            medians[name]["runs_per_s"] = [round(a.jobs / r["total_s"]) for r in runs]  # type: ignore[assignment]
            print(name, medians[name], file=sys.stderr)
    if a.json:
        print(json.dumps(medians))
        return
    best_peer = max((a.jobs / m["total_s"] for k, m in medians.items() if k != "genq"), default=0)
    lines = [
        f"Command: `python benchmarks/queue_speed.py --jobs {a.jobs} --repeats {a.repeats}`  ",
        "Machine: " + ", ".join(f"{k} {v}" for k, v in machine_info().items()) + "  ",
        "Versions: " + versions() + "  ",
        "",
        "| system | jobs/s end to end (median) | runs | enqueue s | enqueue to last result s |",
        "|---|---|---|---|---|",
    ]
    for name, m in medians.items():
        lines.append(f"| {name} | {a.jobs / m['total_s']:,.0f} | {m['runs_per_s']} | "
                     f"{m['enqueue_s']:.2f} | {m['rest_s']:.2f} |")  # fmt: skip
    if "genq" in medians and best_peer:
        lines.append("")
        lines.append(f"genq / best peer: {a.jobs / medians['genq']['total_s'] / best_peer:.1f}x")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
