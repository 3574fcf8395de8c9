"""Recovery with real processes and a real redis-server: workers killed with SIGKILL, restarted,
poisoned; entries taken over within the claim time and never taken from a live worker."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable

import redis
from genq.common.keys import Keys
from genq.producer import Client

from tests.conftest import WorkerProcess, pending, wait_until

FAST_CLAIM = ("--claim-idle-ms", "1000")
HOLD_ALL = ("--hand-back-after-ms", "600000")
"""A worker that keeps what it read while it runs a batch (no hand-back): the drain tests need
one worker holding several batches' worth."""


def test_a_dead_workers_entries_are_taken_over_within_the_claim_time(
    redis_url: str, queue: str, r: redis.Redis, start_worker: Callable[..., WorkerProcess]
) -> None:
    client = Client.from_url(redis_url, queue)
    doomed = start_worker(queue, "--engine", "echo", "--echo-step-ms", "1000", *FAST_CLAIM)
    ids = client.submit_many([f"r{i}" for i in range(5)], max_new_tokens=8)  # 8 s per batch
    wait_until(lambda: pending(r, queue, "w0") == 5)
    doomed.kill()
    killed_at = time.monotonic()
    start_worker(queue, "--engine", "echo", *FAST_CLAIM)
    results = client.results(ids, timeout=30)
    took_s = time.monotonic() - killed_at
    assert [x.status for x in results] == ["succeeded"] * 5
    assert {x.worker for x in results} == {"w1"}
    # 1.25 x claim_idle_ms, plus the new worker's start-up (imports) and a margin for 2 cores.
    assert took_s < 1.25 + 8, took_s
    wait_until(lambda: pending(r, queue) == 0)


def test_a_live_workers_long_batch_is_never_taken_from_it(
    redis_url: str, queue: str, r: redis.Redis, start_worker: Callable[..., WorkerProcess]
) -> None:
    client = Client.from_url(redis_url, queue)
    slow = start_worker(queue, "--engine", "echo", "--echo-step-ms", "100", *FAST_CLAIM)
    wait_until(lambda: r.exists(Keys(queue).worker("w0")))
    (request_id,) = client.submit_many(["long one"], max_new_tokens=40)  # a 4 s batch
    wait_until(lambda: pending(r, queue, "w0") == 1)
    start_worker(queue, "--engine", "echo", *FAST_CLAIM)  # idle, and reclaiming every 250 ms
    result = client.result(request_id, timeout=30)
    assert result.status == "succeeded" and result.worker == "w0"
    stats = r.hgetall(Keys(queue).worker("w1"))
    assert int(stats[b"reclaimed"]) == 0
    assert slow.proc.poll() is None


def test_a_restarted_worker_resumes_its_own_pending_entries_at_once(
    redis_url: str, queue: str, r: redis.Redis, start_worker: Callable[..., WorkerProcess]
) -> None:
    client = Client.from_url(redis_url, queue)
    first = start_worker(queue, "--engine", "echo", "--echo-step-ms", "1000", "--consumer", "gpu0")
    ids = client.submit_many(["a", "b", "c"], max_new_tokens=10)
    wait_until(lambda: pending(r, queue, "gpu0") == 3)
    first.kill()
    restarted_at = time.monotonic()
    start_worker(queue, "--engine", "echo", "--consumer", "gpu0")  # default claim time: 20 s
    results = client.results(ids, timeout=30)
    assert [x.status for x in results] == ["succeeded"] * 3
    assert time.monotonic() - restarted_at < 15  # well before anyone could claim them


def test_a_request_that_kills_workers_fails_as_poison_and_spares_its_batch_mates(
    redis_url: str, queue: str, r: redis.Redis, start_worker: Callable[..., WorkerProcess]
) -> None:
    keys = Keys(queue)
    client = Client.from_url(redis_url, queue)
    ids = client.submit_many(["fine 1", "CRASH me", "fine 2", "fine 3"], max_new_tokens=4)
    workers = [start_worker(queue, *FAST_CLAIM, fault="crash")]

    def final_or_replace() -> bool:
        if workers[-1].proc.poll() is not None:  # it died: start a replacement
            workers.append(start_worker(queue, *FAST_CLAIM, fault="crash"))
        return all(
            s is not None and b'"status":"queued"' not in s and b'"status":"running"' not in s
            for s in r.mget([keys.result(i) for i in ids])
        )

    wait_until(final_or_replace, timeout_s=90, every_s=0.2)
    results = {x.id: x for x in client.results(ids, timeout=10)}
    poison = results[ids[1]]
    assert poison.status == "failed" and poison.error is not None
    assert poison.error.code == "poison_request"
    assert "3 workers started this request" in poison.error.message
    assert "genq dlq" in poison.error.message
    assert [results[i].status for i in (ids[0], ids[2], ids[3])] == ["succeeded"] * 3
    dead = r.xrange(keys.dead_letter)
    assert [f[b"request_id"] for _, f in dead] == [ids[1].encode()]
    assert len(workers) == 4  # it killed three workers (3 attempts); the fourth failed it
    wait_until(lambda: pending(r, queue) == 0)

    # genq dlq: list shows it; retry puts it back (a plain echo worker serves it); purge.
    genq = [sys.executable, "-m", "genq.worker", "dlq"]
    where = ["--redis-url", redis_url, "--queue", queue]
    listed = subprocess.run([*genq, "list", *where, "--json"], capture_output=True, check=True)
    (entry,) = json.loads(listed.stdout)
    assert entry["request_id"] == ids[1] and "3 workers started" in entry["error"]
    subprocess.run([*genq, "retry", *where, entry["dlq_id"]], check=True, capture_output=True)
    assert r.xlen(keys.dead_letter) == 0
    start_worker(queue, "--engine", "echo")
    again = client.result(ids[1], timeout=30)
    assert again.status == "succeeded" and again.text == "CRAS"  # echo, max_new_tokens 4
    r.xadd(keys.dead_letter, {"stream": "x", "error": "y"})
    purged = subprocess.run([*genq, "purge", *where, "--yes"], capture_output=True, check=True)
    assert b"purged 1" in purged.stdout and r.xlen(keys.dead_letter) == 0


