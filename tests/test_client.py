"""The client library: fast tests on fakeredis, and the async twin on a real redis-server."""

from __future__ import annotations

import asyncio
import json
import math

import fakeredis
import pytest
from genq.common.errors import InvalidRequest, RequestNotFound, ResultTimeout
from genq.common.keys import Keys
from genq.common.models import MAX_PROMPT_CHARS, Result
from genq.common.wire import EVENT_DATA_FIELD, EVENT_TYPE_FIELD, FINAL_EVENT
from genq.producer import AsyncClient, Client
from genq.producer.building import build_request, prepare, prepare_many
from genq.producer.gateway.batch_lines import parse_line

from tests.conftest import ROOT


def final_event(result: Result) -> dict[str, str]:
    """The fields of the event that ends a request's event stream (the worker's APPLY script
    writes it; the documented wire format)."""
    return {EVENT_TYPE_FIELD: FINAL_EVENT, EVENT_DATA_FIELD: result.model_dump_json()}


@pytest.fixture()
def fake() -> fakeredis.FakeRedis:
    return fakeredis.FakeRedis()


@pytest.fixture()
def client(fake: fakeredis.FakeRedis) -> Client:
    return Client(fake, "q")


def test_submit_writes_a_documented_entry_and_a_queued_state(
    client: Client, fake: fakeredis.FakeRedis
) -> None:
    rid = client.submit("hello", max_new_tokens=7, priority="high")
    entries = fake.xrange(Keys("q").stream("high"))
    assert len(entries) == 1
    fields = entries[0][1]
    assert fields[b"id"].decode() == rid
    assert json.loads(fields[b"body"]) == {"prompt": "hello", "max_new_tokens": 7}
    assert client.status(rid).status == "queued"
    assert 0 < fake.ttl(Keys.result(rid)) <= client.result_ttl_s


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"prompt": ""}, "prompt"),
        ({"prompt": "x" * 300_000}, "prompt"),
        ({"prompt": "x", "max_new_tokens": 0}, "max_new_tokens"),
        ({"prompt": "x", "max_new_tokens": -3}, "max_new_tokens"),
        ({"prompt": "x", "max_new_tokens": 10**9}, "max_new_tokens"),
        ({"prompt": "x", "max_new_tokens": 2.5}, "max_new_tokens"),
        ({"prompt": "x", "temperature": math.nan}, "temperature"),
        ({"prompt": "x", "temperature": -1.0}, "temperature"),
        ({"prompt": "x", "top_p": 0.0}, "top_p"),
        ({"prompt": "x", "priority": "urgent"}, "priority"),
        ({"prompt": "x", "request_id": "has space"}, "id"),
        ({"prompt": 42}, "prompt"),
        ({"prompt": "x", "deadline_in_s": math.inf}, "deadline_in_s"),
    ],
)
def test_invalid_requests_raise_before_reaching_redis(
    client: Client, fake: fakeredis.FakeRedis, kwargs: dict[str, object], message: str
) -> None:
    prompt = kwargs.pop("prompt")
    with pytest.raises(InvalidRequest, match=message):
        client.submit(prompt, **kwargs)  # type: ignore[arg-type]
    assert fake.keys("*") == []


def test_submit_many_sends_nothing_if_any_is_invalid(
    client: Client, fake: fakeredis.FakeRedis
) -> None:
    with pytest.raises(InvalidRequest):
        client.submit_many(["ok", {"prompt": "bad", "max_new_tokens": 0}])
    assert fake.keys("*") == []


def test_submit_many_uses_per_item_overrides(client: Client, fake: fakeredis.FakeRedis) -> None:
    ids = client.submit_many(["a", {"prompt": "b", "priority": "low"}], max_new_tokens=3)
    assert len(ids) == 2
    assert fake.xlen(Keys("q").stream("normal")) == 1
    assert fake.xlen(Keys("q").stream("low")) == 1


