"""One turn serves both engines, and it handles Redis failing at a start the same way for both.

Before the redesign the static path put a batch back in the look-ahead on any Redis error,
but the continuous path only on ``redis.RedisError``: a Redis Cluster's ``SlotNotCoveredError``
is not one, so a batch already taken out of the look-ahead went untracked until another worker
reclaimed it (``claim_idle_ms`` later). Here the start fails once with that error and every
request must still finish well within ``claim_idle_ms``.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
import redis
from genq.common.keys import GROUP, Keys
from genq.common.settings import WorkerSettings
from genq.producer import Client
from genq.worker.engines.base import Engine, GenerationInput, GenerationOutput
from genq.worker.engines.echo import EchoEngine
from genq.worker.runtime import read_trip
from genq.worker.runtime.doorbell import DoorbellListener
from genq.worker.runtime.fair_share import TenantAccounts
from genq.worker.runtime.queue_io import join_lanes
from genq.worker.runtime.read_trip import READ_PACE_S, ReadTrip

from tests.conftest import wait_until, worker_thread

CLAIM_IDLE_MS = 120_000
"""Far longer than the test waits: a request only reclaim could rescue would time out."""


def make_engine(name: str) -> Engine:
    if name == "echo":
        return EchoEngine()
    from genq.worker.engines.continuous import ContinuousEngine

    return ContinuousEngine.load("tiny", max_batch_tokens=4096, max_batch_size=8)


def running_worker(redis_url: str, queue: str, engine: Engine) -> Any:
    """The real worker loop in a thread, on ``engine``, with reclaim out of reach."""
    return worker_thread(
        redis_url, queue, engine, claim_idle_ms=CLAIM_IDLE_MS, max_batch_size=8, max_wait_ms=0
    )


@pytest.mark.parametrize("engine_name", ["echo", "continuous"])
def test_a_cluster_routing_error_at_a_start_keeps_the_batch_for_both_engines(
    redis_url: str, queue: str, engine_name: str
) -> None:
    client = Client.from_url(redis_url, queue)
    ids = client.submit_many([f"prompt {i}" for i in range(6)], max_new_tokens=4)
    engine = make_engine(engine_name)
    failures: list[list[str]] = []
    with running_worker(redis_url, queue, engine) as worker:
        real = worker.starter.queue.mark_running

        def fail_once(items: Any, token: str, held: Any = (), read: Any = None) -> Any:
            if not failures:
                failures.append([i[0] for i in items])
                raise redis.exceptions.SlotNotCoveredError("slot not covered (injected)")
            return real(items, token, held, read)

        worker.starter.queue.mark_running = fail_once  # type: ignore[method-assign]
        results = client.results(ids, timeout=30)
        assert failures and failures[0], "the injected failure never happened"
        assert [r.status for r in results] == ["succeeded"] * 6
        assert worker.counters.reclaimed == 0  # finished by this worker, not rescued
    client.close()


def test_both_engines_run_behind_the_same_turn(redis_url: str, queue: str) -> None:
    """The worker picks a runner by the engine's kind; the loop itself is the same."""
    from genq.worker.runtime.continuous_runner import ContinuousRunner
    from genq.worker.runtime.static_runner import StaticRunner

    client = Client.from_url(redis_url, queue)
    for name, runner in (("echo", StaticRunner), ("continuous", ContinuousRunner)):
        with running_worker(redis_url, f"{queue}-{name}", make_engine(name)) as worker:
            assert type(worker.runner) is runner
            c = Client.from_url(redis_url, f"{queue}-{name}")
            assert c.generate("hello", max_new_tokens=3, timeout=30).status == "succeeded"
            wait_until(lambda w=worker: w.counters.succeeded == 1)  # type: ignore[misc]
            c.close()
    client.close()


