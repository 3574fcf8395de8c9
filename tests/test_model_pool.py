"""A worker with a pool of models (``--model`` repeated): it reads only the lanes of the models
it holds, swaps by what waits, answers each request with the model it named, tells the fleet
what it holds, and two workers never both claim the place one can fill. Real redis-server,
real worker processes on the echo engine (``--echo-load-ms``: a load takes real time)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import redis
from genq.common import script_calls
from genq.common.keys import Keys
from genq.common.lua.model_claim import CLAIM_MODEL
from genq.common.prefixes import adapter_key
from genq.producer import Client

from tests.conftest import WorkerProcess, refused_at_start, wait_until

POOL = ("--engine", "echo", "--model", "alpha", "--model", "beta", "--model", "gamma")


def test_a_pool_worker_swaps_to_what_waits_and_each_answer_is_its_models(
    redis_url: str, queue: str, r: redis.Redis, start_worker: Callable[..., WorkerProcess]
) -> None:
    """One resident model at a time: requests for the other two wait in their lanes until the
    worker loads their model (one swap a model), and every result names the model it asked."""
    worker = start_worker(
        queue, *POOL, "--resident-models", "1", "--echo-load-ms", "200", "--min-resident-ms", "0"
    )
    keys = Keys(queue)
    wait_until(lambda: r.hget(keys.worker("w0"), "resident") == b"alpha", timeout_s=60)
    client = Client.from_url(redis_url, queue)
    models = ["alpha", "beta", "gamma"] * 20
    ids = [client.submit(f"q {i}", model=m, max_new_tokens=4) for i, m in enumerate(models)]
    results = client.results(ids, timeout=60)
    assert [x.status for x in results] == ["succeeded"] * len(models)
    assert [x.model for x in results] == models, "answered by the model it named"
    wait_until(lambda: int(r.hget(keys.worker("w0"), "model_loads") or 0) >= 3, timeout_s=10)
    stats = r.hgetall(keys.worker("w0"))
    assert int(stats[b"model_loads"]) <= 5, stats  # one load a model, not one a request
    assert stats[b"model"] == b"alpha beta gamma"
    holders = r.hget(keys.holders, adapter_key(stats[b"resident"].decode()))
    assert holders is not None and b"w0" in holders, "the fleet knows what it holds"
    assert "model pool: loaded" in worker.log()
    listed = subprocess.run(
        [
            sys.executable,
            "-m",
            "genq.worker",
            "models",
            "list",
            "--json",
            "--redis-url",
            redis_url,
            "--queue",
            queue,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    rows = {row["served_by"]: row for row in json.loads(listed.stdout)}
    assert all(rows[m]["workers"] == 1 for m in ("alpha", "beta", "gamma")), rows
    resident = stats[b"resident"].decode()
    assert [m for m in ("alpha", "beta", "gamma") if rows[m]["holding"]] == [resident], rows
    client.close()


def test_the_gateway_lists_every_model_of_an_idle_pool_and_serves_one_not_loaded(
    queue: str, openai_client: Any, start_worker: Callable[..., WorkerProcess]
) -> None:
    """An idle pool worker has read none of its lanes: it joins each as a consumer at start,
    so ``genq serve`` knows the models it serves (once, each by its own name, not the pool's
    joined names) and a chat for one not resident waits for its load instead of a 503."""
    start_worker(queue, *POOL, "--resident-models", "1", "--echo-load-ms", "100")
    wait_until(lambda: len(openai_client.models.list().data) == 3, timeout_s=60)
    assert sorted(m.id for m in openai_client.models.list()) == ["alpha", "beta", "gamma"]
    for model in ("gamma", "beta"):
        chat = openai_client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=3
        )
        assert chat.model == model and chat.choices[0].message.content


def test_pool_workers_that_start_at_once_start_on_different_models(
    queue: str, r: redis.Redis, start_worker: Callable[..., WorkerProcess]
) -> None:
    """Each claims its first model as a load is claimed: three workers of a pool of three,
    started together, hold one model each, not all the pool's first."""
    args = (*POOL, "--resident-models", "1", "--echo-load-ms", "100")
    for _ in range(3):
        start_worker(queue, *args)
    keys = Keys(queue)

    def held() -> list[bytes | None]:
        return [r.hget(keys.worker(f"w{i}"), "resident") for i in range(3)]

    wait_until(lambda: all(held()), timeout_s=60)
    assert sorted(held()) == [b"alpha", b"beta", b"gamma"], held()


