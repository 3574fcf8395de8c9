"""The queue's history (what the dashboard charts) and the one-round-trip snapshot: workers add
to 5-s buckets in Redis at their heartbeat; ``genq.common.snapshot`` reads it all at once."""

from __future__ import annotations

import time
from collections.abc import Callable

import redis
from genq.common import history, snapshot
from genq.common.keys import Keys
from genq.producer import Client

from tests.conftest import WorkerProcess, wait_until


def test_a_wait_falls_in_a_bin_whose_upper_edge_holds_it_within_a_fifth() -> None:
    for wait in (0, 1, 2, 3, 7, 10, 99, 100, 1234, 60_000, 3_600_000):
        upper = history.bin_upper_ms(history.wait_bin(wait))
        assert wait <= upper <= wait * 1.2 + 1, (wait, upper)
    bins = [history.wait_bin(w) for w in range(0, 5000, 7)]
    assert bins == sorted(bins)


def test_percentiles_of_a_wait_histogram_are_the_bins_upper_edges() -> None:
    waits = [10] * 98 + [1000, 5000]
    counts = history.increments(0, 0, waits)
    bins = {int(k[2:]): v for k, v in counts.items()}
    assert history.percentile(bins, 0.5) == history.bin_upper_ms(history.wait_bin(10))
    assert history.percentile(bins, 0.99) == history.bin_upper_ms(history.wait_bin(1000))
    assert history.percentile({}, 0.5) is None


def test_series_turn_bucket_counts_into_rates_and_leave_unwritten_buckets_empty() -> None:
    s = history.series([(100, {}), (101, {b"requests": b"10", b"tokens": b"250", "depth_max": 7})])
    assert s["t"] == [500, 505]
    assert s["requests_per_s"] == [None, 2.0]
    assert s["tokens_per_s"] == [None, 50.0]
    assert s["depth"] == [None, 7]


def test_workers_write_what_they_finished_into_buckets_that_expire(
    r: redis.Redis, redis_url: str, queue: str, start_worker: Callable[..., WorkerProcess]
) -> None:
    keys = Keys(queue)
    client = Client.from_url(redis_url, queue)
    ids = client.submit_many([f"prompt {i}" for i in range(20)], max_new_tokens=4)
    start_worker(queue, "--engine", "echo")
    results = client.results(ids, timeout=60)
    generated = sum(res.usage.completion_tokens for res in results if res.usage)

    def totals() -> dict[str, int]:
        out: dict[str, int] = {}
        for key in r.scan_iter(match=keys.history("*")):
            for k, v in r.hgetall(key).items():
                out[k.decode()] = out.get(k.decode(), 0) + int(v)
            ttl = int(r.ttl(key))
            assert 0 < ttl <= history.BUCKET_TTL_S, (key, ttl)
        return out

    wait_until(lambda: totals().get("requests") == 20, timeout_s=15)
    t = totals()
    assert t["tokens"] == generated
    assert sum(v for k, v in t.items() if k.startswith(history.WAIT_PREFIX)) == 20
    assert t["depth_max"] >= 0


def test_the_snapshot_reads_the_whole_queue_in_one_command(
    r: redis.Redis, redis_url: str, queue: str
) -> None:
    client = Client.from_url(redis_url, queue)
    client.submit_many(
        [{"prompt": "x", "tenant": t, "priority": p} for t in "abc" for p in ("high", "low")]
    )
    time.sleep(0.05)
    sent: list[object] = []

    class Counting(redis.Connection):
        def send_command(self, *args: object, **kwargs: object) -> None:
            sent.append(args[0])
            super().send_command(*args, **kwargs)  # type: ignore[arg-type]

    probe = redis.Redis.from_url(redis_url, connection_class=Counting)
    probe.ping()
    snapshot.read(probe, Keys(queue), history.BUCKETS)  # Redis caches the script
    sent.clear()
    raw = snapshot.read(probe, Keys(queue), history.BUCKETS)
    assert sent == ["EVALSHA"]  # one command, and the script by its hash
    stats = snapshot.stats_of(probe, raw, queue)
    assert {t: x["waiting"] for t, x in stats["tenants"].items()} == {"a": 2, "b": 2, "c": 2}
    assert all(50 <= x["oldest_waiting_ms"] < 60_000 for x in stats["tenants"].values())
    assert stats["streams"]["high"]["length"] == 3
    assert len(raw["history"]) == history.BUCKETS
