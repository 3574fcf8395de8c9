"""A fleet shares the work as a central scheduler would: no worker hoards requests while
another idles. Echo workers with step times stand in for GPUs (behaviour, not timing: the
assertions are about who ran what, never how fast)."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable

import pytest
import redis
from genq.common.keys import GROUP, RETURNED, Keys
from genq.producer import Client

from tests.conftest import WorkerProcess, wait_until

pytestmark = pytest.mark.slow


def serving(r: redis.Redis, queue: str, n: int) -> None:
    keys = Keys(queue)
    wait_until(lambda: all(r.exists(keys.worker(f"w{i}")) for i in range(n)), timeout_s=60)


def test_a_burst_over_three_workers_gives_each_a_fair_share(
    redis_url: str, queue: str, r: redis.Redis, start_worker: Callable[..., WorkerProcess]
) -> None:
    for _ in range(3):  # a batch of 4 takes 40 steps x 5 ms = 0.2 s
        start_worker(queue, "--engine", "echo", "--echo-step-ms", "5", "--max-batch-size", "4")
    serving(r, queue, 3)
    client = Client.from_url(redis_url, queue)
    ids = client.submit_many([f"burst {i}" for i in range(48)], max_new_tokens=40)
    results = client.results(ids, timeout=60)
    assert [x.status for x in results] == ["succeeded"] * 48
    shares = Counter(x.worker for x in results)
    assert len(shares) == 3 and min(shares.values()) >= 12, shares  # ideal: 16 each


def test_a_request_read_by_a_busy_worker_is_served_by_the_idle_one(
    redis_url: str, queue: str, r: redis.Redis, start_worker: Callable[..., WorkerProcess]
) -> None:
    # Batches of one that take 1 s: whoever reads both requests can start only one of them.
    for _ in range(2):
        start_worker(queue, "--engine", "echo", "--echo-step-ms", "200", "--max-batch-size", "1")
    serving(r, queue, 2)
    client = Client.from_url(redis_url, queue)
    ids = client.submit_many(["first", "second"], max_new_tokens=5)
    results = client.results(ids, timeout=30)
    assert {x.worker for x in results} == {"w0", "w1"}
    starts = sorted(x.timings.started_unix_ms or 0 for x in results)
    assert starts[1] - starts[0] < 900  # the second did not wait for the first batch to end


def test_handed_back_requests_keep_their_place_and_run_batched(
    redis_url: str, queue: str, r: redis.Redis, start_worker: Callable[..., WorkerProcess]
) -> None:
    worker = start_worker(
        queue, "--engine", "echo", "--echo-step-ms", "20", "--max-batch-size", "2"
    )
    serving(r, queue, 1)
    client = Client.from_url(redis_url, queue)
    ids = client.submit_many([f"r{i}" for i in range(6)], max_new_tokens=5)  # 0.1 s a batch
    results = client.results(ids, timeout=30)
    assert [x.status for x in results] == ["succeeded"] * 6
    # Oldest first, in batches of two: handing back and taking back kept their order, and
    # none of them was taken for a request started before (those run alone).
    starts = sorted({x.timings.started_unix_ms for x in results})
    batches = [{x.id for x in results if x.timings.started_unix_ms == s} for s in starts]
    assert batches == [set(ids[0:2]), set(ids[2:4]), set(ids[4:6])]
    assert all(x.batch_size == 2 for x in results)

    def batch_sizes() -> list[int]:
        sizes: list[int] = json.loads(
            r.hget(Keys(queue).worker("w0"), "recent_batch_sizes") or "[]"
        )
        return sizes

    # The stats hash is published with results and at least every second: wait for it.
    wait_until(lambda: batch_sizes() == [2, 2, 2], timeout_s=5)
    assert int(r.hget(Keys(queue).worker("w0"), "handed_back") or 0) >= 4
    worker.stop()


def test_nothing_stays_handed_back_once_the_work_is_done(
    redis_url: str, queue: str, r: redis.Redis, start_worker: Callable[..., WorkerProcess]
) -> None:
    for _ in range(2):
        start_worker(queue, "--engine", "echo", "--echo-step-ms", "10", "--max-batch-size", "2")
    serving(r, queue, 2)
    client = Client.from_url(redis_url, queue)
    ids = client.submit_many([f"x{i}" for i in range(10)], max_new_tokens=5)
    client.results(ids, timeout=30)
    for stream in Keys(queue).streams():
        consumers = r.xinfo_consumers(stream, GROUP)
        returned = [c for c in consumers if c["name"].decode() == RETURNED]
        assert all(int(c["pending"]) == 0 for c in returned)
        assert r.xlen(stream) == 0