SHARED_OPTIONS: list[dict[str, object]] = [
    {},
    {"max_new_tokens": 7, "priority": "high", "stop": ["\n", "END"], "seed": 3},
    {"temperature": 0.7, "top_p": 0.9, "top_k": 40, "metadata": {"user": "u1", "n": 2}},
    {"stream": True, "deadline_in_s": 60},
    {"model": "org/chat-8b", "prompt_cache_key": "k"},  # the model first: SUBMIT reads it there
]


@pytest.mark.parametrize("options", SHARED_OPTIONS)
def test_submit_many_fast_path_writes_what_build_request_would(options: dict[str, object]) -> None:
    prompts = ["plain", "ünïcode ✓", 'quotes " and \\ backslashes', "x" * MAX_PROMPT_CHARS]
    fast = prepare_many(prompts, options)
    for prepared, prompt in zip(fast, prompts, strict=True):
        slow = prepare(build_request(prompt, request_id=prepared.id, **options))  # type: ignore[arg-type]
        if "deadline_in_s" in options:  # relative to the entry's time: the same in both
            assert _deadline(prepared.body) == _deadline(slow.body)
        assert prepared == slow
    ids = [p.id for p in prepare_many(["a"] * 1000, {})]
    assert len(set(ids)) == 1000 and all(len(i) == 32 and int(i, 16) >= 0 for i in ids)


BATCH_BODIES: list[dict[str, object]] = [
    {"model": "echo", "prompt": "plain", "max_tokens": 2},
    {"prompt": ["ünïcode ✓ in a list"], "temperature": 0.5, "seed": 1, "stop": "\n"},
    {"model": "org/chat-8b", "prompt": 'quotes " \\', "prompt_cache_key": "k", "priority": "low"},
    {"prompt": "x" * MAX_PROMPT_CHARS, "response_format": {"type": "json_object"}},
    {"prompt": "p", "n": 3, "logprobs": 2, "deadline_in_s": 30},
]


@pytest.mark.parametrize("body", BATCH_BODIES)
def test_batch_lines_sharing_options_are_the_entries_each_would_be_alone(
    body: dict[str, object],
) -> None:
    """A batch reader prepares completion lines whose bodies differ only in their prompt on
    one validation of the rest (``PromptTemplate``); each entry equals the full path's,
    whatever the custom_id."""
    templates: dict[str, object] = {}
    for n, custom_id in enumerate(["a", 'ü ✓ "', "z" * 1024], start=1):
        text = json.dumps({"custom_id": custom_id, "url": "/v1/completions", "body": body})
        fast = parse_line(n, text, "batch_x", templates=templates)  # type: ignore[arg-type]
        slow = parse_line(n, text, "batch_x")
        if isinstance(body["prompt"], str):  # (a prompt in a list takes the full path)
            assert templates, "the fast path was not taken"
        if "deadline_in_s" in body:
            assert _deadline(fast.prepared.body) == _deadline(slow.prepared.body)
        assert fast == slow


@pytest.mark.parametrize(
    ("body", "custom_id", "message"),
    [
        ({"prompt": "", "max_tokens": 2}, "a", "prompt"),
        ({"prompt": "lone \ud800 surrogate"}, "a", "JSON"),
        ({"prompt": "ok", "max_tokens": 0}, "a", "max_new_tokens"),
        ({"prompt": "ok", "priority": "urgent"}, "a", "priority"),
        ({"prompt": "ok"}, "z" * 1025, "metadata"),
    ],
)
def test_batch_lines_fast_path_refuses_what_the_full_path_refuses(
    body: dict[str, object], custom_id: str, message: str
) -> None:
    text = json.dumps({"custom_id": custom_id, "url": "/v1/completions", "body": body})
    templates: dict[str, object] = {}
    for _ in range(2):  # the second time with the template (or its failure) kept
        with pytest.raises(InvalidRequest, match=message):
            parse_line(1, text, "batch_x", templates=templates)  # type: ignore[arg-type]


def _deadline(body: str) -> int:
    value: int = json.loads(body)["deadline_in_ms"]
    return value


