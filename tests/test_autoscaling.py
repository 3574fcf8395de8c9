"""Autoscaling from zero: the guide's KEDA ScaledObject reads the queue's backlog list (LLEN of
``genq:{Q}:waiting``) and each priority stream's consumer-group lag (XINFO GROUPS: entries a
plain XADD added, not yet swept into the tenants' indexes); each must count the waiting work
from a queue's first submission on, before any worker has run, and come back to 0 (a number)
when a worker has served it."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis
from genq.common.keys import GROUP, Keys
from genq.producer import Client

from tests.conftest import WorkerProcess, wait_until

README = (Path(__file__).resolve().parent.parent / "docs" / "deployment.md").read_text()
"""The deployment guide (moved from the README to the documentation site)."""


def scaled_object_triggers() -> list[dict[str, str]]:
    """The triggers of the guide's ScaledObject, as their metadata (a flat YAML subset)."""
    block = re.search(
        r"<!-- keda-scaledobject.*?-->\s*```yaml\n(.*?)```\s*<!-- /keda-scaledobject -->",
        README,
        re.S,
    )
    assert block is not None
    triggers: list[dict[str, str]] = []
    for line in block.group(1).splitlines():
        if line.strip().startswith("- type: "):
            triggers.append({"type": line.split(":", 1)[1].split("#")[0].strip()})
        elif triggers and re.match(r"^\s{8}\w+:", line):
            key, value = line.split(":", 1)
            triggers[-1][key.strip()] = value.split("#")[0].strip().strip('"')
    return triggers


def lag_of(r: redis.Redis, trigger: dict[str, str]) -> Any:
    """What KEDA reads for a trigger: a list's length (``redis``), or the consumer group's lag
    on the trigger's stream (``redis-streams``, lagCount mode)."""
    if trigger["type"] == "redis":
        return r.llen(trigger["listName"])
    groups: Any = r.xinfo_groups(trigger["stream"])
    group = next(g for g in groups if g["name"].decode() == trigger["consumerGroup"])
    return group["lag"]


def test_the_scaled_object_reads_the_backlog_and_each_priority_streams_lag() -> None:
    backlog, *streams = scaled_object_triggers()
    assert backlog == {
        "type": "redis",
        "addressFromEnv": "GENQ_REDIS_ADDRESS",
        "passwordFromEnv": "GENQ_REDIS_PASSWORD",
        "listName": Keys("default").waiting,
        "listLength": "32",
        "activationListLength": "0",
    }
    assert [t["stream"] for t in streams] == Keys("default").streams()
    assert all(t["consumerGroup"] == GROUP and "lagCount" in t for t in streams)
    assert all(t["activationLagCount"] == "0" for t in streams)


def test_a_queue_no_worker_has_served_shows_its_lag_to_the_scaler(
    redis_url: str, r: redis.Redis, start_worker: Callable[..., WorkerProcess]
) -> None:
    keys = Keys("default")  # the example is for the default queue
    for key in [*keys.streams(), keys.config, keys.waiting]:
        r.delete(key)
    for p in ("high", "normal", "low"):
        for t in r.smembers(keys.active(p)):  # type: ignore[union-attr]
            r.delete(keys.tenant_index(p, t.decode()))
        r.delete(keys.active(p))
    client = Client.from_url(redis_url, "default")
    client.submit_many(["a", "b", "c"], priority="low", max_new_tokens=4)
    client.submit("urgent", priority="high", max_new_tokens=4, tenant="other")
    cancelled = client.submit("never mind", priority="low", max_new_tokens=4)
    assert client.cancel(cancelled)
    r.xadd(keys.stream("normal"), {"id": "plain-xadd", "body": '{"prompt": "p"}'})
    backlog, high, normal, low = (lag_of(r, t) for t in scaled_object_triggers())
    # > the activation thresholds: KEDA starts a worker. (The cancelled one waits until a
    # worker takes it and finds it cancelled.)
    assert (backlog, high, normal, low) == (5, 0, 1, 0)
    start_worker("default", "--engine", "echo")
    wait_until(lambda: all(lag_of(r, t) == 0 for t in scaled_object_triggers()), timeout_s=30)
    # Until the worker has acknowledged (and deleted) what it read, an entry it dropped early
    # (the cancelled one) leaves a hole before older pending ones, and Redis may answer a nil
    # lag for a moment: wait until it is done, as an idle queue is what this checks.
    wait_until(lambda: sum(r.xlen(s) for s in keys.streams()) == 0, timeout_s=30)
    assert client.result(cancelled, timeout=5).status == "cancelled"
    assert client.result("plain-xadd", timeout=5).status == "succeeded"
    client.submit("later", priority="low", max_new_tokens=4)
    lags = [lag_of(r, t) for t in scaled_object_triggers()]
    assert all(isinstance(x, int) for x in lags), lags  # never nil: still readable
