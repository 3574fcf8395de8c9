"""genq's Redis Functions (FCALL genq_submit, genq_cancel) as a client in another language would
call them, and plain XADDs of an id already in use: against a real redis-server and worker."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest
import redis
from genq.common import functions, states
from genq.common.keys import Keys
from genq.common.models import Result
from genq.producer import Client
from genq.worker.devtools.redis_server import RedisServer

from tests.conftest import WorkerProcess, cancel_keys, submit_keys, wait_until

REPO = Path(__file__).resolve().parent.parent


def fcall_submit(
    r: redis.Redis, queue: str, request_id: str, body: dict | str, priority: str = "normal"
) -> object:
    keys = Keys(queue)
    script_keys = submit_keys(keys, [request_id])
    text = body if isinstance(body, str) else json.dumps(body)
    return r.execute_command(
        "FCALL", "genq_submit", len(script_keys), *script_keys, 3600, request_id, priority, text, ""
    )


def fcall_cancel(r: redis.Redis, request_id: str) -> object:
    return r.execute_command("FCALL", "genq_cancel", 3, *cancel_keys(request_id))


@pytest.fixture()
def loaded(r: redis.Redis) -> redis.Redis:
    functions.load(r)
    return r


def test_submit_gives_the_python_clients_queued_state_and_one_request_per_id(
    loaded: redis.Redis, queue: str, redis_url: str
) -> None:
    meta = {"user": "u1", "n": 3}
    rid = f"{queue}-f1"
    [entry] = fcall_submit(loaded, queue, rid, {"prompt": "hi", "metadata": meta}, "high")
    assert isinstance(entry, bytes) and b"-" in entry  # the new entry's id
    raw = loaded.get(Keys.result(rid))
    expected = states.queued(request_id=rid, priority="high", metadata=meta)
    owned = states.with_entry(expected, f"high/{entry.decode()}")
    assert orjson.loads(raw) == orjson.loads(owned)  # (Lua may order metadata keys otherwise)
    assert raw.startswith(f'{{"id":"{rid}","status":"queued","entry":"high/'.encode())
    assert states.status_of(raw) == "queued"
    with Client.from_url(redis_url, queue) as client:
        assert client.status(rid).status == "queued"
    # The same id again: not enqueued, nothing replaced.
    assert fcall_submit(loaded, queue, rid, {"prompt": "other"}) == [0]
    assert loaded.xlen(Keys(queue).stream("high")) == 1
    assert loaded.xlen(Keys(queue).stream("normal")) == 0
    assert loaded.get(Keys.result(rid)) == raw


def test_submit_enforces_the_queues_depth_limit(loaded: redis.Redis, queue: str) -> None:
    loaded.hset(Keys(queue).config, "max_queue_depth", 5)
    answers = []
    for i in range(20):
        try:
            answers.append(fcall_submit(loaded, queue, f"{queue}-d{i}", {"prompt": "x"}))
        except redis.ResponseError as err:
            answers.append(str(err))
    assert sum(isinstance(a, list) for a in answers) == 5
    assert all(a.startswith("GENQ_QUEUE_FULL 5 5") for a in answers[5:])  # type: ignore[union-attr]
    assert sum(loaded.xlen(s) for s in Keys(queue).streams()) == 5


@pytest.mark.parametrize(
    ("request_id", "priority", "body", "says"),
    [
        ("bad id!", "normal", '{"prompt": "x"}', "the id must be"),
        ("ok", "urgent", '{"prompt": "x"}', "priority must be"),
        ("ok", "normal", "not json", "the body must be a JSON object"),
        ("ok", "normal", "[1, 2]", "the body must be a JSON object"),
    ],
)
def test_submit_refuses_bad_input_with_a_reason_and_enqueues_nothing(
    loaded: redis.Redis, queue: str, request_id: str, priority: str, body: str, says: str
) -> None:
    with pytest.raises(redis.ResponseError, match=f"GENQ_INVALID request 1: {says}"):
        fcall_submit(loaded, queue, request_id, body, priority)
    assert sum(loaded.xlen(s) for s in Keys(queue).streams()) == 0
    assert loaded.get(Keys.result(request_id)) is None


def test_submit_with_wrong_arguments_says_what_it_expects(loaded: redis.Redis, queue: str) -> None:
    with pytest.raises(redis.ResponseError, match="GENQ_INVALID expected KEYS config"):
        loaded.execute_command("FCALL", "genq_submit", 1, Keys(queue).config, 60, "a")
    keys = submit_keys(Keys(queue), ["a", "b"])  # two keys, one request's arguments
    with pytest.raises(redis.ResponseError, match="GENQ_INVALID expected KEYS config"):
        loaded.execute_command("FCALL", "genq_submit", len(keys), *keys, 60, "a", "low", "{}", "")


def test_cancel_writes_the_same_state_as_the_python_client(
    loaded: redis.Redis, queue: str, redis_url: str
) -> None:
    c1, c2 = f"{queue}-c1", f"{queue}-c2"
    fcall_submit(loaded, queue, c1, {"prompt": "a", "metadata": {"k": "v"}})
    fcall_submit(loaded, queue, c2, {"prompt": "b", "metadata": {"k": "v"}})
    assert fcall_cancel(loaded, c1) == 1
    with Client.from_url(redis_url, queue) as client:
        assert client.cancel(c2) is True
        by_lua, by_python = client.result(c1, timeout=5), client.result(c2, timeout=5)
    assert by_lua.status == "cancelled" and by_lua.error is not None
    assert by_lua.timings.finished_unix_ms is not None
    a = by_lua.model_dump(exclude={"id", "timings"})
    b = by_python.model_dump(exclude={"id", "timings"})
    assert a == b
    assert fcall_cancel(loaded, c1) == 0  # final already
    assert fcall_cancel(loaded, "never-submitted") == -1


def test_the_library_survives_a_redis_restart_with_its_data() -> None:
    server = RedisServer(["--appendonly", "yes"]).start()
    try:
        with redis.Redis.from_url(server.url) as r:
            functions.load(r)
        server.stop(remove_dir=False)
        server.start()
        with redis.Redis.from_url(server.url) as r:
            assert r.execute_command("FCALL", "genq_version", 0) == functions.VERSION
    finally:
        server.stop()


def test_submitted_requests_run_and_a_second_plain_xadd_of_the_id_changes_nothing(
    loaded: redis.Redis, queue: str, redis_url: str, start_worker: Callable[..., WorkerProcess]
) -> None:
    keys = Keys(queue)
    x1, x2 = f"{queue}-x1", f"{queue}-x2"
    fcall_submit(loaded, queue, x1, {"prompt": "the first", "max_new_tokens": 20}, "low")
    # Another app XADDs the same id at a higher priority (read first) with another prompt.
    loaded.xadd(keys.stream("high"), {"id": x1, "body": '{"prompt": "the second"}'})
    # A plain XADD twice with a new id: the first entry is the request.
    loaded.xadd(keys.stream("normal"), {"id": x2, "body": '{"prompt": "one", "max_new_tokens": 9}'})
    loaded.xadd(keys.stream("normal"), {"id": x2, "body": '{"prompt": "two", "max_new_tokens": 9}'})
    # A broken duplicate must not fail the request either.
    loaded.xadd(keys.stream("high"), {"id": x1, "body": "{broken"})
    start_worker(queue, "--engine", "echo")
    with Client.from_url(redis_url, queue) as client:
        first, second = client.results([x1, x2], timeout=30)
    assert (first.status, first.text) == ("succeeded", "the first")
    assert (second.status, second.text) == ("succeeded", "one")
    wait_until(lambda: sum(loaded.xlen(s) for s in keys.streams()) == 0, timeout_s=10)
    events = loaded.xrange(keys.events(x1))
    assert len(events) == 1  # one final event, never a second
    wait_until(lambda: loaded.hget(keys.worker("w0"), "duplicates") == b"3", timeout_s=10)


def test_node_redis_client_submits_streams_and_cancels(
    loaded: redis.Redis,
    queue: str,
    redis_url: str,
    start_worker: Callable[..., WorkerProcess],
) -> None:
    node_modules = REPO / "tests" / "node" / "node_modules"
    if not (node_modules / "redis").exists():
        pytest.skip("node-redis not installed: npm ci --prefix tests/node (.ci/run does)")
    start_worker(queue, "--engine", "echo", "--max-queue-depth", "50")
    out = subprocess.run(
        ["node", str(REPO / "tests" / "node" / "functions.mjs"), redis_url, queue],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["submitted"] == "string" and report["duplicate"] == 0
    assert Result.model_validate_json(report["result"]).text == "hello from node"
    assert report["streamed"] == "hello from node"
    assert report["cancelled"] == 1 and report["cancelled_status"] == "cancelled"
    assert report["queue_full"].startswith("GENQ_QUEUE_FULL")