def test_a_short_batchs_start_carries_the_next_read_while_a_backlog_waits(
    redis_url: str, queue: str
) -> None:
    """Batches of echo (no step time) end before a read beside them could help: while the last
    read left a backlog, each start's round trip reads the next batch's candidates too, and the
    next turn plans without a read of its own. Every request still ends once."""
    client = Client.from_url(redis_url, queue)
    settings: dict[str, Any] = {"max_batch_size": 50, "max_lookahead": 100, "max_wait_ms": 0}
    with worker_thread(redis_url, queue, EchoEngine(), **settings) as worker:
        q, trip = worker.queue, worker.reader.trip
        real_read, real_mark = trip.read, q.mark_running
        reads, starts, carried = [0], [0], [0]

        def read(*args: Any, **kwargs: Any) -> Any:
            reads[0] += kwargs.get("pipe") is None  # (not the read a start carries)
            return real_read(*args, **kwargs)

        def mark(*args: Any, **kwargs: Any) -> Any:
            starts[0] += 1
            answers, fetched = real_mark(*args, **kwargs)
            carried[0] += fetched is not None
            return answers, fetched

        trip.read, q.mark_running = read, mark  # type: ignore[method-assign]
        ids = client.submit_many([f"job {i}" for i in range(600)], max_new_tokens=4)
        results = client.results(ids, timeout=60)
        wait_until(lambda: worker.counters.succeeded == 600)
    assert [r.status for r in results] == ["succeeded"] * 600
    assert starts[0] >= 12  # batches of 50 at most
    assert carried[0] >= starts[0] // 2, (carried, starts, reads)
    assert reads[0] < starts[0] - carried[0] + 5, (carried, starts, reads)  # (reads when idle)
    client.close()


class SlowIterationEngine(EchoEngine):
    """An iteration-level engine that takes ``hold_s`` per request and no CPU: what the loop
    does while a real engine computes is all there is to see."""

    name = "slow-iteration"

    def __init__(self, hold_s: float) -> None:
        super().__init__()
        self.hold_s = hold_s
        self.due: dict[str, float] = {}

    def submit(self, key: str, row: GenerationInput) -> None:
        self.due[key] = time.monotonic() + self.hold_s

    def poll(self, timeout_s: float) -> list[tuple[str, GenerationOutput | str]]:
        time.sleep(max(0.0, min(timeout_s, min(self.due.values(), default=0) - time.monotonic())))
        done = [k for k, t in self.due.items() if t <= time.monotonic()]
        for k in done:
            del self.due[k]
        return [
            (k, GenerationOutput(text="x", completion_tokens=1, finish_reason="length"))
            for k in done
        ]

    def cancel(self, key: str) -> None:
        self.due.pop(key, None)

    def close(self) -> None:
        pass


def test_a_busy_worker_asks_an_empty_queue_at_most_every_read_pace(
    redis_url: str, queue: str
) -> None:
    """While the engine runs and the queue is empty, the turn still goes round (results are
    written the moment they finish) but asks Redis for new entries only every READ_PACE_S:
    at 20 ms turns it asked three streams ~50 times a second, CPU taken from the model."""
    client = Client.from_url(redis_url, queue)
    engine = SlowIterationEngine(hold_s=2.0)
    asks: list[float] = []
    with running_worker(redis_url, queue, engine) as worker:
        trip = worker.reader.trip  # (each read sent to Redis, not the paced ones: a pipeline)
        real = trip.redis

        class Counting:
            def __getattr__(self, name: str) -> Any:
                return getattr(real, name)

            def pipeline(self, *args: Any, **kwargs: Any) -> Any:
                asks.append(time.monotonic())
                return real.pipeline(*args, **kwargs)

        trip.redis = Counting()  # type: ignore[assignment]
        first = client.submit("running", max_new_tokens=4)
        wait_until(lambda: worker.runner.busy)
        asks.clear()
        time.sleep(1.0)
        busy_asks = len(asks)
        late = client.submit("arrives while busy", max_new_tokens=4)
        t0 = time.monotonic()
        wait_until(lambda: len(worker.runner.running) == 2, timeout_s=5)
        joined_s = time.monotonic() - t0
        results = client.results([first, late], timeout=30)
    assert [r.status for r in results] == ["succeeded", "succeeded"]
    assert busy_asks <= 1.0 / READ_PACE_S + 2, busy_asks  # ~50 without pacing
    assert busy_asks >= 5  # it does go on reading while busy
    assert joined_s < 1.0  # a request arriving meanwhile joins within a pace (plus a turn)
    client.close()


def read_trip_of(r: redis.Redis, keys: Keys, settings: WorkerSettings, consumer: str) -> ReadTrip:
    """A worker's read round trip on its own, reading by fair share, its groups made."""
    join_lanes(r, keys, settings.heartbeat_ttl_s)
    named = settings.model_copy(update={"consumer": consumer})
    tenants = TenantAccounts(r, keys)
    return ReadTrip(r=r, keys=keys, settings=named, read_rule="fair", before=[tenants.ride])


