"""Many models on one queue: every request names its model (or none: the queue's
default), and only workers serving that name take it. Each model's requests wait in their own
lane (``Keys.lane``), so a worker never scans another model's backlog and never answers with
the wrong model, whoever is alive."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import redis
from genq.common.errors import InvalidRequest
from genq.common.keys import DEFAULT_MODEL_FIELD, Keys
from genq.producer import Client

from tests.conftest import WorkerProcess, genq, genq_stats, submit_keys, wait_until

pytestmark = pytest.mark.slow


def serving(r: redis.Redis, queue: str, consumers: list[str]) -> None:
    keys = Keys(queue)
    wait_until(lambda: all(r.exists(keys.worker(c)) for c in consumers), timeout_s=60)


def echo(name: str, *more: str) -> tuple[str, ...]:
    return ("--engine", "echo", "--served-model-name", name, *more)


def test_each_request_is_answered_by_its_model_and_one_without_by_the_default(
    redis_url: str, queue: str, r: redis.Redis, start_worker: Callable[..., WorkerProcess]
) -> None:
    start_worker(queue, *echo("alpha"))
    serving(r, queue, ["w0"])  # the first worker's model becomes the queue's default
    start_worker(queue, *echo("org/beta:8b"))
    serving(r, queue, ["w0", "w1"])
    assert r.hget(Keys(queue).config, DEFAULT_MODEL_FIELD) == b"alpha"
    client = Client.from_url(redis_url, queue)
    named = [{"prompt": f"p{i}", "model": ("alpha", "org/beta:8b")[i % 2]} for i in range(40)]
    ids = client.submit_many([*named, "nameless 1", "nameless 2"], max_new_tokens=4)
    results = client.results(ids, timeout=60)
    assert [x.status for x in results] == ["succeeded"] * 42
    assert [(x.model, x.worker) for x in results[:40]] == [
        ("alpha", "w0"),
        ("org/beta:8b", "w1"),
    ] * 20
    assert [(x.model, x.worker) for x in results[40:]] == [("alpha", "w0")] * 2
    rows = {m["model"]: m for m in genq_stats(redis_url, queue)["models"]}
    assert rows[None]["served_by"] == "alpha" and rows["alpha"]["default"]
    assert rows["org/beta:8b"]["workers"] == 1 and not rows["org/beta:8b"]["default"]


def test_a_model_nobody_serves_waits_shows_in_stats_and_runs_when_its_worker_starts(
    redis_url: str, queue: str, r: redis.Redis, start_worker: Callable[..., WorkerProcess]
) -> None:
    start_worker(queue, *echo("alpha"))
    serving(r, queue, ["w0"])
    client = Client.from_url(redis_url, queue)
    ids = client.submit_many(["later"] * 3, model="gamma", max_new_tokens=3)
    wait_until(lambda: r.llen(Keys(queue).lane("gamma").waiting) == 3)
    rows = {m["model"]: m for m in genq_stats(redis_url, queue)["models"]}
    assert rows["gamma"]["waiting"] == 3 and rows["gamma"]["no_live_worker"]
    listed = genq("models", "list", "--redis-url", redis_url, "--queue", queue)
    assert "waiting for a model with no live worker" in listed.stdout, listed.stderr
    assert client.status(ids[0]).status == "queued"  # alpha's worker never took it
    start_worker(queue, *echo("gamma"))
    results = client.results(ids, timeout=60)
    assert {(x.status, x.model, x.worker) for x in results} == {("succeeded", "gamma", "w1")}


def test_a_killed_workers_requests_go_to_a_worker_of_its_model_never_another(
    redis_url: str, queue: str, r: redis.Redis, start_worker: Callable[..., WorkerProcess]
) -> None:
    fast = ("--echo-step-ms", "20", "--max-batch-size", "4", "--claim-idle-ms", "1500")
    doomed = start_worker(queue, *echo("alpha", *fast))
    start_worker(queue, *echo("alpha", *fast))
    start_worker(queue, *echo("beta", *fast))
    serving(r, queue, ["w0", "w1", "w2"])
    client = Client.from_url(redis_url, queue)
    items = [{"prompt": f"q{i}", "model": ("alpha", "beta")[i % 2]} for i in range(48)]
    ids = client.submit_many(items, max_new_tokens=10)  # 0.2 s a batch
    wait_until(lambda: client.status(ids[0]).status != "queued", timeout_s=30)
    doomed.kill()  # kill -9: its claimed requests are taken over after --claim-idle-ms
    results = client.results(ids, timeout=90)
    assert [x.status for x in results] == ["succeeded"] * 48
    assert {(x.model, x.worker) for x in results[0::2]} <= {("alpha", "w0"), ("alpha", "w1")}
    assert {(x.model, x.worker) for x in results[1::2]} == {("beta", "w2")}


def test_an_entry_in_the_wrong_lane_fails_instead_of_running_on_the_wrong_model(
    redis_url: str, queue: str, r: redis.Redis, start_worker: Callable[..., WorkerProcess]
) -> None:
    start_worker(queue, *echo("alpha"))
    serving(r, queue, ["w0"])
    # A plain XADD (no script) of a request naming beta into the stream alpha's worker reads
    # (alpha is the queue's default: its requests wait in the unnamed lane).
    r.xadd(Keys(queue).stream("normal"), {"id": "stray", "body": '{"model":"beta","prompt":"x"}'})
    client = Client.from_url(redis_url, queue)
    result = client.result("stray", timeout=30)
    assert result.status == "failed" and result.error and result.error.code == "model_not_served"


def test_genq_submit_from_any_language_puts_a_named_model_in_its_lane(
    redis_url: str, queue: str, r: redis.Redis, start_worker: Callable[..., WorkerProcess]
) -> None:
    from genq.common import functions

    functions.load(r)
    keys = Keys(queue)
    body = '{"prompt": "hi", "model": "beta", "max_new_tokens": 3}'
    r.fcall("genq_submit", 5, *submit_keys(keys, ["fx"]), 3600, "fx", "normal", body, "")
    assert r.xlen(keys.lane("beta").stream("normal")) == 1 and r.xlen(keys.stream("normal")) == 0
    assert r.smembers(keys.models) == {b"beta"}
    bad = '{"prompt": "hi", "model": "no spaces"}'
    with pytest.raises(redis.ResponseError, match=r"GENQ_INVALID.*model"):
        r.fcall("genq_submit", 5, *submit_keys(keys, ["fy"]), 3600, "fy", "normal", bad, "")
    start_worker(queue, *echo("beta"))
    result = Client.from_url(redis_url, queue).result("fx", timeout=30)
    assert (result.status, result.model) == ("succeeded", "beta")


def test_the_client_refuses_a_model_name_that_cannot_be_one(redis_url: str, queue: str) -> None:
    client = Client.from_url(redis_url, queue)
    for bad in ("", "two words", "x" * 129, "a{b}"):
        with pytest.raises(InvalidRequest, match="model"):
            client.submit("hi", model=bad)


def test_a_worker_whose_model_name_cannot_be_served_says_so_in_one_line(
    redis_url: str, queue: str
) -> None:
    where = ("--redis-url", redis_url, "--queue", queue)
    done = genq("worker", *where, "--engine", "echo", "--served-model-name", "two words")
    assert done.returncode != 0 and "model" in done.stderr and "Traceback" not in done.stderr


def test_one_gateway_lists_every_model_and_routes_each_request_to_its_own(
    openai_client: Any, queue: str, r: redis.Redis, start_worker: Callable[..., WorkerProcess]
) -> None:
    import openai

    start_worker(queue, *echo("alpha"))
    start_worker(queue, *echo("beta"))
    wanted = ["alpha", "beta"]
    wait_until(lambda: sorted(m.id for m in openai_client.models.list()) == wanted, 60)
    for model in ("alpha", "beta", "alpha"):
        chat = openai_client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=3
        )
        assert chat.model == model
    with pytest.raises(openai.NotFoundError):
        openai_client.completions.create(model="gamma", prompt="hi", max_tokens=3)
