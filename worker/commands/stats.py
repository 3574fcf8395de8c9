"""``genq stats`` and ``genq top``. What they show: per priority stream and per worker, read
with plain Redis commands (XLEN, XINFO GROUPS, XINFO CONSUMERS, XRANGE, HGETALL) so redis-cli
can do the same."""

from __future__ import annotations

import json
from typing import Any

import click
import redis
from genq.common.keys import GROUP, QUEUED, RETURNED, Keys
from genq.common.models import PRIORITIES, host_now_ms
from genq.common.wire import as_text
from genq.worker.commands.options import WIDE, redis_options
from genq.worker.runtime.heartbeat import derived
from rich.console import Console
from rich.table import Table

THROTTLED_RECENT_MS = 5_000
"""A tenant a read held back this recently (and still waiting) shows as throttled."""


def collect(r: redis.Redis, queue: str) -> dict[str, Any]:
    """A JSON-ready snapshot of the queue: streams by priority, and workers."""
    keys = Keys(queue)
    streams: dict[str, Any] = {}
    consumers: dict[str, dict[str, Any]] = {}
    now = redis_now_ms(r)  # ages by Redis' clock (entry ids), not this host's
    for priority in PRIORITIES:
        streams[priority] = _stream_info(r, keys.stream(priority), now, consumers)
    workers = []
    for name, entry in sorted(consumers.items()):
        h: Any = r.hgetall(keys.worker(name))
        stats = {as_text(k): as_text(v) for k, v in h.items()}
        entry["alive"] = bool(stats)
        if stats:
            for k, v in stats.items():
                entry[k] = int(v) if isinstance(v, str) and v.isdigit() else v
            if "recent_batch_sizes" in entry:
                entry["recent_batch_sizes"] = json.loads(entry["recent_batch_sizes"])
            held_since = json.loads(str(stats.get("oldest_held_unix_ms") or "{}"))
            for priority, since in held_since.items():  # read, waiting in a worker's look-ahead
                row = streams.get(priority)
                if row is not None:
                    age = max(0, now - int(since))
                    row["oldest_waiting_ms"] = max(row.get("oldest_waiting_ms", 0), age)
        workers.append(entry)
    return {
        "queue": queue,
        "streams": streams,
        "tenants": tenants_info(r, keys, now // 1000, workers),
        "dead_letter": int(r.xlen(keys.dead_letter)),
        "workers": workers,
        "redis": redis_memory(r),
    }


def tenants_info(
    r: redis.Redis, keys: Keys, now_s: int, workers: list[dict[str, Any]]
) -> dict[str, dict[str, Any]]:
    """Per tenant: its settings, requests waiting and running, tokens served in the last
    minute and in all, whether it is over its tokens per minute (``throttled``: it has requests
    waiting and a read left them for its token bucket in the last few seconds). Every tenant
    with settings, waiting work, or service on record; two round trips."""
    from genq.common.tenants import read_all

    settings = read_all(r, keys)
    served: Any = r.hgetall(keys.served)
    pipe = r.pipeline(transaction=False)
    for p in PRIORITIES:
        pipe.smembers(keys.active(p))
    names = set(settings) | {as_text(k).split(":")[0] for k in served}
    for members in pipe.execute():
        names |= {as_text(m) for m in members}
    running: dict[str, int] = {}
    for w in workers:
        for tenant, n in json.loads(str(w.get("in_flight_by_tenant") or "{}")).items():
            running[tenant] = running.get(tenant, 0) + int(n)
    names |= set(running)
    ordered = sorted(names)
    pipe = r.pipeline(transaction=False)
    for t in ordered:
        for p in PRIORITIES:
            pipe.llen(keys.tenant_index(p, t))
        pipe.hgetall(keys.window(t))
        pipe.hget(keys.bucket(t), "held_back_ms")
    replies = pipe.execute()
    out: dict[str, dict[str, Any]] = {}
    for i, t in enumerate(ordered):
        row = replies[i * 5 : i * 5 + 5]
        window = row[3] or {}
        last_minute = sum(int(v) for k, v in window.items() if int(k) > now_s - 60)
        s = settings.get(t)
        weight, per_minute = (s.weight, s.tokens_per_minute) if s else (1.0, 0)
        held_back = row[4]  # when a read last left its requests waiting for its bucket
        waiting = sum(int(x) for x in row[:3])
        out[t] = {
            "waiting": waiting,
            "running": running.get(t, 0),
            "tokens_last_minute": max(0, last_minute),
            "tokens_total": int(as_text(served.get(t.encode(), b"0"))),
            "requests_total": int(as_text(served.get(f"{t}:requests".encode(), b"0"))),
            "weight": weight,
            "tokens_per_minute": per_minute,
            "max_queued": s.max_queued if s else 0,
            "throttled": bool(per_minute and waiting and held_back)
            and int(held_back) >= now_s * 1000 - THROTTLED_RECENT_MS,
        }
    return out


def _age_ms(now: int, entry_id: Any) -> int:
    return max(0, now - int(as_text(entry_id).split("-")[0]))


def _stream_info(
    r: redis.Redis, key: str, now: int, consumers: dict[str, dict[str, Any]]
) -> dict[str, Any]:
    """One priority stream: length, pending, lag, handed back, and how long its oldest waiting
    request has waited: not yet read, handed back, or (added by ``collect``) read into a
    worker's look-ahead. Adds each consumer's pending and idle time to ``consumers``."""
    info: dict[str, Any] = {"key": key, "length": int(r.xlen(key)), "pending": 0, "lag": None}
    groups: Any = r.xinfo_groups(key) if r.exists(key) else []
    group = next((g for g in groups if as_text(g["name"]) == GROUP), None)
    if group is None:
        return info
    info["pending"] = int(group["pending"])
    info["lag"] = group.get("lag")
    nxt: Any = r.xrange(key, min=f"({as_text(group['last-delivered-id'])}", count=1)
    info["oldest_waiting_ms"] = _age_ms(now, nxt[0][0]) if nxt else 0
    info["handed_back"] = info["waiting"] = 0
    group_consumers: Any = r.xinfo_consumers(key, GROUP)
    for c in group_consumers:
        name = as_text(c["name"])
        if name in (RETURNED, QUEUED):  # handed back, or waiting: for the next free worker
            info["handed_back" if name == RETURNED else "waiting"] = int(c["pending"])
            first: Any = r.xpending_range(key, GROUP, "-", "+", 1, consumername=name)
            if first:
                age = _age_ms(now, first[0]["message_id"])
                info["oldest_waiting_ms"] = max(info["oldest_waiting_ms"], age)
            continue
        entry = consumers.setdefault(name, {"consumer": name, "pending": 0})
        entry["pending"] += int(c["pending"])
        idle = int(c.get("idle", 0))
        entry["idle_ms"] = min(entry.get("idle_ms", idle), idle)
    return info


def redis_now_ms(r: redis.Redis) -> int:
    """Redis' clock, in Unix milliseconds; this host's if the user may not run TIME."""
    from genq.worker.runtime.clock import redis_time_ms

    ms = redis_time_ms(r)
    return host_now_ms() if ms is None else ms


def redis_memory(r: redis.Redis) -> dict[str, Any]:
    """Redis' memory: used and max bytes, the eviction policy, and whether it is full (writes
    refused: workers hold their results and wait). Empty if this user may not run INFO."""
    try:
        info: Any = r.info("memory")
    except redis.ResponseError:
        return {}
    if info and all(isinstance(v, dict) for v in info.values()):  # a cluster: the fullest node
        info = max(info.values(), key=lambda n: n.get("used_memory", 0))
    used, limit = int(info.get("used_memory", 0)), int(info.get("maxmemory", 0))
    return {
        "used_memory": used,
        "maxmemory": limit,
        "maxmemory_policy": info.get("maxmemory_policy"),
        "full": bool(limit) and used >= limit,
    }


@click.command()
@redis_options
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
def stats(redis_url: str, queue: str, as_json: bool) -> None:
    """Queue depth, pending work and lag per priority; workers and their counters."""
    from genq.common.connection import connect

    r = connect(redis_url)
    try:
        snapshot = collect(r, queue)
    finally:
        r.close()
    if as_json:
        click.echo(json.dumps(snapshot, indent=2))
    else:
        print_stats(snapshot, Console(width=max(Console().width, WIDE)))


def print_stats(snapshot: dict[str, Any], console: Console) -> None:
    """Render a stats snapshot as two tables."""
    for table in stats_tables(snapshot):
        console.print(table)


def stats_tables(snapshot: dict[str, Any]) -> list[Table]:
    """A stats snapshot as three tables: streams by priority, tenants, and workers."""

    mem = snapshot.get("redis") or {}
    title = f"queue {snapshot['queue']!r}"
    if mem:
        limit = f"{mem['maxmemory'] / 2**20:.0f} MiB" if mem["maxmemory"] else "no limit"
        title += f" (Redis: {mem['used_memory'] / 2**20:.1f} MiB used of {limit}"
        title += f", {mem['maxmemory_policy']})"
        if mem["full"]:
            title += " REDIS IS FULL: writes are refused; workers hold results and wait"
    t = Table(title=title)
    for col in (
        "priority",
        "length",
        "waiting",
        "pending",
        "handed back",
        "lag",
        "oldest waiting ms",
    ):
        t.add_column(col, justify="right")
    for priority, s in snapshot["streams"].items():
        t.add_row(
            priority,
            str(s["length"]),
            str(s.get("waiting", 0)),
            str(s["pending"]),
            str(s.get("handed_back", 0)),
            str(s["lag"]),
            str(s.get("oldest_waiting_ms", "-")),
        )
    w = Table(title=f"workers (dead-letter entries: {snapshot['dead_letter']})")
    for col in (
        "consumer",
        "alive",
        "last seen ms",
        "pending",
        "in flight",
        "batches",
        "succeeded",
        "failed",
        "wait p50/p99 ms",
        "mean batch",
        "padding",
        "tokens/s",
    ):
        w.add_column(col, justify="right")
    now = host_now_ms()
    for worker in snapshot["workers"]:
        d = derived(worker)
        seen = worker.get("last_seen_unix_ms")
        w.add_row(
            str(worker["consumer"]),
            "yes" if worker["alive"] else "no",
            str(now - int(seen)) if seen else "-",
            str(worker["pending"]),
            str(worker.get("in_flight", "-")),
            str(worker.get("batches", "-")),
            str(worker.get("succeeded", "-")),
            str(worker.get("failed", "-")),
            f"{worker.get('wait_p50_ms', '-')}/{worker.get('wait_p99_ms', '-')}",
            f"{d['mean_batch_size']:.1f}",
            f"{d['padding_fraction']:.1%}",
            f"{d['tokens_per_s']:.0f}",
        )
    return [t, tenants_table(snapshot.get("tenants", {})), w]


def tenants_table(tenants: dict[str, dict[str, Any]]) -> Table:
    """The tenants of a stats snapshot."""
    t = Table(title="tenants (weight 1 and no limits unless set with genq tenants set)")
    cols = ("tenant", "weight", "waiting", "running", "tokens last min", "tokens total")
    for col in (*cols, "tokens/min limit", "throttled"):
        t.add_column(col, justify="left" if col == "tenant" else "right")
    for name, x in tenants.items():
        t.add_row(
            name,
            f"{x['weight']:g}",
            str(x["waiting"]),
            str(x["running"]),
            str(x["tokens_last_minute"]),
            str(x["tokens_total"]),
            str(x["tokens_per_minute"] or "-"),
            "yes" if x["throttled"] else "no",
        )
    return t


@click.command()
@redis_options
@click.option("--interval-s", type=float, default=1.0, show_default=True)
@click.option("--iterations", type=int, default=0, help="stop after this many (0: until Ctrl-C)")
def top(redis_url: str, queue: str, interval_s: float, iterations: int) -> None:
    """`genq stats`, live: refreshed every --interval-s until Ctrl-C."""
    import time

    from genq.common.connection import connect
    from rich.console import Group
    from rich.live import Live

    def render(r: Any) -> Group:
        return Group(*stats_tables(collect(r, queue)))

    with (
        connect(redis_url) as r,
        Live(
            render(r), console=Console(width=max(Console().width, WIDE)), auto_refresh=False
        ) as live,
    ):
        n = 1
        try:
            while iterations == 0 or n < iterations:
                time.sleep(interval_s)
                live.update(render(r), refresh=True)
                n += 1
        except KeyboardInterrupt:
            pass