@pytest.mark.parametrize(
    ("prompts", "options", "message"),
    [
        (["ok", ""], {}, "prompt"),
        (["ok", "x" * (MAX_PROMPT_CHARS + 1)], {}, "prompt"),
        (["ok", "lone \ud800 surrogate"], {}, "prompt"),
        (["ok"], {"max_new_tokens": 0}, "max_new_tokens"),
        (["ok"], {"priority": "urgent"}, "priority"),
        (["ok"], {"nonsense": 1}, "nonsense"),
    ],
)
def test_submit_many_fast_path_refuses_what_build_request_refuses(
    client: Client,
    fake: fakeredis.FakeRedis,
    prompts: list[str],
    options: dict[str, object],
    message: str,
) -> None:
    with pytest.raises((InvalidRequest, TypeError), match=message):
        client.submit_many(prompts, **options)
    assert fake.keys("*") == []


def test_status_of_unknown_id_raises_not_found(client: Client) -> None:
    with pytest.raises(RequestNotFound):
        client.status("nope")


def test_result_times_out_when_nobody_answers(client: Client) -> None:
    rid = client.submit("x")
    with pytest.raises(ResultTimeout):
        client.result(rid, timeout=0.05)


def test_result_returns_the_final_event(client: Client, fake: fakeredis.FakeRedis) -> None:
    rid = client.submit("x")
    final = Result(id=rid, status="succeeded", text="done")
    fake.xadd(Keys.events(rid), final_event(final))  # type: ignore[arg-type]
    assert client.result(rid, timeout=1).text == "done"


def test_result_reads_a_final_state_from_its_key(client: Client, fake: fakeredis.FakeRedis) -> None:
    rid = client.submit("x")
    fake.set(Keys.result(rid), Result(id=rid, status="failed").model_dump_json())
    assert client.result(rid).status == "failed"


def test_async_client_round_trip_on_real_redis(redis_url: str, queue: str) -> None:
    async def go() -> tuple[str, Result, Result]:
        async with AsyncClient.from_url(redis_url, queue) as c:
            rid = await c.submit("hello", max_new_tokens=4)
            queued = await c.status(rid)
            # Play the worker's part: write the final event.
            final = Result(id=rid, status="succeeded", text="hi")
            await c.redis.xadd(Keys.events(rid), final_event(final))  # type: ignore[arg-type]
            return rid, queued, await c.result(rid, timeout=5)

    rid, queued, res = asyncio.run(go())
    assert queued.status == "queued" and res.id == rid and res.text == "hi"


def test_async_stream_yields_pieces_then_the_result(redis_url: str, queue: str) -> None:
    from genq.common.wire import encode_delta_event

    async def go() -> list[str | Result]:
        async with AsyncClient.from_url(redis_url, queue) as c:
            rid = await c.submit("x", stream=True)
            events = Keys.events(rid)
            for piece in ("Hel", "lo"):
                await c.redis.xadd(events, encode_delta_event(piece))  # type: ignore[arg-type]
            final = Result(id=rid, status="succeeded", text="Hello!")
            await c.redis.xadd(events, final_event(final))  # type: ignore[arg-type]
            return [item async for item in c.stream(rid, timeout=5)]

    items = asyncio.run(go())
    # The final text's tail that no delta carried ("!") comes as a last piece.
    assert items[:-1] == ["Hel", "lo", "!"]
    assert isinstance(items[-1], Result) and items[-1].text == "Hello!"


def test_stream_times_out_when_nothing_comes(client: Client) -> None:
    rid = client.submit("x", stream=True)
    with pytest.raises(ResultTimeout):
        list(client.stream(rid, timeout=0.05))


def test_the_command_packer_packs_what_redis_py_packs() -> None:
    from genq.common.connection import CommandPacker
    from redis.connection import HiredisRespSerializer
    from redis.exceptions import DataError

    ours, theirs = CommandPacker(), HiredisRespSerializer()
    for args in [
        ("EVAL", "return 1", 2, "k1", "k2", b"bytes", 3.5, "ünï"),
        ("CONFIG GET", "maxmemory"),  # two words in the first argument
        (b"SET", bytearray(b"k"), memoryview(b"v")),  # what hiredis refuses: redis-py converts
    ]:
        assert b"".join(ours.pack(*args)) == b"".join(theirs.pack(*args))
    with pytest.raises(DataError):
        ours.pack("SET", "k", {"not": "a value"})


