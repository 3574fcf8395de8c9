"""What ``genq stats`` shows: per priority stream and per worker, read with plain Redis
commands (XLEN, XINFO GROUPS, XINFO CONSUMERS, XRANGE, HGETALL) so redis-cli can do the same."""

from __future__ import annotations

import json
from typing import Any

import redis
from genq.common.keys import GROUP, Keys
from genq.common.models import PRIORITIES, now_ms


def _s(v: Any) -> Any:
    return v.decode() if isinstance(v, bytes) else v


def collect(r: redis.Redis, queue: str) -> dict[str, Any]:
    """A JSON-ready snapshot of the queue: streams by priority, and workers."""
    keys = Keys(queue)
    streams: dict[str, Any] = {}
    consumers: dict[str, dict[str, Any]] = {}
    now = now_ms()
    for priority in PRIORITIES:
        key = keys.stream(priority)
        info: dict[str, Any] = {"key": key, "length": int(r.xlen(key)), "pending": 0, "lag": None}
        groups: Any = r.xinfo_groups(key) if r.exists(key) else []
        group = next((g for g in groups if _s(g["name"]) == GROUP), None)
        if group is not None:
            info["pending"] = int(group["pending"])
            info["lag"] = group.get("lag")
            last = _s(group["last-delivered-id"])
            nxt: Any = r.xrange(key, min=f"({last}", count=1)
            info["oldest_waiting_ms"] = max(0, now - int(_s(nxt[0][0]).split("-")[0])) if nxt else 0
            group_consumers: Any = r.xinfo_consumers(key, GROUP)
            for c in group_consumers:
                name = _s(c["name"])
                entry = consumers.setdefault(name, {"consumer": name, "pending": 0})
                entry["pending"] += int(c["pending"])
                idle = int(c.get("idle", 0))
                entry["idle_ms"] = min(entry.get("idle_ms", idle), idle)
        streams[priority] = info
    workers = []
    for name, entry in sorted(consumers.items()):
        h: Any = r.hgetall(keys.worker(name))
        stats = {_s(k): _s(v) for k, v in h.items()}
        entry["alive"] = bool(stats)
        if stats:
            for k, v in stats.items():
                entry[k] = int(v) if isinstance(v, str) and v.isdigit() else v
            if "recent_batch_sizes" in entry:
                entry["recent_batch_sizes"] = json.loads(entry["recent_batch_sizes"])
        workers.append(entry)
    return {
        "queue": queue,
        "streams": streams,
        "dead_letter": int(r.xlen(keys.dead_letter)),
        "workers": workers,
    }


def derived(worker: dict[str, Any]) -> dict[str, float]:
    """Mean batch size, padding fraction and tokens/s from a worker's counters."""
    batches = int(worker.get("batches", 0))
    done = int(worker.get("succeeded", 0))
    padded = int(worker.get("padded_prompt_tokens", 0))
    gen_ms = int(worker.get("generation_ms", 0))
    return {
        "mean_batch_size": done / batches if batches else 0.0,
        "padding_fraction": 1 - int(worker.get("prompt_tokens", 0)) / padded if padded else 0.0,
        "tokens_per_s": int(worker.get("completion_tokens", 0)) / (gen_ms / 1000)
        if gen_ms
        else 0.0,
    }
