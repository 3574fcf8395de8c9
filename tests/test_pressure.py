"""Redis under pressure: a full Redis, an evicting Redis, partial multi-submits, huge or
ambiguous junk entries. Each against its own real redis-server, with real worker processes."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from genq.common.errors import SubmitFailed
from genq.common.keys import Keys
from genq.producer import Client
from genq.worker.devtools.redis_server import RedisServer
from genq.worker.runtime.dead_letter import CUT_NOTE, MAX_JUNK_FIELDS_CHARS

from tests.conftest import WorkerProcess, wait_until, workers_on


@pytest.fixture()
def server() -> Iterator[RedisServer]:
    with RedisServer() as s:
        yield s


@pytest.fixture()
def worker(server: RedisServer, tmp_path: Path) -> Iterator[Callable[..., WorkerProcess]]:
    """Start workers on this test's Redis; all are stopped at the end, pass or fail."""
    with workers_on(server.url, tmp_path, prefix="p") as start:
        yield start


def test_a_full_redis_with_work_in_hand_is_ridden_out(
    server: RedisServer, worker: Callable[..., WorkerProcess]
) -> None:
    r = redis.Redis.from_url(server.url)
    client = Client.from_url(server.url, "full")
    busy = worker("full", "--engine", "echo", "--echo-step-ms", "100")
    idle = worker("idle", "--engine", "echo")  # nothing to do
    wait_until(lambda: r.exists(Keys("full").worker("p0")) and r.exists(Keys("idle").worker("p1")))
    ids = client.submit_many([f"prompt {i}" for i in range(12)], max_new_tokens=20)  # 2 s a batch
    wait_until(lambda: any(client.status(i).status == "running" for i in ids), timeout_s=20)
    r.config_set("maxmemory", 1)  # full: every write that needs memory is refused
    with pytest.raises(redis.exceptions.OutOfMemoryError):
        r.set("probe", "x")
    stats = subprocess.run(
        [
            sys.executable,
            "-m",
            "genq.worker",
            "stats",
            "--redis-url",
            server.url,
            "--queue",
            "full",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert json.loads(stats.stdout)["redis"]["full"] is True, stats.stderr
    time.sleep(6)  # a batch finishes meanwhile; its results cannot be written
    assert busy.proc.poll() is None and idle.proc.poll() is None, busy.log() + idle.log()
    assert not any(client.status(i).is_final for i in ids)
    r.config_set("maxmemory", 0)
    results = client.results(ids, timeout=60)
    assert [x.status for x in results] == ["succeeded"] * 12
    assert all(r.xlen(Keys.events(i)) == 1 for i in ids)  # one final event each
    assert busy.proc.poll() is None and idle.proc.poll() is None
    log = busy.log()
    assert log.count("Redis is full") == 1, log  # said once, not once per retry
    assert "Redis accepts writes again" in log
    assert busy.stop() == 0 and idle.stop() == 0


def test_a_partial_multi_submit_says_what_went_in(server: RedisServer) -> None:
    r = redis.Redis.from_url(server.url)
    r.config_set("maxmemory", 20 * 1024 * 1024)  # the first chunk of 500 fits, not the second
    client = Client.from_url(server.url, "partial")
    prompts = [f"{i} " + "x" * 25_000 for i in range(1000)]
    with pytest.raises(SubmitFailed, match="500 of 1000 were enqueued") as err:
        client.submit_many(prompts, max_new_tokens=4)
    went_in, missed = err.value.submitted, err.value.not_submitted
    assert len(went_in) == 500 and len(missed) == 500
    assert "out of memory" in str(err.value)
    assert all(client.status(i).status == "queued" for i in went_in[:5])
    assert r.get(Keys.result(missed[0])) is None
    assert sum(r.xlen(s) for s in Keys("partial").streams()) == 500
    # After room is made, the same requests again (same ids) enqueue only the missing ones.
    r.config_set("maxmemory", 0)
    again = [{"prompt": p, "request_id": i} for p, i in zip(prompts, went_in + missed, strict=True)]
    client.submit_many(again, max_new_tokens=4)
    assert sum(r.xlen(s) for s in Keys("partial").streams()) == 1000


def _start(server: RedisServer, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``genq worker`` that exits at once if it refuses (else stopped after it serves)."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "genq.worker",
            "worker",
            "--redis-url",
            server.url,
            "--queue",
            "ev",
            "--engine",
            "echo",
            "--consumer",
            "e",
            *args,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    r = redis.Redis.from_url(server.url)
    deadline = time.monotonic() + 30
    while proc.poll() is None and not r.exists(Keys("ev").worker("e")):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    if proc.poll() is None:
        proc.terminate()
    out, _ = proc.communicate(timeout=30)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, "")


@pytest.mark.parametrize("policy", ["allkeys-lru", "allkeys-random"])
def test_a_worker_refuses_a_redis_that_evicts_any_key(
    server: RedisServer, tmp_path: Path, policy: str
) -> None:
    redis.Redis.from_url(server.url).config_set("maxmemory-policy", policy)
    refused = _start(server, tmp_path)
    assert refused.returncode != 0
    assert f"maxmemory-policy is {policy}" in refused.stdout
    assert "noeviction" in refused.stdout and "--allow-evicting-redis" in refused.stdout
    allowed = _start(server, tmp_path, "--allow-evicting-redis", "true")
    assert allowed.returncode == 0, allowed.stdout
    assert "accepted requests included" in allowed.stdout


def test_a_worker_warns_on_a_redis_that_evicts_results(server: RedisServer, tmp_path: Path) -> None:
    redis.Redis.from_url(server.url).config_set("maxmemory-policy", "volatile-lru")
    started = _start(server, tmp_path)
    assert started.returncode == 0
    assert "maxmemory-policy is volatile-lru" in started.stdout
    assert "results (they have TTLs)" in started.stdout


def test_junk_entries_are_dead_lettered_bounded_in_bytes(
    server: RedisServer, worker: Callable[..., WorkerProcess]
) -> None:
    r = redis.Redis.from_url(server.url)
    keys = Keys("junk")
    r.xadd(keys.stream("normal"), {f"field{i}": "z" * 100_000 for i in range(20)})  # 2 MB, no id
    worker("junk", "--engine", "echo")
    wait_until(lambda: r.xlen(keys.dead_letter) == 1, timeout_s=30)
    [(_, record)] = r.xrange(keys.dead_letter)
    kept = json.loads(record[b"fields"])
    assert sum(len(k) + len(v) for k, v in kept.items() if k != CUT_NOTE) <= MAX_JUNK_FIELDS_CHARS
    assert "of 2000" in kept[CUT_NOTE]  # says how much there was
    assert len(r.xrange(keys.dead_letter)[0][1][b"fields"]) < 20_000


def test_an_entry_with_two_id_fields_never_runs(
    server: RedisServer, worker: Callable[..., WorkerProcess]
) -> None:
    r = redis.Redis.from_url(server.url)
    keys = Keys("twice")
    stream = keys.stream("normal")
    body = '{"prompt": "hello"}'
    r.execute_command("XADD", stream, "*", "id", "same", "body", body, "id", "same")
    r.execute_command("XADD", stream, "*", "id", "one", "body", body, "id", "other")
    worker("twice", "--engine", "echo")
    client = Client.from_url(server.url, "twice")
    failed = client.result("same", timeout=30)
    assert failed.status == "failed" and failed.error is not None
    assert "['id'] more than once" in failed.error.message
    wait_until(lambda: r.xlen(keys.dead_letter) == 1)  # two different ids: none to fail
    assert r.get(Keys.result("one")) is None and r.get(Keys.result("other")) is None
