"""What an idle worker costs Redis, counted by Redis itself (INFO commandstats, the commands
inside scripts included), on a redis-server of the module's own; and that a request still
wakes it at once."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from genq.common.keys import Keys
from genq.producer import Client
from genq.worker.devtools.redis_server import RedisServer

from tests.conftest import workers_on

IDLE_COMMANDS_PER_S = 2.5
"""The bound this test keeps: an idle echo worker measured 2.0 a second (3.0 while it read the
queue at every wake; the goal is 2). What is left, per 40 s: its
looks for dead workers' entries every claim_idle_ms / 4 (XINFO CONSUMERS per stream, 24), a read
every --read-block-ms (the PULL and what it runs, 28), the blocked waits (8), the heartbeat
(12)."""


@pytest.fixture(scope="module")
def own() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


def commands(r: redis.Redis, but: tuple[str, ...] = ()) -> int:
    stats = r.info("commandstats")
    return sum(int(v["calls"]) for k, v in stats.items() if k not in but)


def next_beat(r: redis.Redis, key: str, after: bytes | None) -> bytes:
    """Wait for the worker's next heartbeat (its last_seen changes; HGET, left out of the
    count): an idle worker's turn is one heartbeat, one wait on the doorbell and one read."""
    deadline = time.monotonic() + 30
    while (seen := r.hget(key, "last_seen_unix_ms")) == after or seen is None:
        assert time.monotonic() < deadline, "no heartbeat within 30 s"
        time.sleep(0.05)
    return seen


def test_an_idle_worker_blocks_on_the_doorbell_and_wakes_at_once(
    own: RedisServer, tmp_path: Path
) -> None:
    r = redis.Redis.from_url(own.url)
    key = Keys("idle").worker("w0")
    mine = ("cmdstat_hget", "cmdstat_info", "cmdstat_config|resetstat")
    with workers_on(own.url, tmp_path) as start:
        worker = start("idle", "--engine", "echo")
        client = Client.from_url(own.url, "idle")
        assert client.generate("first", timeout=60).status == "succeeded"
        seen = next_beat(r, key, next_beat(r, key, None))  # idle beats from now on
        r.config_resetstat()
        t0 = time.monotonic()
        seen = next_beat(r, key, next_beat(r, key, seen))  # two idle turns
        per_s = commands(r, but=mine) / (time.monotonic() - t0)
        assert per_s <= IDLE_COMMANDS_PER_S, r.info("commandstats")
        waits = []
        for i in range(5):
            time.sleep(1.2)  # idle again, blocked on the doorbell
            waits.append(client.generate(f"wake {i}", timeout=60).timings.queue_wait_ms or 0)
        assert sorted(waits)[2] <= 50, waits  # the doorbell wakes it, no polling tick needed
        t0 = time.monotonic()
        assert worker.stop() == 0
        assert time.monotonic() - t0 < 5  # blocked for 10 s, yet a SIGTERM ends it at once


def test_an_idle_worker_still_finds_a_plain_xadd_within_read_block_ms(
    own: RedisServer, tmp_path: Path
) -> None:
    """A plain XADD (not genq_submit) rings no doorbell: an idle worker, which reads only when
    a ring wakes it, still reads every --read-block-ms and finds it."""
    r = redis.Redis.from_url(own.url)
    keys = Keys("plain")
    with workers_on(own.url, tmp_path) as start:
        start("plain", "--engine", "echo", "--read-block-ms", "1500")
        client = Client.from_url(own.url, "plain")
        assert client.generate("first", timeout=60).status == "succeeded"
        time.sleep(2)  # idle, its last read found nothing
        t0 = time.monotonic()
        r.xadd(keys.stream("normal"), {"id": "plain-1", "body": '{"prompt": "by hand"}'})
        result = client.result("plain-1", timeout=30)
    assert (result.status, result.text) == ("succeeded", "by hand")
    assert time.monotonic() - t0 < 1.5 + 1.5, "seen within --read-block-ms (and a tick)"


def test_a_burst_in_one_call_wakes_every_idle_worker(own: RedisServer, tmp_path: Path) -> None:
    """One submission rings the doorbell once; each worker it wakes passes the ring on while
    work is left, so the whole idle fleet joins within a few reads, not a blocked wait each."""
    flags = ("--engine", "echo", "--echo-step-ms", "5", "--max-batch-size", "4")
    with workers_on(own.url, tmp_path) as start:
        for _ in range(3):
            start("burst", *flags, "--max-lookahead", "4")
        client = Client.from_url(own.url, "burst")
        assert client.generate("first", timeout=60).status == "succeeded"
        time.sleep(2.5)  # every worker idle, blocked on the doorbell (a 1 s wait each)
        results = client.results(client.submit_many([f"b{i}" for i in range(90)]), timeout=60)
    first = {}
    for x in results:
        started = x.timings.started_unix_ms or 0
        first[x.worker] = min(first.get(x.worker, started), started)
    queued = min(x.timings.queued_unix_ms or 0 for x in results)
    assert len(first) == 3, first  # all three served
    assert max(first.values()) - queued < 500, (first, queued)  # woken, not found by a timeout


IDLE_GATEWAY_COMMANDS_PER_S = 4.0
"""The bound for an idle ``genq serve``: it measured 3.0 a second (6 before): whether a batch
runs (SMEMBERS, twice a second, on its event loop), one blocked read of the webhook outbox and one
scan of its due retries every 2 s."""


def test_an_idle_gateway_costs_redis_a_few_commands_a_second(
    own: RedisServer, tmp_path: Path
) -> None:
    from genq.worker.devtools.gateway_process import GatewayProcess

    r = redis.Redis.from_url(own.url)
    gateway = GatewayProcess(own.url, "idlegw", tmp_path / "gateway.log")
    try:
        time.sleep(2.5)  # its first reads done: idle from now on
        mine = ("cmdstat_info", "cmdstat_config|resetstat")
        r.config_resetstat()
        t0 = time.monotonic()
        time.sleep(8)
        per_s = commands(r, mine) / (time.monotonic() - t0)
    finally:
        gateway.stop()
    assert per_s <= IDLE_GATEWAY_COMMANDS_PER_S, per_s
