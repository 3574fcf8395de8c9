"""Scripts by their hash (``common/script_calls.py``), against a real redis-server: EVALSHA
on the path, the source sent only for a call Redis lacked, and nothing else of its pipeline
repeated."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import redis.asyncio as aioredis
from genq.common import script_calls
from genq.producer import AsyncClient, Client
from genq.worker.devtools.redis_server import RedisServer

from tests.conftest import WorkerProcess, workers_on

COUNT = "return redis.call('INCR', KEYS[1])"


@pytest.fixture(scope="module")
def own() -> Iterator[RedisServer]:
    """A redis-server of this module's own: its script cache is flushed and its command
    counts read, which nothing else may disturb."""
    with RedisServer() as server:
        yield server


@pytest.fixture()
def r(own: RedisServer) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(own.url)
    client.flushall()
    client.script_flush()
    client.config_resetstat()
    yield client
    client.close()


def test_a_script_redis_lacks_is_sent_again_alone_and_the_rest_is_not_repeated(
    r: redis.Redis,
) -> None:
    pipe = r.pipeline(transaction=False)
    pipe.incr("before")
    script_calls.add(pipe, COUNT, 1, "counted")
    pipe.incr("after")
    script_calls.add(pipe, COUNT, 1, "counted")
    assert script_calls.execute(pipe) == [1, 1, 1, 2]
    assert [r.get(k) for k in ("before", "after", "counted")] == [b"1", b"1", b"2"]
    # Cached now: by hash alone, no source sent.
    pipe = r.pipeline(transaction=False)
    script_calls.add(pipe, COUNT, 1, "counted")
    assert script_calls.execute(pipe) == [3]
    assert script_calls.call(r, COUNT, 1, "counted") == 4
    r.script_flush()
    assert script_calls.call(r, COUNT, 1, "counted") == 5  # alone: EVALSHA, then EVAL once
    stats = r.info("commandstats")
    # The pipeline's two NOSCRIPTs sent again once: the first by source, the second by hash
    # behind it; the lone call's by source.
    assert stats["cmdstat_eval"]["calls"] == 2
    assert stats["cmdstat_evalsha"]["calls"] == 6


def test_errors_still_raise_after_every_command_ran(r: redis.Redis) -> None:
    pipe = r.pipeline(transaction=False)
    script_calls.add(pipe, "return redis.error_reply('no')", 0)
    pipe.incr("ran")
    with pytest.raises(redis.ResponseError, match="no"):
        script_calls.execute(pipe)
    assert r.get("ran") == b"1"
    pipe = r.pipeline(transaction=False)
    script_calls.add(pipe, "return redis.error_reply('no')", 0)
    replies = script_calls.execute(pipe, raise_on_error=False)
    assert isinstance(replies[0], redis.ResponseError)


def test_the_asyncio_client_calls_by_hash_too(own: RedisServer, r: redis.Redis) -> None:
    async def go() -> list[int]:
        a = aioredis.Redis.from_url(own.url)
        pipe = a.pipeline(transaction=False)
        script_calls.add(pipe, COUNT, 1, "a")
        pipe.incr("b")
        out = await script_calls.execute_async(pipe)
        out.append(await script_calls.call_async(a, COUNT, 1, "a"))
        await a.aclose()
        return out

    assert asyncio.run(go()) == [1, 1, 2]


def test_a_flushed_script_cache_mid_work_loses_and_repeats_nothing(
    own: RedisServer, r: redis.Redis, tmp_path: Path
) -> None:
    queue = "by-hash"
    with workers_on(own.url, tmp_path) as start:
        worker = start(queue, "--engine", "echo")
        _flushed_mid_work(own, r, queue, worker)


def _flushed_mid_work(own: RedisServer, r: redis.Redis, queue: str, worker: WorkerProcess) -> None:
    client = Client.from_url(own.url, queue)
    first = client.results(client.submit_many([f"warm {i}" for i in range(5)]), timeout=60)
    assert all(x.status == "succeeded" for x in first)
    r.config_resetstat()
    ids = client.submit_many([f"hashed {i}" for i in range(20)])
    assert all(x.status == "succeeded" for x in client.results(ids, timeout=60))
    stats = r.info("commandstats")
    # By hash; a source goes only for a script the warm-up did not need yet (the history's,
    # at the first heartbeat; a hand-back's), once.
    sources = stats.get("cmdstat_eval", {}).get("calls", 0)
    assert sources <= 3 and stats["cmdstat_evalsha"]["calls"] >= 5, stats
    r.script_flush()  # as after a restart: every script gone from Redis' cache
    ids = client.submit_many([f"after {i}" for i in range(20)])
    results = client.results(ids, timeout=60)
    assert [x.text for x in results] == [f"after {i}" for i in range(20)]
    stream = r.xrange(f"genq:{{{queue}}}:normal")
    assert len(stream) == 0 or all(b"after" not in f[b"body"] for _, f in stream)  # all acked
    assert worker.proc.poll() is None

    async def one() -> str | None:
        async with AsyncClient.from_url(own.url, queue) as aclient:
            r.script_flush()
            return (await aclient.generate("async after a flush", timeout=60)).text

    assert asyncio.run(one()) == "async after a flush"


def test_no_module_sends_a_scripts_source_itself() -> None:
    """Every script call goes through ``script_calls`` (by its hash): a module's own EVAL would
    send the whole source each time (the wave batches' scripts did, seen in Redis' SLOWLOG)."""
    root = Path(__file__).resolve().parent.parent
    found = []
    for folder in ("common", "producer", "worker"):
        for path in sorted((root / folder).rglob("*.py")):
            if path.name == "script_calls.py":
                continue
            for n, line in enumerate(path.read_text().splitlines(), start=1):
                if re.search(r"\.eval\((?!\))", line) or '"EVAL"' in line:
                    found.append(f"{path.relative_to(root)}:{n}")
    assert found == []


def test_after_a_restart_a_pipeline_of_one_script_sends_its_source_once(r: redis.Redis) -> None:
    """40 calls of a script Redis lacks (a client's first submit of 20,000 requests after a
    restart): the retry sends the source with the first and the hash with the rest."""
    pipe = r.pipeline(transaction=False)
    for _ in range(40):
        script_calls.add(pipe, COUNT, 1, "counted")
    assert script_calls.execute(pipe) == list(range(1, 41))
    stats = r.info("commandstats")
    assert stats["cmdstat_eval"]["calls"] == 1
    assert stats["cmdstat_evalsha"]["calls"] == 40 + 39


def test_the_asyncio_pipeline_sends_the_source_once_too(own: RedisServer, r: redis.Redis) -> None:
    async def run() -> list[object]:
        client = aioredis.Redis.from_url(own.url)
        try:
            pipe = client.pipeline(transaction=False)
            for _ in range(5):
                script_calls.add(pipe, COUNT, 1, "counted")
            return await script_calls.execute_async(pipe)
        finally:
            await client.aclose()

    assert asyncio.run(run()) == [1, 2, 3, 4, 5]
    assert r.info("commandstats")["cmdstat_eval"]["calls"] == 1
