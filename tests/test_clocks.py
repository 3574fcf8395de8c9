"""Skewed clocks: a worker whose host clock is hours or seconds off times everything by
Redis' clock, and deadlines are relative to the entry's time. Workers run under libfaketime
(Debian's ``faketime``) against a real redis-server."""

from __future__ import annotations

import glob
import statistics
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from genq.common.keys import Keys
from genq.producer import Client

from tests.conftest import WorkerProcess, wait_until

LIBFAKETIME = next(iter(sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1"))), None)
pytestmark = pytest.mark.skipif(
    LIBFAKETIME is None, reason="libfaketime (Debian's faketime package) not installed"
)


@pytest.fixture()
def skewed_worker(redis_url: str, tmp_path: Path) -> Iterator[Callable[..., WorkerProcess]]:
    started: list[WorkerProcess] = []

    def start(queue: str, skew: str, *args: str) -> WorkerProcess:
        # `env` execs the worker (the faketime command would fork, and a SIGTERM to it would
        # leave the worker running); only the wall clock is off, not the monotonic one.
        preload = (f"LD_PRELOAD={LIBFAKETIME}", f"FAKETIME={skew}")
        w = WorkerProcess(
            ["--redis-url", redis_url, "--queue", queue, "--consumer", "skewed", *args],
            tmp_path / f"worker{len(started)}.log",
            wrapper=("env", *preload, "FAKETIME_DONT_FAKE_MONOTONIC=1"),
        )
        started.append(w)
        return w

    yield start
    for w in started:
        w.stop()


@pytest.mark.parametrize("skew", ["+2h", "-2h", "-3s"])
def test_deadlines_and_lone_requests_do_not_depend_on_the_workers_clock(
    skew: str, queue: str, redis_url: str, skewed_worker: Callable[..., WorkerProcess]
) -> None:
    client = Client.from_url(redis_url, queue)
    w = skewed_worker(queue, skew, "--engine", "echo")
    wait_until(lambda: client.redis.exists(Keys(queue).worker("skewed")), timeout_s=30)
    ids = client.submit_many([f"p{i}" for i in range(50)], max_new_tokens=4, deadline_in_s=300)
    assert [x.status for x in client.results(ids, timeout=60)] == ["succeeded"] * 50
    took = []
    for _ in range(5):  # one at a time: nothing to wait for
        t = time.monotonic()
        client.generate("alone", max_new_tokens=4, timeout=30)
        took.append(time.monotonic() - t)
    assert statistics.median(took) < 0.5, took  # a worker 3 s slow once made this 3 s
    late = client.submit("too late", max_new_tokens=4, deadline_in_s=-1)
    assert client.result(late, timeout=30).status == "expired"
    assert "clock is" in w.log()  # it noticed, and said so


def test_priorities_hold_on_a_worker_whose_clock_is_hours_fast(
    queue: str, redis_url: str, skewed_worker: Callable[..., WorkerProcess]
) -> None:
    client = Client.from_url(redis_url, queue)
    low = client.submit_many([f"low {i}" for i in range(30)], max_new_tokens=4, priority="low")
    high = client.submit_many([f"high {i}" for i in range(10)], max_new_tokens=4, priority="high")
    skewed_worker(queue, "+2h", "--engine", "echo", "--max-batch-size", "10")
    results = {x.id: x for x in client.results(low + high, timeout=60)}
    first_low = min(results[i].timings.started_unix_ms or 0 for i in low)
    assert all((results[i].timings.started_unix_ms or 0) <= first_low for i in high)
