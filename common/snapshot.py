"""A snapshot of a queue in one Redis round trip: what ``genq stats``, ``genq top``, the demo
and the dashboard show.

``SNAPSHOT`` is one read-only script: per priority stream its length, the group's pending, lag
and next entry, its consumers (and the oldest entry handed back or waiting); every worker's
stats hash; every tenant's settings, waiting requests, last minute and total service; the
dead-letter stream's length; Redis' memory; and, for the dashboard, the last buckets of the
queue's history (``genq.common.history``). One call, so a refresh costs one round trip however
many rows it shows, and every number in it is of the same instant. The same commands, one at a
time, give the same numbers from redis-cli (docs/wire-format.md: the redis-cli cookbook).
"""

from __future__ import annotations

import json
from typing import Any

import orjson
from genq.common import history, script_calls
from genq.common.connection import is_cluster
from genq.common.keys import GROUP, QUEUED, RETURNED, Keys
from genq.common.lua.snapshot import SNAPSHOT
from genq.common.models import PRIORITIES, host_now_ms
from genq.common.tenants import parse_all
from genq.common.wire import as_text

THROTTLED_RECENT_MS = 5_000
"""A tenant a read held back this recently (and still waiting) shows as throttled."""


def read(r: Any, keys: Keys, history_buckets: int = 0) -> dict[str, Any]:
    """Run ``SNAPSHOT`` (one round trip) and return its decoded reply, raw."""
    script_keys = [
        *keys.streams(),
        keys.dead_letter,
        keys.tenants,
        keys.served,
        *(keys.active(p) for p in PRIORITIES),
        keys.models,
        keys.config,
    ]
    args = [
        GROUP,
        RETURNED,
        QUEUED,
        keys.worker(""),
        keys.window(""),
        keys.bucket(""),
        *(keys.tenant_index(p, "") for p in PRIORITIES),
        keys.history(""),
        history_buckets,
        history.BUCKET_S,
        host_now_ms(),
    ]
    raw: Any = script_calls.call(r, SNAPSHOT, len(script_keys), *script_keys, *args)
    doc: dict[str, Any] = orjson.loads(raw)
    return doc


def collect(r: Any, queue: str) -> dict[str, Any]:
    """A JSON-ready snapshot of the queue: streams by priority, tenants, workers, the dead-letter
    stream's length and Redis' memory (``genq stats --json``)."""
    return stats_of(r, read(r, Keys(queue)), queue)