def test_sigterm_drains_held_work_then_exits_zero(
    redis_url: str, queue: str, r: redis.Redis, start_worker: Callable[..., WorkerProcess]
) -> None:
    client = Client.from_url(redis_url, queue)
    worker = start_worker(
        queue, "--engine", "echo", "--echo-step-ms", "100", "--max-batch-size", "2", *HOLD_ALL
    )
    ids = client.submit_many([f"d{i}" for i in range(6)], max_new_tokens=5)  # 3 batches of 0.5 s
    wait_until(lambda: pending(r, queue, "w0") == 6)
    worker.proc.send_signal(signal.SIGTERM)
    assert worker.proc.wait(timeout=30) == 0
    assert [x.status for x in client.results(ids, timeout=5)] == ["succeeded"] * 6
    assert "stopped: succeeded=6" in worker.log()


def test_after_the_grace_period_what_is_left_goes_to_other_workers(
    redis_url: str, queue: str, r: redis.Redis, start_worker: Callable[..., WorkerProcess]
) -> None:
    client = Client.from_url(redis_url, queue)
    worker = start_worker(
        queue,
        "--engine",
        "echo",
        "--echo-step-ms",
        "200",
        "--max-batch-size",
        "1",
        "--shutdown-grace-s",
        "0.5",
        *FAST_CLAIM,
        *HOLD_ALL,
    )
    ids = client.submit_many([f"g{i}" for i in range(4)], max_new_tokens=5)  # 1 s each, alone
    wait_until(lambda: pending(r, queue, "w0") == 4)
    worker.proc.send_signal(signal.SIGTERM)
    assert worker.proc.wait(timeout=30) == 0
    log = worker.log()
    assert "stay pending for other workers" in log and "left_pending=" in log
    assert pending(r, queue, "w0") >= 2
    start_worker(queue, "--engine", "echo", *FAST_CLAIM)
    assert [x.status for x in client.results(ids, timeout=30)] == ["succeeded"] * 4


def test_a_second_signal_exits_at_once(
    redis_url: str, queue: str, r: redis.Redis, start_worker: Callable[..., WorkerProcess]
) -> None:
    client = Client.from_url(redis_url, queue)
    worker = start_worker(queue, "--engine", "echo", "--echo-step-ms", "1000")
    client.submit("slow", max_new_tokens=20)  # a 20 s batch
    wait_until(lambda: pending(r, queue, "w0") == 1)
    worker.proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    t0 = time.monotonic()
    worker.proc.send_signal(signal.SIGTERM)
    assert worker.proc.wait(timeout=10) == 1
    assert time.monotonic() - t0 < 5
    assert pending(r, queue, "w0") == 1  # left for another worker to take over


def test_a_worker_killed_with_sigkill_leaves_no_engine_process_behind() -> None:
    """The reaper (``worker/engines/reaper.py``), as the vLLM engine starts it: a process that
    started it and then a child of its own (as vLLM starts its engine core) is SIGKILLed; the
    child is gone within seconds, and so is the reaper."""
    import psutil

    script = (
        "import subprocess, sys, time\n"
        "from genq.worker.engines.reaper import start_reaper\n"
        "reaper = start_reaper()\n"
        "core = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'])\n"
        "print(reaper.pid, core.pid, flush=True)\n"
        "time.sleep(300)\n"
    )
    worker = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert worker.stdout is not None
    reaper_pid, core_pid = map(int, worker.stdout.readline().split())
    core, reaper = psutil.Process(core_pid), psutil.Process(reaper_pid)
    time.sleep(1.5)  # the reaper has noted the core (it looks every 0.5 s)
    worker.kill()
    worker.wait()
    _, alive = psutil.wait_procs([core, reaper], timeout=10)
    assert alive == [], [p.pid for p in alive]


def test_the_reaper_looks_less_often_once_the_engines_processes_stay_the_same() -> None:
    """Each look reads every process's stat in /proc: every 0.5 s while the worker's
    descendants change and for 30 s after, then at most every 4 s (an idle vLLM worker's
    reaper took ~1% of a core looking every 0.5 s)."""
    from genq.worker.engines.reaper import POLL_S, SETTLE_S, STEADY_POLL_S, next_pause_s

    assert next_pause_s(POLL_S, 0.0) == next_pause_s(STEADY_POLL_S, SETTLE_S - 1) == POLL_S
    pauses, pause = [], POLL_S
    for _ in range(6):
        pause = next_pause_s(pause, SETTLE_S + 1)
        pauses.append(pause)
    assert pauses == [1.0, 2.0, 4.0, 4.0, 4.0, 4.0] and STEADY_POLL_S == 4.0