def test_a_pool_worker_reads_no_lane_of_a_model_it_does_not_hold(
    redis_url: str, queue: str, r: redis.Redis, start_worker: Callable[..., WorkerProcess]
) -> None:
    """With a long minimum residence and nothing weighing enough, the request for a cold model
    stays queued while the resident model's requests are served: the cold lane is not read."""
    start_worker(
        queue,
        *POOL,
        "--resident-models",
        "1",
        "--echo-load-ms",
        "50",
        "--min-resident-ms",
        "600000",
        "--model-wait-ms",
        "600000",
    )
    keys = Keys(queue)
    wait_until(lambda: r.hget(keys.worker("w0"), "resident") == b"alpha", timeout_s=60)
    client = Client.from_url(redis_url, queue)
    cold = client.submit("for beta", model="beta", max_new_tokens=4)
    warm = client.submit_many([{"prompt": f"a {i}", "model": "alpha"} for i in range(30)])
    assert all(x.status == "succeeded" for x in client.results(warm, timeout=30))
    time.sleep(1.0)
    assert client.status(cold).status == "queued", "beta's lane was not read"
    client.close()


def test_one_claim_per_need_and_a_dead_holder_counts_for_nothing(
    r: redis.Redis, queue: str
) -> None:
    keys = Keys(queue)
    model = adapter_key("beta")
    for w in ("w1", "w2"):
        r.hset(keys.worker(w), "consumer", w)  # live: their stats hashes exist

    def claim(me: str, need: int) -> int:
        return int(script_calls.call(r, CLAIM_MODEL, 1, keys.config, me, model, need))

    assert claim("w1", 1) == 1
    assert claim("w2", 1) == 0, "one worker is what the backlog needs: the other stays"
    assert claim("w2", 2) == 1, "a backlog that needs two"
    assert r.hget(keys.holders, model) == b"w2 w1"
    r.delete(keys.worker("w1"), keys.worker("w2"))  # both died
    assert claim("w3", 1) == 1, "dead holders hold nothing"
    assert r.hget(keys.holders, model) == b"w3"
    assert claim("w4", 0) == 1, "a starving model: any number"


def test_a_pool_that_cannot_work_is_one_clear_line_at_start(redis_url: str) -> None:
    cases = {
        ("--engine", "echo", "--model", "a", "--model", "a"): "--model a is given twice",
        (
            "--engine",
            "static",
            "--model",
            "tiny",
            "--model",
            "smollm2-135m",
            "--served-model-name",
            "x",
        ): "without --served-model-name",
        ("--engine", "echo", "--model", "a", "--model", "b", "--resident-models", "0"): (
            "resident_models"
        ),
        ("--engine", "echo", "--model", "a", "--model", "b c"): "b c",
    }
    refused_at_start(redis_url, cases)


