"""One turn serves both engines, and it handles Redis failing at a start the same way for both.

Before the redesign the static path put a batch back in the look-ahead on any Redis error,
but the continuous path only on ``redis.RedisError``: a Redis Cluster's ``SlotNotCoveredError``
is not one, so a batch already taken out of the look-ahead went untracked until another worker
reclaimed it (``claim_idle_ms`` later). Here the start fails once with that error and every
request must still finish well within ``claim_idle_ms``.
"""

from __future__ import annotations

from typing import Any

import pytest
import redis
from genq.producer import Client
from genq.worker.engines.base import Engine
from genq.worker.engines.echo import EchoEngine

from tests.conftest import wait_until
from tests.test_request_lifecycle import worker_thread

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

        def fail_once(items: Any, token: str) -> list[int]:
            if not failures:
                failures.append([i[0] for i in items])
                raise redis.exceptions.SlotNotCoveredError("slot not covered (injected)")
            return real(items, token)

        worker.starter.queue.mark_running = fail_once  # type: ignore[method-assign]
        results = client.results(ids, timeout=30)
        assert failures and failures[0], "the injected failure never happened"
        assert [r.status for r in results] == ["succeeded"] * 6
        assert worker.counters.reclaimed == 0  # finished by this worker, not rescued
    client.close()


def test_both_engines_run_behind_the_same_turn(redis_url: str, queue: str) -> None:
    """The worker picks a runner by the engine's kind; the loop itself is the same."""
    from genq.worker.runtime.runners import ContinuousRunner, StaticRunner

    client = Client.from_url(redis_url, queue)
    for name, runner in (("echo", StaticRunner), ("continuous", ContinuousRunner)):
        with running_worker(redis_url, f"{queue}-{name}", make_engine(name)) as worker:
            assert type(worker.runner) is runner
            c = Client.from_url(redis_url, f"{queue}-{name}")
            assert c.generate("hello", max_new_tokens=3, timeout=30).status == "succeeded"
            wait_until(lambda w=worker: w.counters.succeeded == 1)  # type: ignore[misc]
            c.close()
    client.close()
