"""Two cases of ``genq bench --scenario batch`` that are about a batch's company, not its size:

- **Faults** (``run_faults_case``): a batch of ``lines`` lines (200,000; ``--quick``: 3,000) fed
  by ``genq batch submit`` on a fleet of echo workers, with one ``genq serve`` on the same file
  store. Mid-feed, in turn: the submitting command is killed (-9), the gateway takes the batch
  over when its lease lapses and is killed (-9) in turn, a worker is killed (-9) and a fresh
  one joins, and ``genq batch submit --batch-id`` runs again and feeds the rest; ``genq batch
  results`` writes the rest out. Checked: every ``custom_id`` in the output exactly once, no
  error line, and the record's counters equal the output file.
- **Beside online work** (``run_online_case``): the tenants scenario's flood vs trickle with
  the flood a batch. On its fleet (3 echo workers of 2 ms steps, batches of 16, 16 tokens a
  request), tenant ``online`` sends one request every 50 ms: alone on the idle fleet, then
  while tenant ``a``'s batch of ``lines`` lines (1,000,000; quick: 20,000) runs (from its
  window's filling, then the batch is cancelled), then beside ``a``'s flood of plain requests
  (the tenants scenario's own case, for comparison). Its waits are queued to started, as its
  results' timings say. Goal (the tenants scenario's): p99 <= 2 x the idle p99 + one batch's
  time (the 32 ms of simulated steps; and as it ran, the median of the requests' own start to
  finish: what the tenants scenario reports met against).
"""

from __future__ import annotations

import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import orjson
import redis
from genq.common.keys import Keys
from genq.common.models import Result
from genq.producer import Client
from genq.producer.gateway import batch_waves, wave_files
from genq.producer.gateway.file_store import FileStore
from genq.worker.bench.modes import percentile
from genq.worker.bench.tenants import trickle_requests

ONLINE_TENANT = "online"
FAULT_WINDOW = 2_000
"""The faults case's ``--batch-window`` (at most; a twentieth of a smaller batch): many waves,
so that each kill lands mid-feed."""


ONLINE_WORKERS, ONLINE_STEP_MS, ONLINE_TOKENS = 3, 2.0, 16
"""The online case's fleet, the tenants scenario's (``TenantCase``: batches of 16): echo workers
of 2 ms steps, requests of 16 tokens (one batch: 32 ms of simulated steps)."""
EVERY_S = 0.05
"""One request of the online tenant every 50 ms."""


def _trickle(client: Client, run_s: float) -> list[Result]:
    """Tenant ``online``'s requests (the tenants scenario's trickle), one every ``EVERY_S``,
    for about ``run_s``; their results."""
    ids = trickle_requests(client, int(run_s / EVERY_S), EVERY_S, ONLINE_TENANT)
    return client.results(ids, timeout=300)


def _waits(results: list[Result]) -> dict[str, float]:
    waits = [float(x.timings.queue_wait_ms or 0) for x in results]
    t = [x.timings for x in results]
    ran = [float((x.finished_unix_ms or 0) - (x.started_unix_ms or 0)) for x in t]
    return {
        "requests": len(waits),
        "wait_p50_ms": percentile(waits, 0.5),
        "wait_p99_ms": percentile(waits, 0.99),
        "wait_max_ms": max(waits, default=0.0),
        "ran_ms": statistics.median(ran) if ran else 0.0,
    }


