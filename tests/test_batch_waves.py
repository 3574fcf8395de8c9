"""Batch files of any size, run in waves. Fed into the queue as it drains (never more than
the window in Redis), results appended to the file store as they end (each line once, across
crashes), the window's room waited for instead of a full queue's refusal, the completion
window honoured, a file deleted under a running batch a failure that says so. (Kills of the
submitting command, a gateway and a worker mid-feed: the batch scenario of `genq bench`, run by
test_bench.py.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import redis
from genq.common.keys import Keys
from genq.producer import Client
from genq.producer.gateway import batch_waves, wave_files
from genq.producer.gateway.batches import batch_status
from genq.producer.gateway.file_store import FileStore
from openai.types import Batch

from tests.conftest import WorkerProcess, wait_until

CHAT = {"model": "echo", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def write_file(path: Path, n: int, bad_every: int = 0, repeat: tuple[int, ...] = ()) -> Path:
    """``n`` lines, every ``bad_every``-th not JSON; then lines that repeat the custom_ids of
    lines ``repeat`` (0-based)."""
    with path.open("w") as f:
        for i in [*range(n), *repeat]:
            if bad_every and i % bad_every == bad_every - 1:
                f.write("{not json\n")
                continue
            line = {"custom_id": f"c{i}", "url": "/v1/chat/completions", "body": CHAT}
            f.write(json.dumps(line) + "\n")
    return path


def genq(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "genq.worker", "batch", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def store() -> FileStore:
    return FileStore(os.environ["GENQ_FILES_DIR"])


def new_batch(client: Client, src: Path, *, window: int) -> str:
    """A wave batch of ``src`` (copied to the store), recorded; no round run yet."""
    return wave_files.upload_and_create(client, store(), str(src), source=src.name, window=window)


def unchecked_batch(client: Client, src: Path, *, window: int) -> str:
    """A wave batch of ``src`` recorded as the gateway records an uploaded file's (``genq batch
    submit`` refuses a file of no request before; a gateway's batch of one fails when fed)."""
    bid = batch_waves.new_batch_id()
    name = f"uploads/{bid}.jsonl"
    data = src.read_bytes()
    store().put(name, data, create=True)
    lines = sum(1 for x in data.splitlines() if x.strip())
    wave = batch_waves.WaveBatch(
        id=bid, path=name, lines=lines, source=src.name, endpoint="", window=window
    )
    batch_waves.create(client, store(), wave)
    return bid


def output_lines(batch_id: str, kind: str = "output") -> list[dict[str, object]]:
    s = store()
    data = b"".join(wave_files.read_parts(s, wave_files.parts(s, batch_id, kind)))
    return [json.loads(x) for x in data.splitlines()]


def test_a_batch_is_fed_in_waves_and_written_out_as_it_goes(
    redis_url: str,
    queue: str,
    r: redis.Redis,
    tmp_path: Path,
    start_worker: Callable[..., WorkerProcess],
) -> None:
    """1,500 lines through a window of 100: Redis never holds more than the window of them,
    every custom_id is in the output exactly once, the refused lines in the error file (two of
    them repeat an earlier line's custom_id), and the record's counters equal the files."""
    src = write_file(tmp_path / "in.jsonl", 1500, bad_every=100, repeat=(5, 1200))
    start_worker(queue, "--engine", "echo", "--echo-step-ms", "1")
    keys, most = Keys(queue), [0]
    seen_open = threading.Event()
    stop = threading.Event()

    def watch() -> None:  # the window's bound, sampled while it runs
        while not stop.is_set():
            for bid in r.smembers(keys.batches_running):
                n = r.hlen(Keys.batch_open(bid.decode()))
                most[0] = max(most[0], n)
                seen_open.set()
            time.sleep(0.005)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    where = ["--redis-url", redis_url, "--queue", queue]
    sub = genq("submit", *where, str(src), "--batch-window", "100")
    assert sub.returncode == 0, sub.stderr
    bid = sub.stdout.strip()
    assert "1485 submitted, 17 refused" in sub.stderr
    res = genq("results", *where, bid, "-o", str(tmp_path / "out.jsonl"), "--timeout-s", "120")
    stop.set()
    watcher.join()
    assert res.returncode == 0, res.stderr
    assert seen_open.is_set() and 0 < most[0] <= 100, most
    ok = output_lines(bid)
    assert sorted(str(x["custom_id"]) for x in ok) == sorted(
        f"c{i}" for i in range(1500) if i % 100 != 99
    )
    errors = output_lines(bid, "errors")
    assert len(errors) == 17 and [e["custom_id"] for e in errors[-2:]] == ["c5", "c1200"]
    assert all(e["custom_id"] is None for e in errors[:-2])
    assert "line 1502: custom_id 'c1200' appears twice (line 1201 first)" in str(errors[-1])
    # The command wrote both, output then errors, in one file.
    written = (tmp_path / "out.jsonl").read_text().splitlines()
    assert len(written) == 1502
    with Client.from_url(redis_url, queue) as client:
        status = batch_status(client, bid)
    Batch.model_validate(status)
    assert status["status"] == "completed"
    assert status["request_counts"] == {"total": 1502, "completed": 1485, "failed": 17}
    assert status["output_file_id"] and status["error_file_id"]
    # Nothing of it is left in Redis but its record: no states, no open requests.
    assert r.hlen(Keys.batch_open(bid)) == 0 and not r.exists(Keys.result(f"{bid}-1"))
    assert not r.sismember(keys.batches_running, bid)


