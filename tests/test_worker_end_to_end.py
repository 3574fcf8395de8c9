"""End to end on a real redis-server: client -> streams -> `genq worker` process -> results."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable

import pytest
import redis
from genq.common.keys import GROUP, Keys
from genq.common.models import Result
from genq.producer import Client
from genq.worker.engines.base import GenerationInput
from genq.worker.engines.builtin_models import tiny_model_dir
from genq.worker.engines.static import StaticEngine

from tests.conftest import WorkerProcess, wait_until

pytestmark = pytest.mark.slow


def mixed_requests(n: int, prefix: str) -> list[dict[str, object]]:
    base = "genq keeps a queue of prompts and serves them in batches "
    return [
        {
            "prompt": (base * (1 + i % 7))[: 5 + (i * 37) % 300],
            "max_new_tokens": 4 + (i * 13) % 40,
            "priority": ("high", "normal", "low")[i % 3],
            "request_id": f"{prefix}-{i}",  # unique per test: results outlive tests
            "metadata": {"i": i},
        }
        for i in range(n)
    ]


@pytest.mark.parametrize("engine_name", ["static", "continuous"])
def test_mixed_priority_prompts_all_succeed_and_equal_single_generation(
    redis_url: str,
    queue: str,
    r: redis.Redis,
    start_worker: Callable[..., WorkerProcess],
    engine_name: str,
) -> None:
    specs = mixed_requests(36, prefix=queue)
    client = Client.from_url(redis_url, queue)
    ids = client.submit_many(specs)
    # A model directory, as a user would pass one (the tiny model's cache directory).
    worker = start_worker(
        queue,
        "--model",
        str(tiny_model_dir()),
        "--max-batch-size",
        "8",
        "--max-batch-tokens",
        "2048",
    )
    results = client.results(ids, timeout=240)
    assert [res.status for res in results] == ["succeeded"] * len(ids), worker.log()
    assert [res.metadata["i"] for res in results] == list(range(len(ids)))
    assert all(res.worker == "w0" and res.batch_size for res in results)
    assert max(res.batch_size or 0 for res in results) > 1  # it really batched

    # Through the queue, each output equals that prompt generated alone, in-process.
    engine = StaticEngine.load("tiny")
    for spec, res in zip(specs, results, strict=True):
        (prompt_ids,) = engine.tokenize([str(spec["prompt"])])
        row = GenerationInput(
            prompt_ids=prompt_ids, max_new_tokens=int(str(spec["max_new_tokens"]))
        )
        alone = engine.generate([row]).outputs[0]
        assert (res.text, res.usage.completion_tokens, res.finish_reason) == (
            alone.text,
            alone.completion_tokens,
            alone.finish_reason,
        )
        assert res.usage.prompt_tokens == len(prompt_ids)

    # The streams and the consumer group are there for redis-cli, and nothing is left pending.
    keys = Keys(queue)
    for stream in keys.streams():
        groups = r.xinfo_groups(stream)
        assert [g["name"] for g in groups] == [GROUP.encode()]
        assert groups[0]["pending"] == 0
        assert r.xlen(stream) == 0  # acknowledged entries are deleted
    assert worker.stop() == 0
    assert "stopped: succeeded=36" in worker.log()


def test_bad_entries_fail_clearly_and_harm_nothing_else(
    redis_url: str, queue: str, r: redis.Redis, start_worker: Callable[..., WorkerProcess]
) -> None:
    keys = Keys(queue)
    client = Client.from_url(redis_url, queue)
    good = client.submit("a fine prompt", max_new_tokens=5)
    stream = keys.stream("normal")
    r.xadd(stream, {"id": "bad-json", "body": "{not json"})
    r.xadd(stream, {"id": "bad-field", "body": json.dumps({"prompt": "x", "max_new_tokens": -1})})
    r.xadd(
        stream, {"id": "too-long", "body": json.dumps({"prompt": "y" * 5000, "max_new_tokens": 4})}
    )
    r.xadd(stream, {"id": "too-many", "body": json.dumps({"prompt": "z", "max_new_tokens": 2000})})
    r.xadd(stream, {"id": "late", "body": json.dumps({"prompt": "z", "deadline_unix_ms": 1})})
    r.xadd(stream, {"no_id_here": "garbage"})
    r.xadd(stream, {"id": b"\xff\xfe", "body": b"\xff"})
    start_worker(queue, "--model", "tiny", "--max-new-tokens-limit", "256")
    results = {
        res.id: res
        for res in client.results(
            [good, "bad-json", "bad-field", "too-long", "too-many", "late"], timeout=120
        )
    }
    assert results[good].status == "succeeded"
    assert results["bad-json"].status == "failed"
    assert (
        results["bad-json"].error is not None
        and "invalid request body" in results["bad-json"].error.message
    )
    assert (
        results["bad-field"].error is not None
        and "max_new_tokens" in results["bad-field"].error.message
    )
    too_long = results["too-long"].error
    assert (
        too_long is not None and too_long.code == "prompt_too_long" and "1024" in too_long.message
    )
    too_many = results["too-many"].error
    assert (
        too_many is not None
        and too_many.code == "max_new_tokens_too_large"
        and "256" in too_many.message
    )
    assert results["late"].status == "expired"
    wait_until(lambda: r.xlen(keys.dead_letter) == 2)
    dead = r.xrange(keys.dead_letter)
    assert all(b"error" in fields for _, fields in dead)
    wait_until(lambda: r.xinfo_groups(stream)[0]["pending"] == 0)


def test_cli_submit_and_stats(
    redis_url: str, queue: str, start_worker: Callable[..., WorkerProcess]
) -> None:
    start_worker(queue, "--engine", "echo")
    genq = [sys.executable, "-m", "genq.worker"]
    where = ["--redis-url", redis_url, "--queue", queue]
    out = subprocess.run(
        [*genq, "submit", *where, "hello from the cli", "--max-new-tokens", "5", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    res = Result.model_validate_json(out.stdout)
    assert res.status == "succeeded" and res.text == "hello"
    stats = subprocess.run(
        [*genq, "stats", "--redis-url", redis_url, "--queue", queue, "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    snap = json.loads(stats.stdout)
    assert set(snap["streams"]) == {"high", "normal", "low"}
    assert snap["streams"]["normal"]["pending"] == 0
    assert [w["consumer"] for w in snap["workers"]] == ["w0"] and snap["workers"][0]["alive"]


def test_worker_refuses_unknown_settings(redis_url: str, queue: str) -> None:
    env = {**os.environ, "GENQ_MAX_BATCH_TOKEN": "5"}
    out = subprocess.run(
        [sys.executable, "-m", "genq.worker", "worker", "--redis-url", redis_url],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert out.returncode != 0 and "GENQ_MAX_BATCH_TOKEN" in out.stderr


def test_sigterm_finishes_held_work_and_exits_zero(
    redis_url: str, queue: str, start_worker: Callable[..., WorkerProcess]
) -> None:
    client = Client.from_url(redis_url, queue)
    worker = start_worker(queue, "--engine", "echo")
    ids = client.submit_many([f"p{i}" for i in range(50)])
    client.results(ids, timeout=60)
    assert worker.stop() == 0
    assert "stopped: succeeded=50" in worker.log()


@pytest.mark.parametrize("engine_name", ["static", "continuous"])
def test_streaming_sends_text_as_it_is_generated(
    redis_url: str, queue: str, start_worker: Callable[..., WorkerProcess], engine_name: str
) -> None:
    client = Client.from_url(redis_url, queue)
    start_worker(queue, "--model", "tiny", "--engine", engine_name)
    streamed = client.submit("stream me some text", max_new_tokens=40, stream=True)
    plain = client.submit("stream me some text", max_new_tokens=40)
    items = list(client.stream(streamed, timeout=120))
    final = items[-1]
    pieces = items[:-1]
    assert isinstance(final, Result) and final.status == "succeeded"
    assert all(isinstance(p, str) for p in pieces)
    assert len(pieces) >= 5  # really incremental, not one piece at the end
    assert "".join(str(p) for p in pieces) == final.text
    # Streaming changes nothing about the output.
    assert client.result(plain, timeout=120).text == final.text
    # A request submitted without stream=True streams as one piece plus its result.
    items_plain = list(client.stream(plain, timeout=10))
    assert (
        items_plain[-1] == client.result(plain)
        and "".join(map(str, items_plain[:-1])) == final.text
    )


def test_a_client_that_waits_for_each_answer_is_not_made_to_wait_the_fill_window(
    redis_url: str, queue: str, start_worker: Callable[..., WorkerProcess]
) -> None:
    """One request after another, each sent when the last is answered: every gap looks like
    "one is coming within the window", but no one ever comes while a batch waits. The worker
    learns that from its waits and starts each request at once (``policy/arrivals.py``)."""
    import statistics

    start_worker(queue, "--engine", "echo", "--max-wait-ms", "200")
    client = Client.from_url(redis_url, queue)
    waits = []
    for i in range(40):
        rid = client.submit(f"one at a time {i}", max_new_tokens=4)
        waits.append(client.result(rid, timeout=30).timings.queue_wait_ms or 0)
    # A few waits while it learns; then (one retry a second at most) the window is not waited.
    assert sum(w >= 150 for w in waits) <= 6, waits
    assert statistics.median(waits[10:]) < 50, waits


def test_a_worker_that_drained_has_its_last_results_counted_when_they_are_read(
    redis_url: str, queue: str, r: redis.Redis, start_worker: Callable[..., WorkerProcess]
) -> None:
    # A busy worker rebuilds its stats hash at most once a heartbeat (1 s); one that holds
    # nothing more sends it with its last results, so whoever reads both sees them counted.
    start_worker(queue, "--engine", "echo")
    client = Client.from_url(redis_url, queue)
    key = Keys(queue).worker("w0")
    for n in (1, 40):
        before = int(r.hget(key, "succeeded") or 0) if r.exists(key) else 0
        results = client.results(client.submit_many([f"p{j}" for j in range(n)]), timeout=60)
        assert [x.status for x in results] == ["succeeded"] * n
        counted = before + n
        wait_until(lambda c=counted: int(r.hget(key, "succeeded") or 0) == c, timeout_s=0.3)


def test_a_worker_process_settles_its_collector_once_built() -> None:
    """``genq worker`` freezes what start-up made and raises the young generation's threshold
    (``common/collector.py``): start-up's objects leave the collector's passes."""
    code = (
        "import gc\n"
        "from genq.common.collector import YOUNG_THRESHOLD, settle_collector\n"
        "before = gc.get_threshold()\n"
        "settle_collector()\n"
        "after = gc.get_threshold()\n"
        "print(gc.get_freeze_count(), after[0] == YOUNG_THRESHOLD, after[1:] == before[1:])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    frozen, young, older = out.stdout.split()
    assert int(frozen) > 1_000, out.stdout  # the imports' objects
    assert (young, older) == ("True", "True")
