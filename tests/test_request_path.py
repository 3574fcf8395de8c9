"""One request's path through a worker, counted (a short path, kept under test): the
Redis round trips the worker makes for it and the genq functions it runs, on the echo engine,
in a closed loop (one request after another) after a warm-up; medians of 30 requests. The
bounds are what the path measured when this test was written, with a little room: the test
fails when the path grows, not when it varies."""

from __future__ import annotations

import os
import statistics
import sys
import threading
import time
from collections.abc import Iterator
from types import FrameType
from typing import Any

import genq.producer
import pytest
from genq.producer import Client
from genq.worker.devtools.redis_server import RedisServer
from genq.worker.engines.echo import EchoEngine
from redis.connection import Connection

from tests.conftest import worker_thread

ROUND_TRIPS = 6
"""The goal; measured 4.5-5 (the read, the running mark, the final write, the blocked wait
on the doorbell that follows, now and then a heartbeat)."""
FUNCTIONS = 117
"""Named genq functions (comprehensions and lambdas not counted) the worker runs for one
request: what every read and plan needs is built once (the stream map, the batch limits, the
stats fields, the history's keys), and steps with nothing to do are skipped (a lone tenant's
shares, the suspects' scan, a heartbeat or a reclaim not due, what only a running or
preempting runner needs, empty refunds, untold prefixes). The count's history is in the commit
log and BENCHMARKS.md."""


GENQ_DIR = os.path.dirname(os.path.dirname(genq.producer.__file__)) + os.sep
"""Where genq's own modules are (a "/genq/" in a path would also match a checkout in a folder
named genq, with its virtual environment and redis-py in it)."""


class PathCount:
    """Sends on redis-py connections and genq functions called, from the worker's threads
    (every thread but the test's), while ``recording``."""

    def __init__(self) -> None:
        self.sends = 0
        self.functions: set[tuple[str, str, int]] = set()
        self.recording = False
        self._main = threading.main_thread()

    def profile(self, frame: FrameType, event: str, arg: Any) -> None:
        if self.recording and event == "call":
            code = frame.f_code
            if code.co_filename.startswith(GENQ_DIR) and not code.co_name.startswith("<"):
                self.functions.add((code.co_filename, code.co_name, code.co_firstlineno))


@pytest.fixture()
def path_count(monkeypatch: pytest.MonkeyPatch) -> Iterator[PathCount]:
    count = PathCount()
    send = Connection.send_packed_command

    def counted(conn: Connection, command: Any, check_health: bool = True) -> None:
        if count.recording and threading.current_thread() is not count._main:
            count.sends += 1
        send(conn, command, check_health)

    monkeypatch.setattr(Connection, "send_packed_command", counted)
    threading.setprofile(count.profile)  # the worker's threads start after this
    try:
        yield count
    finally:
        threading.setprofile(None)  # type: ignore[arg-type]


@pytest.mark.skipif(sys.version_info < (3, 10), reason="profiles threads as 3.10+ does")
def test_one_requests_path_stays_short(path_count: PathCount) -> None:
    with RedisServer() as server, worker_thread(server.url, "path", EchoEngine()):
        client = Client.from_url(server.url, "path")
        for i in range(20):
            client.generate(f"warm {i}", timeout=30)
        time.sleep(1.2)  # past the first heartbeats
        trips, functions = [], []
        for i in range(30):
            path_count.sends, path_count.functions = 0, set()
            path_count.recording = True  # the test's own thread is neither counted nor profiled
            request_id = client.submit(f"path {i}", max_new_tokens=4)
            client.result(request_id, timeout=30)
            path_count.recording = False
            trips.append(path_count.sends)
            functions.append(len(path_count.functions))
            time.sleep(0.02)
    print(f"round trips {statistics.median(trips)}, functions {statistics.median(functions)}")
    assert statistics.median(trips) <= ROUND_TRIPS, sorted(trips)
    assert statistics.median(functions) <= FUNCTIONS, sorted(functions)