def test_a_wave_line_ends_with_its_state_and_no_event_stream(
    redis_url: str,
    queue: str,
    r: redis.Redis,
    tmp_path: Path,
    start_worker: Callable[..., WorkerProcess],
) -> None:
    """A wave batch's lines write their final state (run or cancelled) but no final event
    stream, which no one reads (their results go to the output file) and which cost Redis most
    of what a request in flight took; a plain request beside them still gets its stream."""
    src = write_file(tmp_path / "in.jsonl", 6)
    with Client.from_url(redis_url, queue) as client:
        bid = new_batch(client, src, window=3)
        fed = batch_waves.run_round(client, store(), bid, "test")
        assert fed is not None and fed.fed == 3
        assert client.cancel(f"{bid}-1")  # cancelled: final, no stream either
        start_worker(queue, "--engine", "echo")
        plain = client.submit("beside the batch", max_new_tokens=2)
        assert client.result(plain, timeout=30).status == "succeeded"
        wait_until(lambda: r.llen(Keys.batch_done(bid)) == 3)
        states = [client.status(f"{bid}-{n}") for n in (1, 2, 3)]
        assert [s.status for s in states] == ["cancelled", "succeeded", "succeeded"]
        assert not any(r.exists(Keys.events(f"{bid}-{n}")) for n in (1, 2, 3))
        assert r.exists(Keys.events(plain))


def test_a_batch_waits_for_room_in_a_full_queue_instead_of_failing(
    redis_url: str, queue: str, tmp_path: Path, start_worker: Callable[..., WorkerProcess]
) -> None:
    """The queue takes 20 at once (--max-queue-depth) and the window is 200: the batch waits
    for room; every line runs."""
    src = write_file(tmp_path / "in.jsonl", 300)
    start_worker(queue, "--engine", "echo", "--max-queue-depth", "20", "--max-batch-size", "8")
    where = ["--redis-url", redis_url, "--queue", queue]
    sub = genq("submit", *where, str(src), "--batch-window", "200")
    assert sub.returncode == 0, sub.stderr
    bid = sub.stdout.strip()
    res = genq("results", *where, bid, "-o", str(tmp_path / "out.jsonl"), "--timeout-s", "120")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout) == {"id": bid, "completed": 300, "failed": 0}


def test_a_part_written_before_a_crash_is_not_written_twice(
    redis_url: str, queue: str, r: redis.Redis, tmp_path: Path
) -> None:
    """A collector that wrote its part and died before dropping its lines from Redis: the next
    round writes the same part (the store refuses it: written once) and commits; a feeder whose
    offset moved under it (another fed first) feeds nothing."""
    src = write_file(tmp_path / "in.jsonl", 5, bad_every=1)  # five refused lines
    s = store()
    with Client.from_url(redis_url, queue) as client:
        bid = unchecked_batch(client, src, window=100)
        stale = batch_waves.record_of(client, bid)
        assert batch_waves.feed(client, s, bid, stale).fed == 0
        assert r.llen(Keys.batch_rejected(bid)) == 5
        # The same round again, from the record as it was: its offset moved on, nothing fed.
        batch_waves.feed(client, s, bid, stale)
        assert r.llen(Keys.batch_rejected(bid)) == 5
        # A collector's first steps (plan, part), then its crash.
        plan = json.dumps({"seq": 0, "ids": [], "taken": 5, "done": 0})
        r.hset(Keys.batch(bid), "plan", plan)
        lines = [x.decode() for x in r.lrange(Keys.batch_rejected(bid), 0, 4)]
        s.put(batch_waves.part_name(bid, "errors", 0), "".join(x + "\n" for x in lines).encode())
        assert batch_waves.collect(client, s, bid, batch_waves.record_of(client, bid)) == 5
        assert batch_waves.collect(client, s, bid, batch_waves.record_of(client, bid)) == 0
        assert len(output_lines(bid, "errors")) == 5
        status = batch_status(client, bid)
    assert status["status"] == "failed" and status["request_counts"]["failed"] == 5


