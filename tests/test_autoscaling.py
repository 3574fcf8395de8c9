"""Autoscaling from zero: the README's KEDA ScaledObject reads each priority stream's consumer
group lag (XINFO GROUPS); the group must exist, and its lag be a number, from a queue's first
submission on, before any worker has run, and through a worker's life."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis
from genq.common.keys import GROUP, Keys
from genq.producer import Client

from tests.conftest import WorkerProcess, wait_until

README = (Path(__file__).resolve().parent.parent / "README.md").read_text()


def scaled_object_triggers() -> list[dict[str, str]]:
    """The triggers of the README's ScaledObject, as their metadata (a flat YAML subset)."""
    block = re.search(
        r"<!-- keda-scaledobject.*?-->\s*```yaml\n(.*?)```\s*<!-- /keda-scaledobject -->",
        README,
        re.S,
    )
    assert block is not None
    triggers: list[dict[str, str]] = []
    for line in block.group(1).splitlines():
        if line.strip() == "- type: redis-streams":
            triggers.append({})
        elif triggers and re.match(r"^\s{8}\w+:", line):
            key, value = line.split(":", 1)
            triggers[-1][key.strip()] = value.split("#")[0].strip().strip('"')
    return triggers


def lag_of(r: redis.Redis, trigger: dict[str, str]) -> Any:
    """What KEDA's lagCount mode reads: the consumer group's lag on the trigger's stream."""
    groups: Any = r.xinfo_groups(trigger["stream"])
    group = next(g for g in groups if g["name"].decode() == trigger["consumerGroup"])
    return group["lag"]


def test_the_scaled_object_has_one_lag_trigger_per_priority_stream() -> None:
    triggers = scaled_object_triggers()
    assert [t["stream"] for t in triggers] == Keys("default").streams()
    assert all(t["consumerGroup"] == GROUP and "lagCount" in t for t in triggers)
    assert all(t["activationLagCount"] == "0" for t in triggers)


def test_a_queue_no_worker_has_served_shows_its_lag_to_the_scaler(
    redis_url: str, r: redis.Redis, start_worker: Callable[..., WorkerProcess]
) -> None:
    for key in Keys("default").streams():  # the example is for the default queue
        r.delete(key)
    r.delete(Keys("default").config)
    client = Client.from_url(redis_url, "default")
    client.submit_many(["a", "b", "c"], priority="low", max_new_tokens=4)
    client.submit("urgent", priority="high", max_new_tokens=4)
    cancelled = client.submit("never mind", priority="low", max_new_tokens=4)
    assert client.cancel(cancelled)
    high, normal, low = (lag_of(r, t) for t in scaled_object_triggers())
    assert (high, normal, low) == (1, 0, 4)  # > activationLagCount: KEDA starts a worker
    start_worker("default", "--engine", "echo")
    wait_until(lambda: all(lag_of(r, t) == 0 for t in scaled_object_triggers()), timeout_s=30)
    # Until the worker has acknowledged (and deleted) what it read, an entry it dropped early
    # (the cancelled one) leaves a hole before older pending ones, and Redis may answer a nil
    # lag for a moment: wait until it is done, as an idle queue is what this checks.
    wait_until(lambda: sum(r.xlen(s) for s in Keys("default").streams()) == 0, timeout_s=30)
    assert client.result(cancelled, timeout=5).status == "cancelled"
    client.submit("later", priority="low", max_new_tokens=4)
    lags = [lag_of(r, t) for t in scaled_object_triggers()]
    assert all(isinstance(x, int) for x in lags), lags  # never nil: still readable
