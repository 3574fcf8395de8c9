"""Chaos: workers killed with SIGKILL mid-batch and replaced, and a redis-server restart with
AOF; every accepted request still ends succeeded, exactly once, and nothing stays pending."""

from __future__ import annotations

import contextlib
import random
import threading
import time
from collections.abc import Callable
from pathlib import Path

import redis
from genq.common.keys import Keys
from genq.producer import Client
from genq.worker.devtools.redis_server import RedisServer

from tests.conftest import WorkerProcess, pending, wait_until

CHAOS_WORKER = (
    "--engine",
    "echo",
    "--echo-step-ms",
    "3",
    "--max-batch-size",
    "8",
    "--claim-idle-ms",
    "1000",
)


def test_three_workers_killed_and_replaced_mid_batch_lose_nothing(
    redis_url: str, queue: str, r: redis.Redis, start_worker: Callable[..., WorkerProcess]
) -> None:
    rng = random.Random(7)
    client = Client.from_url(redis_url, queue)
    live = [start_worker(queue, *CHAOS_WORKER) for _ in range(3)]
    prompts = [
        {
            "prompt": f"request {i}",
            "max_new_tokens": rng.randint(20, 60),
            "priority": rng.choice(["high", "normal", "low"]),
        }
        for i in range(300)
    ]
    ids = client.submit_many(prompts)
    kills = 0
    for _ in range(4):  # a batch takes 60-180 ms: a kill almost always lands mid-batch
        time.sleep(0.8)
        victim = live.pop(rng.randrange(len(live)))
        victim.kill()
        kills += 1
        live.append(start_worker(queue, *CHAOS_WORKER))
    results = client.results(ids, timeout=120)
    assert kills == 4
    assert [x.status for x in results] == ["succeeded"] * 300
    assert all(
        x.text == p["prompt"][: p["max_new_tokens"]] for x, p in zip(results, prompts, strict=True)
    )
    wait_until(lambda: pending(r, queue) == 0, timeout_s=30)
    assert sum(r.xlen(s) for s in Keys(queue).streams()) == 0
    # Exactly one final event per request, whoever ran it how often.
    assert all(r.xlen(Keys(queue).events(i)) == 1 for i in ids)


def test_nothing_accepted_is_lost_across_a_redis_restart_with_aof(
    tmp_path: Path, start_worker: Callable[..., WorkerProcess]
) -> None:
    server = RedisServer(["--appendonly", "yes", "--appendfsync", "always"]).start()
    try:
        url = server.url
        queue = "restart"
        workers = [
            WorkerProcess(
                [
                    "--redis-url",
                    url,
                    "--queue",
                    queue,
                    "--consumer",
                    f"rw{i}",
                    "--engine",
                    "echo",
                    "--echo-step-ms",
                    "2",
                    "--max-batch-size",
                    "8",
                ],
                tmp_path / f"rw{i}.log",
            )
            for i in range(2)
        ]
        client = Client.from_url(url, queue)
        accepted: list[str] = []
        stop = threading.Event()

        def produce() -> None:  # keeps submitting through the restart; counts what Redis took
            i = 0
            while not stop.is_set():
                # A ConnectionError means not accepted: the caller knows (and would retry).
                with contextlib.suppress(redis.ConnectionError):
                    accepted.extend(
                        client.submit_many([f"r{i}-{j}" for j in range(5)], max_new_tokens=20)
                    )
                i += 1
                time.sleep(0.02)

        run_id = redis.Redis.from_url(url).info("server")["run_id"]
        producer = threading.Thread(target=produce)
        producer.start()
        wait_until(lambda: len(accepted) >= 100)
        assert server.process is not None
        server.process.kill()  # SIGKILL: only what appendfsync always wrote survives
        server.stop(remove_dir=False)
        time.sleep(1.0)
        server.start()
        wait_until(lambda: len(accepted) >= 300, timeout_s=60)
        stop.set()
        producer.join()
        results = client.results(accepted, timeout=120)
        assert [x.status for x in results].count("succeeded") == len(accepted)
        check = redis.Redis.from_url(url)
        assert check.info("server")["run_id"] != run_id  # it really was a new redis-server
        wait_until(lambda: pending(check, queue) == 0, timeout_s=30)
        for w in workers:  # both rode it out and exit cleanly
            assert w.stop() == 0
    finally:
        server.stop()