def run_online_case(src: Path, n: int, files: Path, *, run_s: float) -> dict[str, Any]:
    """Tenant ``online``'s single requests beside another tenant's batch of the ``n`` lines of
    ``src`` (of ``ONLINE_TOKENS`` each; fed in waves, its rounds run here), and beside the same
    tenant's flood of plain requests, on the tenants scenario's fleet; and on the idle fleet
    first. Each for ``run_s``."""
    from genq.worker.bench.tenant_fleet import TenantCase
    from genq.worker.devtools.redis_server import RedisServer

    store = FileStore(str(files / "store"))
    with RedisServer() as server:
        case = TenantCase(server.url, "online", "fair", ONLINE_WORKERS, ONLINE_STEP_MS)
        with case:
            c = case.client
            idle = _waits(_trickle(c, run_s / 3))
            bid = wave_files.upload_and_create(c, store, str(src), source=src.name, tenant="a")
            feeder = Client.from_url(server.url, case.queue)
            rounds = threading.Thread(
                target=wave_files.run_until, args=(feeder, store, bid, _finished), daemon=True
            )
            rounds.start()
            full = min(batch_waves.DEFAULT_WINDOW, n // 2)  # its window filled: it runs
            _wait(lambda: int(batch_waves.record_of(c, bid).get("fed") or 0) >= full)
            done0, t0 = _completed(c, bid), time.perf_counter()
            beside_batch = _trickle(c, run_s)
            lines_per_s = (_completed(c, bid) - done0) / (time.perf_counter() - t0)
            fed = int(batch_waves.record_of(c, bid).get("fed") or 0)
            batch_waves.cancel(c, bid)
            rounds.join(timeout=300)
            feeder.close()
            flood = c.submit_many(
                ["flood"] * int(lines_per_s * run_s * 1.5), tenant="a", max_new_tokens=ONLINE_TOKENS
            )
            beside_flood = _trickle(c, run_s)
            last = max(x.timings.started_unix_ms or 0 for x in c.results(flood, timeout=600))
    beside_flood = [x for x in beside_flood if (x.timings.queued_unix_ms or 0) < last]
    batch, plain = _waits(beside_batch), _waits(beside_flood)
    idle_p99 = idle["wait_p99_ms"]
    return {
        "lines": n,
        "fed_when_measured": fed,
        "batch_lines_per_s": lines_per_s,
        "idle": idle,
        "beside_batch": batch,
        "beside_flood": plain,
        "batch_ms": ONLINE_STEP_MS * ONLINE_TOKENS,
        "goal_ms": 2 * idle_p99 + ONLINE_STEP_MS * ONLINE_TOKENS,
        "goal_ran_ms": 2 * idle_p99 + batch["ran_ms"],
        "met": batch["wait_p99_ms"] <= 2 * idle_p99 + batch["ran_ms"],
    }


def _finished(rec: dict[str, str]) -> bool:
    return bool(rec.get("finished_at_ms"))


def _completed(client: Client, batch_id: str) -> int:
    return int(batch_waves.record_of(client, batch_id).get("completed") or 0)


def _genq(*args: str) -> list[str]:
    return [sys.executable, "-m", "genq.worker", "batch", *args]


def run_faults_case(src: Path, n: int, files: Path) -> dict[str, Any]:
    """The ``n``-line batch file ``src`` through three kills (-9); what it found (the file
    store and the output in ``files``)."""
    from genq.worker.devtools.gateway_process import GatewayProcess
    from genq.worker.devtools.redis_server import RedisServer
    from genq.worker.devtools.worker_process import start_worker, wait_until_serving

    store = FileStore(str(files / "faults-store"))
    bid, queue = "batch_faults0", "batch-faults"
    with RedisServer() as server:
        r = redis.Redis.from_url(server.url)
        rec = Keys.batch(bid)
        where = ["--redis-url", server.url, "--queue", queue, "--files-dir", store.where]

        def fed() -> int:
            return int(r.hget(rec, "fed") or 0)

        def worker(name: str) -> Any:
            proc = start_worker(
                redis_url=server.url,
                queue=queue,
                engine="echo",
                consumer=name,
                echo_step_ms=0.0,
                max_batch_size=256,
                extra_args=("--claim-idle-ms", "2000"),
            )
            wait_until_serving(r, queue, name, proc, timeout_s=300)
            return proc

        fleet = [worker("w0"), worker("w1")]
        kills: list[str] = []
        t0 = time.perf_counter()
        try:
            window = max(50, min(FAULT_WINDOW, n // 20))
            feeding = ["--batch-window", str(window), "--batch-id", bid]
            proc = subprocess.Popen(
                _genq("submit", *where, str(src), *feeding),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            _wait(lambda: fed() >= n // 5)
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            kills.append(f"genq batch submit at {fed():,} fed")
            gateway = GatewayProcess(server.url, queue, None, ["--files-dir", store.where])
            try:
                at = fed()
                _wait(lambda: fed() >= min(n - 1, at + n // 5))  # it feeds the batch now
            finally:
                gateway.proc.send_signal(signal.SIGKILL)
                gateway.stop()
            kills.append(f"the gateway at {fed():,} fed")
            fleet[0].send_signal(signal.SIGKILL)
            fleet[0].wait()
            kills.append(f"a worker at {fed():,} fed")
            fleet[0] = worker("w2")
            ok = _resume(where, src, bid, files / "faults-out.jsonl")
            seconds = time.perf_counter() - t0
            counters = {k: int(r.hget(rec, k) or 0) for k in ("completed", "failed", "fed")}
        finally:
            for p in fleet:
                p.terminate()
            for p in fleet:
                p.wait(timeout=60)
        ids, errors = _written(store, bid)
    return {
        "lines": n,
        "seconds": seconds,
        "kills": kills,
        "commands_ok": ok,
        "output_lines": len(ids),
        "every_custom_id_once": len(ids) == n and len(set(ids)) == n,
        "error_lines": errors,
        "counters": counters,
        "counters_equal_output": counters["completed"] == len(ids) and counters["failed"] == 0,
    }


def _resume(where: list[str], src: Path, batch_id: str, out: Path) -> bool:
    """``genq batch submit --batch-id`` again (it feeds the rest), then ``genq batch results``
    (it writes the rest out); whether both ended well."""
    again = subprocess.run(
        _genq("submit", *where, str(src), "--batch-id", batch_id), check=False, capture_output=True
    )
    res = subprocess.run(
        _genq("results", *where, batch_id, "-o", str(out)), check=False, capture_output=True
    )
    return again.returncode == 0 and res.returncode == 0


def _written(store: FileStore, batch_id: str) -> tuple[list[str], int]:
    """The custom_ids of a batch's output file, in order, and its error file's lines."""
    output = wave_files.read_parts(store, wave_files.parts(store, batch_id, "output"))
    ids = [str(orjson.loads(x)["custom_id"]) for x in b"".join(output).splitlines()]
    errors = b"".join(wave_files.read_parts(store, wave_files.parts(store, batch_id, "errors")))
    return ids, len(errors.splitlines())


def _wait(predicate: Any, timeout_s: float = 600.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"batch faults: not reached within {timeout_s} s")
        time.sleep(0.02)
