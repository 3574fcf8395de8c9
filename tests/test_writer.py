"""The worker's result writer thread (worker/writer.py), with a plain function for Redis: what
it holds, in what order it writes, how it waits and retries, and how errors reach the loop.
The real APPLY path through it is covered by every end-to-end test."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import pytest
import redis
from genq.worker.runtime.writer import ResultWriter


@dataclass
class Out:
    stream: str
    entry_id: str


def outs(*ids: str) -> list[Out]:
    return [Out("s", i) for i in ids]


class Store:
    """A stand-in for Redis that records each call, can be held up, and can fail."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []
        self.gate = threading.Event()
        self.gate.set()
        self.fail_with: list[BaseException] = []

    def write(self, batch: list[Out]) -> list[int]:
        self.gate.wait(10)
        if self.fail_with:
            raise self.fail_with.pop(0)
        self.calls.append([o.entry_id for o in batch])
        return [1] * len(batch)


def test_everything_put_is_written_in_order_and_reported_back() -> None:
    store = Store()
    writer = ResultWriter(store.write, max_backlog=100)
    try:
        writer.put(outs("1", "2"))
        writer.put(outs("3"))
        assert writer.flush(5)
        assert [i for call in store.calls for i in call] == ["1", "2", "3"]
        written = writer.take_written()
        assert [o.entry_id for batch, _ in written for o in batch] == ["1", "2", "3"]
        assert all(answers == [1] * len(batch) for batch, answers in written)
        assert writer.take_written() == [] and len(writer) == 0
    finally:
        writer.stop()


def test_what_waits_is_held_while_redis_is_slow_then_written_in_order() -> None:
    store = Store()
    store.gate.clear()  # Redis is slow: the first call hangs
    writer = ResultWriter(store.write, max_backlog=100)
    try:
        writer.put(outs("1"))
        writer.put(outs("2", "3"))
        assert writer.entries() == [("s", "1"), ("s", "2"), ("s", "3")]
        assert not writer.flush(0.2)  # times out: not written yet
        store.gate.set()
        assert writer.flush(5)
        assert [i for c in store.calls for i in c] == ["1", "2", "3"]
        assert ("s", "2") not in writer.entries()
    finally:
        writer.stop()


def test_put_waits_while_the_backlog_is_over_its_limit() -> None:
    store = Store()
    store.gate.clear()
    writer = ResultWriter(store.write, max_backlog=2)
    try:
        writer.put(outs("1", "2"))
        done = threading.Event()

        def put_more() -> None:
            writer.put(outs("3"))
            done.set()

        threading.Thread(target=put_more, daemon=True).start()
        assert not done.wait(0.3)  # 3 waiting > 2: the loop is held back
        store.gate.set()
        assert done.wait(5)
    finally:
        writer.stop()


def test_redis_away_is_retried_with_the_same_outcomes_in_order() -> None:
    store = Store()
    store.fail_with = [redis.ConnectionError("down"), redis.TimeoutError("slow")]
    aways: list[float] = []
    writer = ResultWriter(store.write, max_backlog=100, on_away=lambda: aways.append(1.0))
    try:
        writer.put(outs("1", "2"))
        assert writer.flush(10)
        assert store.calls == [["1", "2"]] and len(aways) == 2
    finally:
        writer.stop()


def test_any_other_error_stops_the_writer_and_is_raised_in_the_loop() -> None:
    store = Store()
    store.fail_with = [redis.ResponseError("OOM command not allowed when used memory > maxmemory")]
    writer = ResultWriter(store.write, max_backlog=100)
    try:
        writer.put(outs("1"))
        deadline = time.monotonic() + 5
        with pytest.raises(redis.ResponseError, match="OOM"):
            while time.monotonic() < deadline:
                writer.check()
                time.sleep(0.01)
        with pytest.raises(redis.ResponseError):
            writer.put(outs("2"))  # refused: the loop stops here
        with pytest.raises(redis.ResponseError):
            writer.flush(1)
        assert writer.entries() == [("s", "1")]  # kept: its entry stays pending in Redis
    finally:
        writer.stop()
