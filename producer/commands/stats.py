"""``genq stats`` and ``genq top``. What they show: per priority stream, per tenant and per
worker, read in one round trip by ``genq.common.snapshot`` (one script of plain Redis commands:
XLEN, XINFO GROUPS, XINFO CONSUMERS, XRANGE, HGETALL, so redis-cli can do the same)."""

from __future__ import annotations

import json
from typing import Any

import click
from genq.common.models import host_now_ms
from genq.common.snapshot import collect, derived
from genq.producer.commands.options import WIDE, redis_options
from rich.console import Console
from rich.table import Table


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
    """A stats snapshot as tables: streams by priority, models (and a pool's side of them, and
    their embedding work), tenants, and workers."""
    models = snapshot.get("models", [])
    extra = [t for t in (pool_table(models), embeddings_table(models)) if t is not None]
    return [
        _streams_table(snapshot),
        models_table(models),
        *extra,
        tenants_table(snapshot.get("tenants", {})),
        _workers_table(snapshot),
    ]


def _streams_table(snapshot: dict[str, Any]) -> Table:
    """The queue (Redis' memory, the prefix cache's hit rate) and its streams by priority."""
    mem = snapshot.get("redis") or {}
    title = f"queue {snapshot['queue']!r}"
    if mem:
        limit = f"{mem['maxmemory'] / 2**20:.0f} MiB" if mem["maxmemory"] else "no limit"
        title += f" (Redis: {mem['used_memory'] / 2**20:.1f} MiB used of {limit}"
        title += f", {mem['maxmemory_policy']})"
        if mem["full"]:
            title += " REDIS IS FULL: writes are refused; workers hold results and wait"
    cache = snapshot.get("prefix_cache") or {}
    if cache.get("prompt_tokens"):
        title += f"; prefix cache hit rate {cache['hit_rate']:.1%}"
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
    return t


def _workers_table(snapshot: dict[str, Any]) -> Table:
    """Each worker: liveness, pending, batches, results, waits and speed."""
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
        "cache hit",
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
            f"{d['cache_hit_rate']:.1%}",
            f"{d['tokens_per_s']:.0f}",
        )
    w.caption = _pools_caption(snapshot["workers"])
    return w


def _pools_caption(workers: list[dict[str, Any]]) -> str | None:
    """What each pool's worker holds and its last swap (a caption: the workers table is as
    wide as a terminal already); None without pools."""
    pools = []
    for x in workers:
        if "resident" in x:
            last = x.get("last_swap")
            held = f"{x['consumer']} holds {x['resident'] or '(none)'}"
            pools.append(held + (f" ({last})" if last else ""))
    return "pools: " + "; ".join(pools) if pools else None


def models_table(models: list[dict[str, Any]]) -> Table:
    """The lanes of a stats snapshot: one per model requests named, and the unnamed one."""
    t = Table(title="models (requests wait in their model's lane; none named: the default's)")
    cols = ("model", "waiting", "live workers", "holding it", "running", "tokens generated")
    for col in (*cols, "note"):
        t.add_column(col, justify="left" if col in ("model", "note") else "right")
    for m in models:
        t.add_row(
            _lane_name(m),
            str(m["waiting"]),
            str(m["workers"]),
            str(m.get("holding", m["workers"])),
            str(m["running"]),
            str(m["completion_tokens"]),
            "waiting for a model with no live worker" if m["no_live_worker"] else "",
        )
    return t


def model_columns(title: str, numbers: tuple[str, ...]) -> Table:
    """A table of one row a model: its name, then ``numbers``' columns (right-aligned)."""
    t = Table(title=title)
    t.add_column("model", justify="left")
    for col in numbers:
        t.add_column(col, justify="right")
    return t


def embeddings_table(models: list[dict[str, Any]]) -> Table | None:
    """The embedding work of each model (None when no live worker embedded anything)."""
    if not any(m.get("embedded_inputs") for m in models):
        return None
    t = model_columns(
        "embeddings (by the live workers, since they started; rates per engine second)",
        ("inputs", "input tokens", "saved (repeats)", "inputs/s", "tokens/s", "padding"),
    )
    for m in models:
        if m.get("embedded_inputs"):
            t.add_row(
                _lane_name(m),
                str(m["embedded_inputs"]),
                str(m["embedded_tokens"]),
                str(m["saved_inputs"]),
                f"{m['inputs_per_s']:.0f}",
                f"{m['input_tokens_per_s']:.0f}",
                f"{m['embedding_padding']:.1%}",
            )
    return t


def pool_table(models: list[dict[str, Any]]) -> Table | None:
    """A pool's side of the lanes (None when no worker swaps models): the oldest request's
    wait, the workers holding and loading each model, its loads, evictions and load time."""
    if not any(m.get("loads") or m.get("loading") for m in models):
        return None
    t = model_columns(
        "model pool (loads and evictions by the live workers)",
        ("oldest waiting ms", "holding it", "loading it", "loads", "evictions", "load p50 ms"),
    )
    for m in models:
        t.add_row(
            _lane_name(m),
            str(m.get("oldest_waiting_ms", 0)),
            str(m.get("holding", m["workers"])),
            str(m.get("loading", 0)),
            str(m.get("loads", 0)),
            str(m.get("evictions", 0)),
            str(m.get("load_ms_p50") or "-"),
        )
    return t


def _lane_name(m: dict[str, Any]) -> str:
    if m["model"] is None:
        return f"(none: default {m['served_by'] or '-'})"
    return str(m["model"]) + (" (default)" if m["default"] else "")


def tenants_table(tenants: dict[str, dict[str, Any]]) -> Table:
    """The tenants of a stats snapshot."""
    t = Table(title="tenants (weight 1 and no limits unless set with genq tenants set)")
    cols = ("tenant", "weight", "waiting", "oldest waiting ms", "running", "tokens last min")
    for col in (*cols, "tokens total", "tokens/min limit", "throttled"):
        t.add_column(col, justify="left" if col == "tenant" else "right")
    for name, x in tenants.items():
        t.add_row(
            name,
            f"{x['weight']:g}",
            str(x["waiting"]),
            str(x["oldest_waiting_ms"]),
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