def test_what_a_killed_pool_worker_held_is_loaded_for_and_served_by_another(
    redis_url: str, queue: str, r: redis.Redis, start_worker: Callable[..., WorkerProcess]
) -> None:
    """A pool worker killed with requests of its model taken: no entry waits in that model's
    lane any more, but the entries the dead worker held count in the next worker's look, so it
    loads the model, takes them over and answers them with it. Nothing is lost."""
    keys = Keys(queue)
    dying = start_worker(
        queue, *POOL, "--resident-models", "1", "--echo-step-ms", "500", "--heartbeat-ttl-s", "2"
    )
    wait_until(lambda: r.hget(keys.worker("w0"), "resident") == b"alpha", timeout_s=60)
    client = Client.from_url(redis_url, queue)
    ids = client.submit_many(
        [{"prompt": f"a {i}", "model": "alpha"} for i in range(6)], max_new_tokens=50
    )
    wait_until(lambda: client.status(ids[0]).status == "running", timeout_s=30)
    dying.kill()
    start_worker(
        queue,
        "--engine",
        "echo",
        "--model",
        "beta",
        "--model",
        "alpha",
        "--resident-models",
        "1",
        "--min-resident-ms",
        "0",
        "--claim-idle-ms",
        "1000",
    )
    results = client.results(ids, timeout=90)
    assert [x.status for x in results] == ["succeeded"] * len(ids)
    assert {x.model for x in results} == {"alpha"} and {x.worker for x in results} == {"w1"}
    client.close()


def test_a_model_unloaded_when_idle_is_loaded_again_when_asked_for(
    redis_url: str, queue: str, r: redis.Redis, start_worker: Callable[..., WorkerProcess]
) -> None:
    """Nothing asked for the only resident model for --model-idle-s: it is unloaded, and the
    worker, holding nothing and reading no lane, still looks at its pool and loads the model a
    new request names."""
    start_worker(
        queue,
        *POOL,
        "--resident-models",
        "1",
        "--model-idle-s",
        "1",
        "--echo-load-ms",
        "50",
        "--read-block-ms",
        "500",
    )
    keys = Keys(queue)
    wait_until(lambda: r.hget(keys.worker("w0"), "resident") == b"", timeout_s=60)
    client = Client.from_url(redis_url, queue)
    result = client.generate("again", model="gamma", max_new_tokens=4, timeout=30)
    assert result.status == "succeeded" and result.model == "gamma"
    client.close()


def test_a_pool_worker_killed_mid_load_or_mid_swap_loses_nothing(
    redis_url: str, queue: str, r: redis.Redis, start_worker: Callable[..., WorkerProcess]
) -> None:
    """SIGKILL in the two moments a swap is fragile: while the worker drains the model it
    evicts (its requests running, the new model's waiting) and while it loads the new one (the
    fleet told it holds a model it has not loaded). Another pool worker takes everything over:
    each request succeeds, answered by the model it named."""
    keys = Keys(queue)
    client = Client.from_url(redis_url, queue)
    slow = ("--echo-step-ms", "200", "--heartbeat-ttl-s", "2", "--claim-idle-ms", "1000")
    swap = ("--resident-models", "1", "--min-resident-ms", "0", "--echo-load-ms", "3000")
    dying = start_worker(queue, *POOL, *slow, *swap)  # w0
    wait_until(lambda: r.hget(keys.worker("w0"), "resident") == b"alpha", timeout_s=60)
    running = client.submit_many(
        [{"prompt": f"a {i}", "model": "alpha"} for i in range(4)], max_new_tokens=20
    )
    wait_until(lambda: client.status(running[0]).status == "running", timeout_s=30)
    waiting = client.submit_many(
        [{"prompt": f"b {i}", "model": "beta", "priority": "high"} for i in range(4)],
        max_new_tokens=4,
    )
    time.sleep(0.6)  # (past the next look: the swap is decided, alpha's requests still run)
    assert client.status(running[0]).status == "running"
    dying.kill()  # mid-swap: draining alpha, beta's requests waiting for it
    again = start_worker(queue, *POOL, *slow, *swap)  # w1
    wait_until(lambda: r.hget(keys.worker("w1"), "loading") == b"beta", timeout_s=90)
    again.kill()  # mid-load: the fleet was told w1 holds beta
    start_worker(
        queue, *POOL, "--resident-models", "1", "--min-resident-ms", "0", "--claim-idle-ms", "1000"
    )  # w2
    results = client.results([*running, *waiting], timeout=120)
    assert [x.status for x in results] == ["succeeded"] * len(results)
    assert [x.model for x in results] == ["alpha"] * 4 + ["beta"] * 4
    client.close()