def test_a_paced_read_waits_out_the_pace_after_finding_the_queue_empty(
    r: redis.Redis, queue: str
) -> None:
    keys = Keys(queue)
    settings = WorkerSettings.build({"queue": queue, "engine": "echo"}, env={})
    io = read_trip_of(r, keys, settings, "c")
    room = dict.fromkeys(keys.streams(), 4)
    assert io.read(room, pace_s=READ_PACE_S) == [] and io.read_wait_s() > 0
    Client(r, queue).submit("new", max_new_tokens=2)
    assert io.read(room, pace_s=READ_PACE_S) == []  # found empty just now: not asked
    assert io.read_wait_s() <= READ_PACE_S
    time.sleep(io.read_wait_s())
    assert len(io.read(room, pace_s=READ_PACE_S)) == 1  # the pace is over: asked
    assert io.read_wait_s() == 0  # it found something: the next read asks at once


def test_a_busy_worker_hears_the_doorbell_instead_of_waiting_out_its_pace(
    redis_url: str, queue: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request arriving while an iteration-level engine generates joins the running batch
    when the doorbell rings (``doorbell.py``), not at the next paced read: with the pace made
    a minute long, the late request still joins while the first one runs."""
    monkeypatch.setattr(read_trip, "READ_PACE_S", 60.0)
    client = Client.from_url(redis_url, queue)
    engine = SlowIterationEngine(hold_s=8.0)
    with running_worker(redis_url, queue, engine) as worker:
        first = client.submit("running", max_new_tokens=4)
        wait_until(lambda: worker.runner.busy)
        time.sleep(0.3)  # its read found the queue empty: the next paced one is a minute away
        assert worker.reader.trip.read_wait_s() > 30
        late = client.submit("arrives while busy", max_new_tokens=4)
        wait_until(lambda: len(worker.runner.running) == 2, timeout_s=4)
        results = client.results([first, late], timeout=30)
    assert [r.status for r in results] == ["succeeded", "succeeded"]
    client.close()


def test_the_doorbell_listener_hears_rings_only_while_armed_and_takes_none_from_the_group(
    r: redis.Redis, queue: str
) -> None:
    """The listener reads the doorbell without the consumer group: an idle worker blocked on
    the group still gets every ring (each ring wakes one idle worker)."""
    keys = Keys(queue)
    settings = WorkerSettings.build({"queue": queue, "engine": "echo"}, env={})
    read_trip_of(r, keys, settings, "idle")
    listener = DoorbellListener(r, [keys.doorbell])
    listener.start()
    try:
        listener.arm(True)
        time.sleep(0.2)  # blocked on the doorbell by now
        Client(r, queue).submit("one", max_new_tokens=2)
        wait_until(listener.rung, timeout_s=3)
        assert listener.take() and not listener.rung()  # take clears it
        rings: Any = r.xreadgroup(GROUP, "idle", {keys.doorbell: ">"})
        assert len(rings[0][1]) == 1  # the group's ring is still there for an idle worker
        listener.arm(False)
        Client(r, queue).submit("two", max_new_tokens=2)
        time.sleep(1.5)  # past the listener's blocked read
        assert not listener.rung()
    finally:
        listener.stop()


def test_a_submissions_ring_says_the_highest_priority_it_brings(r: redis.Redis, queue: str) -> None:
    """``p`` on the doorbell's ring: what a static batch with --preempt listens for (a lower
    batch stops); the listener hands it to ``on_priority`` while armed."""
    keys = Keys(queue)
    settings = WorkerSettings.build({"queue": queue, "engine": "echo"}, env={})
    read_trip_of(r, keys, settings, "idle")
    heard: list[str] = []
    listener = DoorbellListener(r, [keys.doorbell])
    listener.start()
    try:
        listener.arm(True, on_priority=heard.append)
        time.sleep(0.2)  # blocked on the doorbell by now
        client = Client(r, queue)
        client.submit_many(
            [{"prompt": "a", "priority": "low"}, {"prompt": "b", "priority": "normal"}],
            max_new_tokens=2,
        )
        wait_until(lambda: heard, timeout_s=3)
        client.submit("c", max_new_tokens=2, priority="high")
        wait_until(lambda: len(heard) == 2, timeout_s=3)
        assert heard == ["normal", "high"]
        rings: Any = r.xrange(keys.doorbell)
        assert [f[b"p"] for _, f in rings] == [b"normal", b"high"]
    finally:
        listener.stop()


def test_a_stream_run_again_sends_only_what_the_runs_before_it_did_not() -> None:
    """A static batch that stopped runs again from its prompts: the same text again, so its
    streams send only what is new, and the first (empty) piece once."""
    from genq.worker.engines.base import Replayed

    sent: list[str] = []
    stream = Replayed(sent.append)
    stream.restart()
    for piece in ("", "Hel", "lo"):
        stream(piece)
    stream.restart()  # stopped; from the prompt again
    for piece in ("", "H", "ello", ", wor", "ld"):
        stream(piece)
    assert sent == ["", "Hel", "lo", ", wor", "ld"]