def test_a_batch_past_its_completion_window_expires_with_what_finished(
    redis_url: str, queue: str, r: redis.Redis, tmp_path: Path
) -> None:
    """No worker serves the queue; the window is 2 s: the batch expires, its requests are
    cancelled, every line is in the error file as ``batch_expired``, and its event is
    ``batch.expired``."""
    src = write_file(tmp_path / "in.jsonl", 30)
    where = ["--redis-url", redis_url, "--queue", queue]
    sub = genq("submit", *where, str(src), "--batch-window", "10", "--completion-window", "2s")
    assert sub.returncode == 0, sub.stderr
    bid = sub.stdout.strip()
    res = genq("results", *where, bid, "--errors", str(tmp_path / "e.jsonl"), "--timeout-s", "60")
    assert res.returncode == 0, res.stderr
    errors = [json.loads(x) for x in (tmp_path / "e.jsonl").read_text().splitlines()]
    assert len(errors) == 30 and {e["error"]["code"] for e in errors} == {"batch_expired"}
    assert sorted(e["custom_id"] for e in errors) == sorted(f"c{i}" for i in range(30))
    status = json.loads(genq("status", *where, bid).stdout)
    Batch.model_validate(status)
    assert status["status"] == "expired" and status["expired_at"]
    assert status["completion_window"] == "2s"
    assert status["request_counts"] == {"total": 30, "completed": 0, "failed": 30}
    events = r.xrange(Keys(queue).webhook_events)
    assert [e[b"type"] for _, e in events if e[b"id"] == bid.encode()] == [b"batch.expired"]


def test_a_batch_whose_file_is_deleted_while_it_runs_fails_saying_why(
    redis_url: str, queue: str, r: redis.Redis, tmp_path: Path
) -> None:
    src = write_file(tmp_path / "in.jsonl", 40)
    where = ["--redis-url", redis_url, "--queue", queue]
    with Client.from_url(redis_url, queue) as client:
        bid = new_batch(client, src, window=10)
        assert batch_waves.run_round(client, store(), bid, "test")
        store().delete(f"uploads/{bid}.jsonl")
        r.delete(Keys.batch_lease(bid))
    res = genq("results", *where, bid, "-o", str(tmp_path / "out.jsonl"), "--timeout-s", "30")
    assert res.returncode == 0, res.stderr
    status = json.loads(genq("status", *where, bid).stdout)
    Batch.model_validate(status)
    assert status["status"] == "failed"
    assert "gone from the file store" in status["errors"]["data"][0]["message"]


@pytest.mark.parametrize("window", ["24", "0h", "soon", "1y"])
def test_a_completion_window_is_a_duration(window: str) -> None:
    from genq.common.errors import InvalidRequest

    with pytest.raises(InvalidRequest, match="completion_window"):
        batch_waves.window_seconds(window)
    assert batch_waves.window_seconds("24h") == 86400
    assert batch_waves.window_seconds("90s") == 90


def _batch_peak(lines: int, tmp: Path) -> tuple[float, int]:
    """Redis' memory peak over its idle use while ``genq batch submit`` feeds a batch of
    ``lines`` chat lines (each prompt its own) to two echo workers, window 2,000; and the
    fields the prefix holders hash has then."""
    from genq.worker.devtools.redis_server import RedisServer
    from genq.worker.devtools.worker_process import start_worker

    src = tmp / f"in-{lines}.jsonl"
    with src.open("w") as f:
        for i in range(lines):
            body = {"messages": [{"role": "user", "content": f"hello {i}"}], "max_tokens": 4}
            line = {"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions"}
            f.write(json.dumps({**line, "body": body}))
            f.write("\n")
    with RedisServer() as server:
        r = redis.Redis.from_url(server.url)
        workers = [
            start_worker(redis_url=server.url, queue="mem", engine="echo", consumer=f"w{k}")
            for k in range(2)
        ]
        try:
            wait_until(lambda: len(r.keys("genq:{mem}:worker:*")) == 2, timeout_s=60)
            base = int(r.info("memory")["used_memory"])
            sub = subprocess.run(
                [
                    *(sys.executable, "-m", "genq.worker", "batch", "submit"),
                    *("--redis-url", server.url, "--queue", "mem", "--batch-window", "2000"),
                    *("--files-dir", str(tmp / f"files-{lines}"), str(src)),
                ],
                capture_output=True,
                text=True,
                timeout=600,
            )
            assert sub.returncode == 0, sub.stderr
            peak = int(r.info("memory")["used_memory_peak"]) - base
            return peak / 1e6, int(r.hlen(Keys("mem").holders))
        finally:
            for w in workers:
                w.terminate()
            for w in workers:
                w.wait(timeout=60)


def test_a_running_batch_costs_redis_the_same_at_any_size(tmp_path: Path) -> None:
    """Through ``genq batch submit``: Redis' peak for 100,000 lines is within 1.5x of its peak
    for 5,000 (both fill the window of 2,000). It was 4x at 300,000 lines: every echo or static
    worker told the fleet it held the prefix of every request it ran (a field per line in the
    holders hash, ~75 bytes each) though it keeps none."""
    small, small_holders = _batch_peak(5_000, tmp_path)
    big, big_holders = _batch_peak(100_000, tmp_path)
    assert big <= 1.5 * small, (small, big)
    assert small_holders == big_holders == 0
