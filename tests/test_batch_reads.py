"""Reads while a static batch runs (``worker/runtime/batch_reads.py``): the turn's read
moved off its critical path, into a thread that reads only while the loop is inside the
engine, shortly before the batch's expected end and at each ring after that."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from genq.producer import Client
from genq.worker.engines.base import BatchReport, GenerationInput
from genq.worker.engines.echo import EchoEngine
from genq.worker.runtime.batch_reads import LEAD_MS, ReadsDuringBatch

from tests.conftest import pending, wait_until, worker_thread


class Reads:
    """A ``read`` that records when it ran and what it was told, and can be held."""

    def __init__(self) -> None:
        self.calls: list[tuple[float, dict[str, int]]] = []
        self.release = threading.Event()
        self.release.set()
        self.fail = False

    def __call__(self, fetched: dict[str, int]) -> list[tuple[str, list[Any]]]:
        self.calls.append((time.monotonic(), dict(fetched)))
        self.release.wait(10)
        if self.fail:
            raise ConnectionError("Redis away (injected)")
        return [("s", [(f"1-{len(self.calls)}", {})])]


@pytest.fixture()
def reads() -> Iterator[tuple[ReadsDuringBatch, Reads]]:
    read = Reads()
    batch_reads = ReadsDuringBatch(read)
    batch_reads.start()
    try:
        yield batch_reads, read
    finally:
        read.release.set()
        batch_reads.stop()


def test_nothing_is_read_outside_a_batch_and_a_ring_then_is_ignored(
    reads: tuple[ReadsDuringBatch, Reads],
) -> None:
    batch_reads, read = reads
    batch_reads.ring()
    time.sleep(0.1)
    assert read.calls == []
    assert batch_reads.take() == ([], False)  # nothing read: the loop reads itself


def test_the_first_read_comes_shortly_before_the_batch_ends_not_when_it_starts(
    reads: tuple[ReadsDuringBatch, Reads],
) -> None:
    batch_reads, read = reads
    opened = time.monotonic()
    with batch_reads.window(300):
        batch_reads.ring()  # before the read is due: that read covers it
        wait_until(lambda: read.calls, timeout_s=10, every_s=0.005)
        time.sleep(0.05)
    assert len(read.calls) == 1
    assert read.calls[0][0] - opened >= (300 - LEAD_MS[1]) / 1000
    got, covered = batch_reads.take()
    assert covered and got == [("s", [("1-1", {})])]
    assert batch_reads.take() == ([], False)  # taken once


def test_each_ring_after_the_first_read_reads_again_counting_what_was_read(
    reads: tuple[ReadsDuringBatch, Reads],
) -> None:
    batch_reads, read = reads
    with batch_reads.window(0):
        wait_until(lambda: len(read.calls) == 1, timeout_s=10, every_s=0.005)
        read.release.clear()
        batch_reads.ring()
        wait_until(lambda: len(read.calls) == 2, timeout_s=10, every_s=0.005)
        batch_reads.ring()  # two rings during one read: one more read
        batch_reads.ring()
        read.release.set()
        wait_until(lambda: len(read.calls) == 3, timeout_s=10, every_s=0.005)
        time.sleep(0.05)
    assert len(read.calls) == 3
    assert [fetched for _, fetched in read.calls] == [{}, {"s": 1}, {"s": 2}]
    got, covered = batch_reads.take()
    assert covered and sum(len(entries) for _, entries in got) == 3


def test_leaving_the_window_waits_for_a_read_in_flight(
    reads: tuple[ReadsDuringBatch, Reads],
) -> None:
    batch_reads, read = reads
    read.release.clear()
    left = threading.Event()

    def batch() -> None:
        with batch_reads.window(0):
            wait_until(lambda: read.calls, timeout_s=10, every_s=0.005)
        left.set()

    thread = threading.Thread(target=batch)
    thread.start()
    wait_until(lambda: read.calls, timeout_s=10, every_s=0.005)
    time.sleep(0.1)
    assert not left.is_set()  # the loop would share its state with the read
    read.release.set()
    thread.join(timeout=10)
    assert left.is_set()
    assert batch_reads.take()[1]


def test_a_failed_read_leaves_the_turn_to_read_itself(
    reads: tuple[ReadsDuringBatch, Reads],
) -> None:
    batch_reads, read = reads
    read.fail = True
    with batch_reads.window(0):
        wait_until(lambda: read.calls, timeout_s=10, every_s=0.005)
        time.sleep(0.05)
    assert batch_reads.take() == ([], False)


class HeldEngine(EchoEngine):
    """Echo, but each batch waits for ``go`` (up to 20 s): a batch that runs as long as the
    test needs."""

    ms_per_step = None  # (how long a batch holds is the test's: the first is guessed)

    def __init__(self) -> None:
        super().__init__()
        self.go = threading.Event()
        self.in_batch = threading.Event()

    def generate(self, batch: Any) -> BatchReport:
        rows: list[GenerationInput] = list(batch)
        self.in_batch.set()
        self.go.wait(20)
        self.in_batch.clear()
        return super().generate(rows)


@pytest.mark.parametrize("hand_back_after_ms", [5000, 50])
def test_a_request_arriving_during_a_short_batch_is_read_before_it_ends(
    r: redis.Redis, redis_url: str, queue: str, hand_back_after_ms: int
) -> None:
    """A short batch (expected under ``hand_back_after_ms``; the first one is guessed at 1 s)
    reads in the loop's place, so the request that arrived meanwhile is this worker's before
    the batch ends. A long one does not: what waits is for whichever worker is free first."""
    engine = HeldEngine()
    client = Client.from_url(redis_url, queue)
    with worker_thread(
        redis_url, queue, engine, hand_back_after_ms=hand_back_after_ms, max_wait_ms=0
    ) as worker:
        first = client.submit("first", max_new_tokens=2)
        assert engine.in_batch.wait(20)
        second = client.submit("second", max_new_tokens=2)
        if hand_back_after_ms > 1000:
            wait_until(lambda: pending(r, queue, "inproc") == 2, timeout_s=10)
            assert engine.in_batch.is_set()  # read while the batch still ran
        else:
            time.sleep(1.5)
            assert pending(r, queue, "inproc") == 1  # the running one only
        engine.go.set()
        assert [x.status for x in client.results([first, second], timeout=30)] == [
            "succeeded",
            "succeeded",
        ]
        assert (worker.reader.batch_reads.reads > 0) == (hand_back_after_ms > 1000)
    client.close()
