"""Two cases of ``genq bench --scenario batch`` that are about a batch's company, not its size:

- **Faults** (``run_faults_case``): a batch of ``lines`` lines (200,000; ``--quick``: 3,000) fed
  by ``genq batch submit`` on a fleet of echo workers, with one ``genq serve`` on the same file
  store. Mid-feed, in turn: the submitting command is killed (-9), the gateway takes the batch
  over when its lease lapses and is killed (-9) in turn, a worker is killed (-9) and a fresh
  one joins, and ``genq batch submit --batch-id`` runs again and feeds the rest; ``genq batch
  results`` writes the rest out. Checked: every ``custom_id`` in the output exactly once, no
  error line, and the record's counters equal the output file.
- **Beside online work** (``Trickle``): while a batch of one tenant runs, another tenant
  sends one request every ``every_s``; its waits (queued to started, as its results' timings
  say) against the same requests on the idle fleet before the batch. Goal (the tenants
  scenario's, with the flood a batch): p99 <= 2 x the idle p99 + one batch's run time.
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
from genq.producer import Client
from genq.producer.gateway import wave_files
from genq.producer.gateway.file_store import FileStore
from genq.worker.bench.modes import percentile

ONLINE_TENANT = "online"
FAULT_WINDOW = 2_000
"""The faults case's ``--batch-window`` (at most; a twentieth of a smaller batch): many waves,
so that each kill lands mid-feed."""


class Trickle:
    """One request of tenant ``online`` every ``every_s`` until stopped; each one's wait."""

    def __init__(self, redis_url: str, queue: str, every_s: float = 0.05) -> None:
        self.client = Client.from_url(redis_url, queue)
        self.every_s = every_s
        self.waits_ms: list[float] = []
        self.batch_ms: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def idle(self, n: int = 40) -> list[float]:
        """The waits of ``n`` requests, one after another, on the fleet as it is now."""
        out = []
        for _ in range(n):
            out.append(self._one()[0])
            time.sleep(self.every_s)
        return out

    def _one(self) -> tuple[float, float]:
        rid = self.client.submit("online work", max_new_tokens=2, tenant=ONLINE_TENANT)
        res = self.client.result(rid, timeout=120)
        # Read, then dropped, so that the case's Redis peak is the batch's (each result would
        # stay for the result TTL: ~5 KB with its event stream, 4 MB over a 1M-line run).
        keys = self.client.keys
        self.client.redis.delete(keys.result(rid), keys.events(rid))
        t = res.timings
        wait = float((t.started_unix_ms or 0) - (t.queued_unix_ms or 0))
        return wait, float(t.generation_ms or 0)

    def _run(self) -> None:
        while not self._stop.is_set():
            wait, ran = self._one()
            self.waits_ms.append(wait)
            self.batch_ms.append(ran)
            self._stop.wait(self.every_s)

    def __enter__(self) -> Trickle:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=150)
        self.client.close()


def trickle_report(idle: list[float], trickle: Trickle, turn_ms: float) -> dict[str, Any]:
    """The online tenant's waits beside the batch against idle, and the goal's bound, with
    ``turn_ms`` as one batch's time: a worker's turn over a full batch of the batch's lines
    (read, start, write: with echo workers the engine's own part is ~2 ms of it)."""
    during = trickle.waits_ms
    batch_ms = statistics.median(trickle.batch_ms) if trickle.batch_ms else 0.0
    bound = 2 * percentile(idle, 0.99) + turn_ms
    p99 = percentile(during, 0.99) if during else 0.0
    return {
        "requests": len(during),
        "wait_p50_ms": percentile(during, 0.5) if during else 0.0,
        "wait_p99_ms": p99,
        "idle_wait_p50_ms": percentile(idle, 0.5),
        "idle_wait_p99_ms": percentile(idle, 0.99),
        "engine_ms": batch_ms,
        "turn_ms": turn_ms,
        "goal_ms": bound,
        "met": bool(during) and p99 <= bound,
    }


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