def test_no_blocking_read_outlasts_redis_pys_default_socket_timeout() -> None:
    """redis-py 8 gives every client a 5 s socket timeout: a read that blocks as long as that
    ends in TimeoutError (seen: waiting on a long batch, each retry timed out too)."""
    import redis
    from genq.common.connection import MAX_BLOCK_MS, connect
    from genq.producer.waiting import Waiter

    for r in (redis.Redis(), connect("redis://127.0.0.1:1/0")):
        socket_timeout_s = r.connection_pool.connection_kwargs.get("socket_timeout")
        assert socket_timeout_s is None or socket_timeout_s / 2 >= MAX_BLOCK_MS / 1000
    read = Waiter(Keys("q"), ["a"], None).next_read()
    assert read is not None and read[2] == MAX_BLOCK_MS


def test_the_sync_client_is_written_from_the_async_one() -> None:
    """One source for the two clients: ``producer/client.py`` is what ``scripts/unasync.py``
    writes from ``producer/aio.py`` (edit aio.py, run the script)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("unasync", ROOT / "scripts" / "unasync.py")
    assert spec is not None and spec.loader is not None
    unasync = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(unasync)
    written = unasync.sync_source((ROOT / "producer" / "aio.py").read_text())
    assert written == (ROOT / "producer" / "client.py").read_text(), "run scripts/unasync.py"


@pytest.mark.parametrize("where", ["result keys", "final events"])
def test_results_decode_a_round_with_the_collector_paused(where: str) -> None:
    """``Client.results`` keeps every result it decodes, so each collector pass while it
    decoded walked all the results before it for nothing (half the client's CPU in
    ``benchmarks/queue_speed.py``): the reads it decodes (the stored states, the others'
    events after the blocking read) run with the collector paused, a pass at most after
    each. Both ways a result comes: its key, or (key gone, as for a request whose state
    expired first) its final event."""
    import gc

    from genq.common import states

    r = fakeredis.FakeRedis()
    client = Client(r, "q")
    keys, n = Keys("q"), 3000
    ids = [f"req-{i}" for i in range(n)]
    times = {"queued_ms": 1, "started_ms": 2, "finished_ms": 3, "generation_ms": 1}
    usage = {"prompt_tokens": 1, "completion_tokens": 1, "batch_size": 1}
    for i in ids:
        state = states.succeeded(
            request_id=i,
            priority="normal",
            tenant="default",
            metadata={"i": i},
            text="t",
            finish_reason="length",
            worker="w",
            model="m",
            **times,
            **usage,
        )
        if where == "result keys":
            r.set(keys.result(i), state)
        else:
            r.xadd(keys.events(i), {EVENT_TYPE_FIELD: FINAL_EVENT, EVENT_DATA_FIELD: state})
    passes = []
    gc.callbacks.append(lambda phase, info: passes.append(1) if phase == "start" else None)
    try:
        got = client.results(ids, timeout=10)
    finally:
        gc.callbacks.pop()
    assert [g.id for g in got] == ids and all(g.status == "succeeded" for g in got)
    rounds = 1 if where == "result keys" else math.ceil(n / 500) + 1
    assert gc.isenabled()
    assert len(passes) <= 2 * rounds, f"{len(passes)} collector passes for {rounds} rounds"


def test_a_paused_collector_comes_back_as_it_was() -> None:
    """``collector.paused`` turns the collector off inside and back on after, even when the
    body raises; a collector that was off stays off (the host program's choice)."""
    import gc

    from genq.common import collector

    assert gc.isenabled()
    with pytest.raises(KeyError), collector.paused():
        assert not gc.isenabled()
        raise KeyError
    assert gc.isenabled()
    gc.disable()
    try:
        with collector.paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()