def stats_of(r: Any, raw: dict[str, Any], queue: str) -> dict[str, Any]:
    """``collect``'s snapshot from ``read``'s reply (``r`` only for a cluster's memory)."""
    keys = Keys(queue)
    now = int(raw["now_ms"])
    streams: dict[str, Any] = {}
    consumers: dict[str, dict[str, Any]] = {}
    for priority, s in zip(PRIORITIES, raw["streams"], strict=True):
        streams[priority] = _stream(keys.stream(priority), s, now, consumers)
    oldest: dict[str | None, int] = {}  # per named lane, its oldest waiting request's wait
    for model, lane in (raw.get("lanes") or {}).items():  # (their consumers: the workers')
        for priority, s in zip(PRIORITIES, lane["streams"], strict=True):
            one = _stream(keys.lane(model).stream(priority), s, now, consumers)
            oldest[model] = max(oldest.get(model, 0), int(one.get("oldest_waiting_ms") or 0))
    workers = []
    for name, entry in sorted(consumers.items()):
        flat = raw["workers"].get(name) or []
        stats = {as_text(flat[i]): as_text(flat[i + 1]) for i in range(0, len(flat), 2)}
        entry["alive"] = bool(stats)
        for k, v in stats.items():
            entry[k] = int(v) if v.isdigit() else v
        if "recent_batch_sizes" in entry:
            entry["recent_batch_sizes"] = json.loads(entry["recent_batch_sizes"])
        held_since = json.loads(str(stats.get("oldest_held_unix_ms") or "{}"))
        for priority, since in held_since.items():  # read, waiting in a worker's look-ahead
            row = streams.get(priority)
            if row is not None:
                age = max(0, now - int(since))
                row["oldest_waiting_ms"] = max(row.get("oldest_waiting_ms", 0), age)
        if entry["alive"]:
            entry["cache_hit_rate"] = round(derived(entry)["cache_hit_rate"], 4)
        workers.append(entry)
    memory = redis_memory(r) if is_cluster(r) else _memory(raw.get("memory"))
    return {
        "queue": queue,
        "streams": streams,
        "prefix_cache": _prefix_cache(workers),
        "models": _models(raw, workers, {None: _oldest(streams), **oldest}),
        "tenants": _tenants(raw, now // 1000, workers),
        "dead_letter": int(raw["dead_letter"]),
        "workers": workers,
        "redis": memory,
    }


EMBEDDING_COUNTERS = ("embedded_inputs", "embedded_tokens", "saved_inputs")
"""An embedding worker's counters (its heartbeat hash's), summed per model."""


def embedding_work(workers: list[dict[str, Any]]) -> dict[str, Any]:
    """The embedding work of ``workers`` (a model's): inputs answered, the input tokens
    computed, inputs saved (a repeat computed once), inputs/s and input tokens/s (summed:
    workers run side by side), and the padding of their passes."""
    out: dict[str, Any] = {k: sum(int(w.get(k, 0)) for w in workers) for k in EMBEDDING_COUNTERS}
    embedding = [w for w in workers if int(w.get("embedded_inputs", 0))]
    rates = [derived(w) for w in embedding]
    out["inputs_per_s"] = round(sum(r["inputs_per_s"] for r in rates), 1)
    out["input_tokens_per_s"] = round(sum(r["input_tokens_per_s"] for r in rates), 1)
    summed = {
        k: sum(int(w.get(k, 0)) for w in embedding)
        for k in ("prompt_tokens", "padded_prompt_tokens")
    }
    out["embedding_padding"] = round(derived(summed)["padding_fraction"], 4)
    return out


def _oldest(streams: dict[str, Any]) -> int:
    return max((int(x.get("oldest_waiting_ms") or 0) for x in streams.values()), default=0)


def _models(
    raw: dict[str, Any], workers: list[dict[str, Any]], oldest: dict[str | None, int]
) -> list[dict[str, Any]]:
    """Per lane (``Keys.lane``): its model (None: the unnamed lane, served by the queue's
    default model), requests waiting and the oldest one's wait, the live workers serving it (a
    pool's among them), those holding it loaded and those loading it, what they run, the
    tokens they generated, the inputs they embedded (``embedding_work``), and a pool's loads
    and evictions of it and its load time (the median of each live worker's last);
    ``no_live_worker``: requests wait that no live worker can take (workers may start
    later)."""
    default = as_text(raw["default_model"]) if raw.get("default_model") else None
    live = [w for w in workers if w["alive"]]
    lanes: dict[str | None, int] = {None: int(raw.get("unnamed_waiting") or 0)}
    for model, lane in sorted((raw.get("lanes") or {}).items()):
        lanes[model] = int(lane["waiting"])
    for w in live:
        for served in _serves(w):
            lanes.setdefault(served, 0)
    rows = []
    for model, waiting in lanes.items():
        name = model or default
        serving = [w for w in live if name in _serves(w)]
        holding = [w for w in serving if name in _holds(w)]
        swaps = [json.loads(str(w.get("model_swaps") or "{}")).get(name) or {} for w in live]
        load_ms = sorted(int(x["load_ms"]) for x in swaps if x.get("load_ms"))
        rows.append(
            {
                "model": model,
                "served_by": name,
                "default": model is not None and model == default,
                "waiting": waiting,
                "oldest_waiting_ms": oldest.get(model, 0) if waiting else 0,
                "workers": len(serving),
                "holding": len(holding),
                "loading": sum(1 for w in serving if name in str(w.get("loading") or "").split()),
                "loads": sum(int(x.get("loads", 0)) for x in swaps),
                "evictions": sum(int(x.get("evictions", 0)) for x in swaps),
                "load_ms_p50": load_ms[len(load_ms) // 2] if load_ms else None,
                "running": sum(int(w.get("in_flight", 0)) for w in serving),
                "completion_tokens": sum(int(w.get("completion_tokens", 0)) for w in serving),
                **embedding_work(serving),
                "no_live_worker": waiting > 0 and not serving,
            }
        )
    return rows


def _serves(w: dict[str, Any]) -> list[str]:
    """The names a worker serves: its model (a pool's, space-separated) and its adapters."""
    return [*str(w.get("model") or "").split(), *str(w.get("adapters") or "").split()]


def _holds(w: dict[str, Any]) -> list[str]:
    """The names a worker has loaded: a pool's ``resident`` models, else all it serves."""
    resident = w.get("resident")
    return str(resident).split() if resident is not None else _serves(w)


def _prefix_cache(workers: list[dict[str, Any]]) -> dict[str, Any]:
    """The live workers' prompt tokens, those their engines took from a prefix cache, and the
    ratio: the queue's cache hit rate (each worker counts since it started)."""
    live = [w for w in workers if w["alive"]]
    prompt = sum(int(w.get("prompt_tokens", 0)) for w in live)
    cached = sum(int(w.get("cached_tokens", 0)) for w in live)
    rate = round(cached / prompt, 4) if prompt else 0.0
    return {"prompt_tokens": prompt, "cached_tokens": cached, "hit_rate": rate}


def _age_ms(now: int, entry_id: str) -> int:
    return max(0, now - int(entry_id.split("-")[0]))


def _stream(key: str, s: dict[str, Any], now: int, consumers: dict[str, Any]) -> dict[str, Any]:
    """One priority stream: length, pending, lag, handed back, and how long its oldest waiting
    request has waited: not yet read, handed back, or (added by ``stats_of``) read into a
    worker's look-ahead. Adds each consumer's pending and idle time to ``consumers``."""
    info: dict[str, Any] = {"key": key, "length": int(s["length"]), "pending": 0, "lag": None}
    if not s.get("group"):
        return info
    info["pending"] = int(s["pending"])
    info["lag"] = s["lag"] if s["lag"] is not False else None  # nil (unknown) comes as false
    info["oldest_waiting_ms"] = _age_ms(now, s["next_id"]) if s.get("next_id") else 0
    info["handed_back"] = info["waiting"] = 0
    for c in s["consumers"] or []:  # an empty Lua table is encoded as {}
        name = c["name"]
        if name in (RETURNED, QUEUED):  # handed back, or waiting: for the next free worker
            info["handed_back" if name == RETURNED else "waiting"] = int(c["pending"])
            if c.get("first_id"):
                age = _age_ms(now, c["first_id"])
                info["oldest_waiting_ms"] = max(info["oldest_waiting_ms"], age)
            continue
        entry = consumers.setdefault(name, {"consumer": name, "pending": 0})
        entry["pending"] += int(c["pending"])
        idle = int(c.get("idle", 0))
        entry["idle_ms"] = min(entry.get("idle_ms", idle), idle)
    return info


def _tenants(raw: dict[str, Any], now_s: int, workers: list[dict[str, Any]]) -> dict[str, Any]:
    """Per tenant: its settings, requests waiting (and the oldest one's wait) and running,
    tokens served in the last
    minute and in all, whether it is over its tokens per minute (``throttled``: it has requests
    waiting and a read left them for its token bucket in the last few seconds). Every tenant
    with settings, waiting work, running work or service on record."""
    flat = raw["settings"] or []
    settings = parse_all({flat[i]: flat[i + 1] for i in range(0, len(flat), 2)})
    flat = raw["served"] or []
    served = {flat[i]: int(flat[i + 1]) for i in range(0, len(flat), 2)}
    running: dict[str, int] = {}
    for w in workers:
        for tenant, n in json.loads(str(w.get("in_flight_by_tenant") or "{}")).items():
            running[tenant] = running.get(tenant, 0) + int(n)
    now_ms = int(raw["now_ms"])
    out: dict[str, dict[str, Any]] = {}
    for t in sorted(raw["tenants"] or {}):
        row = raw["tenants"][t]
        window = row["window"] or []
        last_minute = sum(
            int(window[i + 1]) for i in range(0, len(window), 2) if int(window[i]) > now_s - 60
        )
        s = settings.get(t)
        weight, per_minute = (s.weight, s.tokens_per_minute) if s else (1.0, 0)
        held_back = int(row.get("held_back") or 0)  # when a read last left its requests waiting
        waiting = int(row["waiting"])
        oldest = row.get("oldest") or 0
        out[t] = {
            "waiting": waiting,
            "running": running.get(t, 0),
            "oldest_waiting_ms": max(0, now_ms - int(oldest)) if oldest and waiting else 0,
            "tokens_last_minute": max(0, last_minute),
            "tokens_total": served.get(t, 0),
            "requests_total": served.get(f"{t}:requests", 0),
            "weight": weight,
            "tokens_per_minute": per_minute,
            "max_queued": s.max_queued if s else 0,
            "throttled": bool(per_minute and waiting and held_back)
            and held_back >= now_s * 1000 - THROTTLED_RECENT_MS,
        }
    return out


def _memory(info: str | None) -> dict[str, Any]:
    """INFO memory's used and max bytes, eviction policy, and whether Redis is full."""
    if not info:
        return {}
    return _memory_row(dict(line.split(":", 1) for line in info.splitlines() if ":" in line))


def _memory_row(info: dict[str, Any]) -> dict[str, Any]:
    used, limit = int(info.get("used_memory", 0)), int(info.get("maxmemory", 0))
    return {
        "used_memory": used,
        "maxmemory": limit,
        "maxmemory_policy": info.get("maxmemory_policy"),
        "full": bool(limit) and used >= limit,
    }


def redis_memory(r: Any) -> dict[str, Any]:
    """Redis' memory: used and max bytes, the eviction policy, and whether it is full (writes
    refused: workers hold their results and wait). Empty if this user may not run INFO. On a
    cluster, the fullest node's."""
    import redis

    try:
        info: Any = r.info("memory")
    except redis.ResponseError:
        return {}
    if info and all(isinstance(v, dict) for v in info.values()):  # a cluster: the fullest node
        info = max(info.values(), key=lambda n: n.get("used_memory", 0))
    return _memory_row(info)


def derived(worker: dict[str, Any]) -> dict[str, float]:
    """Mean batch size, padding fraction, prefix cache hit rate (prompt tokens taken from the
    engine's cache / all prompt tokens), generated tokens/s, and an embedding worker's inputs/s
    and input tokens/s (all per second of engine time) from a worker's counters (or a sum of
    them)."""
    batches = int(worker.get("batches", 0))
    done = int(worker.get("succeeded", 0))
    padded = int(worker.get("padded_prompt_tokens", 0))
    prompt = int(worker.get("prompt_tokens", 0))
    gen_s = int(worker.get("generation_ms", 0)) / 1000

    def per_s(counter: str) -> float:
        return int(worker.get(counter, 0)) / gen_s if gen_s else 0.0

    return {
        "mean_batch_size": done / batches if batches else 0.0,
        "padding_fraction": 1 - prompt / padded if padded else 0.0,
        "cache_hit_rate": int(worker.get("cached_tokens", 0)) / prompt if prompt else 0.0,
        "tokens_per_s": per_s("completion_tokens"),
        "inputs_per_s": per_s("embedded_inputs"),
        "input_tokens_per_s": per_s("embedded_tokens"),
    }
