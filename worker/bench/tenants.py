"""``genq bench --scenario tenants``: many tenants on one fleet, fair against first-come.

Each case runs on real ``genq worker --engine echo --echo-step-ms S`` processes (a batch takes
``S`` ms x its longest ``max_new_tokens``), once with ``--tenant-policy fair`` and once with
``fifo`` (first come, first served: genq before tenants), taking turns:

- **Flood vs trickle**: tenant A submits a flood at once; tenant B then sends one request every
  ``trickle_every_s``. B's queue waits (enqueue to start) while the flood lasts, next to B alone
  on an idle fleet. Goal: p99 <= 2 x idle p99 + one batch time. The flood's makespan (its first
  request queued to its last finished) gives the throughput ratio, and Redis commands per
  request are counted (INFO commandstats).
- **Service gap**: a heavy tenant (10x the tokens per request) and a light one, both
  backlogged (the heavy one submitted first; steps of a quarter of ``S``, to keep it short).
  The largest gap in weighted tokens served (prompt + 2 x generated, counted at each request's
  start, and at its finish) over any stretch of time while both wait, as VTC defines it: from
  the moment both have a request queued until one has nothing left. Goal: fair >= 30x smaller
  than fifo. (Counted from the heavy tenant's first submission, as this bench did before, the
  heavy tenant's lead before the light one's submission lands counts too: shown beside it.)
- **Weights**: weights 3 and 1, both backlogged, over the whole fleet: tokens served (at each
  start) while both have requests queued in Redis. Goal: within 10% of 3:1. And up to the
  first tenant's last start (its last requests waiting in look-aheads included): within 15%.
- **Five weights and a kill**: tenants at weights 1, 1, 2, 4, 8, all backlogged; one of the
  three workers killed (SIGKILL) a third of the way through. Tokens per unit of weight at each
  start, to the first tenant's last start: goal within 7% of the mean for every tenant.
- **A real model** (not ``quick``): flood vs trickle again, on ``--engine continuous --model
  tiny`` (transformers' continuous batching on the built-in model), fair against fifo.
- **Quota** (not ``quick``): a tenant limited to N tokens a minute, backlogged for over a minute,
  beside another tenant's trickle: the most it was served in any 60 s (by finish times), and
  the other tenant's waits. Goal: <= N + one batch's tokens.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from genq.common.models import Result
from genq.producer import Client
from genq.worker.bench.fleet import redis_counters
from genq.worker.bench.modes import percentile
from genq.worker.bench.tenant_fleet import TenantCase, both_waiting, weighted
from genq.worker.bench.tenant_weights import weights, weights_with_a_kill

POLICIES = ("fair", "fifo")
FROM_FIRST = "start_from_first_submission"
AT = {
    "start": "at each start",
    "produced": "as produced (prompt at the start, generated evenly to the finish)",
    "finish": "at each finish",
}
BATCH_TOKENS = 1024
"""The quota case's workers' batch budget (``--max-batch-tokens``): one batch's tokens, the
most a limited tenant may take beyond its tokens per minute."""


@dataclass(kw_only=True)
class TenantsReport:
    """Everything ``run_tenants`` measured (per policy where it compares them)."""

    workers: int
    step_ms: float
    batch_size: int
    flood: int
    trickle: int
    batch_ms: float
    """One batch's simulated model time: step_ms x the flood's max_new_tokens."""
    batch_run_ms: dict[str, list[float]] = field(default_factory=dict)
    """Per policy: each flood request's start to finish (its batch's run), every round."""
    idle_wait_ms: dict[str, float] = field(default_factory=dict)
    """B alone: p50, p99."""
    trickle_wait_ms: dict[str, dict[str, float]] = field(default_factory=dict)
    """B beside the flood, per policy, over every round's requests queued while the flood
    lasted (``beside`` of them): p50, p99, max."""
    trickle_waits: dict[str, list[float]] = field(default_factory=dict)
    """Those waits, ms."""
    flood_makespan_s: dict[str, list[float]] = field(default_factory=dict)
    commands_per_request: dict[str, float] = field(default_factory=dict)
    service_gap: dict[str, dict[str, float]] = field(default_factory=dict)
    """Per policy: the largest gap counted at starts, at finishes, and at starts from the first
    submission (the median of the rounds)."""
    service_gap_runs: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    """Per policy and way of counting: each round's gap."""
    weights_ratio: dict[str, float] = field(default_factory=dict)
    five_weights: dict[str, float] = field(default_factory=dict)
    """Weights 1, 1, 2, 4, 8 with a worker killed: each tenant's share per unit of weight over
    the mean, and the largest deviation."""
    """Weight 3 over weight 1, tokens served: while both are backlogged in the queue, and to the
    first tenant's last finish."""
    quota: dict[str, float] = field(default_factory=dict)
    model_wait_ms: dict[str, dict[str, float]] = field(default_factory=dict)
    """B's waits beside a flood on a real model (continuous engine), per policy."""


def _waits(results: Sequence[Result]) -> dict[str, float]:
    return _summary([float(x.timings.queue_wait_ms or 0) for x in results])


def _summary(waits: Sequence[float]) -> dict[str, float]:
    """p50, p99 (nearest rank: with fewer than 100 values, the largest) and max."""
    return {
        "p50": percentile(waits, 0.5),
        "p99": percentile(waits, 0.99),
        "max": max(waits, default=0.0),
    }


def trickle_requests(client: Client, n: int, every_s: float, tenant: str) -> list[str]:
    """``n`` requests of ``tenant`` (16 new tokens each), one every ``every_s``; their ids."""
    ids = []
    for i in range(n):
        ids.append(client.submit(f"trickle {i}", tenant=tenant, max_new_tokens=16))
        time.sleep(every_s)
    return ids


def flood_vs_trickle(
    url: str, policy: str, *, workers: int, step_ms: float, flood: int, trickle: int, every_s: float
) -> tuple[list[float], float, float, list[float]]:
    """B's waits beside A's flood, ms (only B's requests queued before the flood's last start:
    any others found the fleet idle), the flood's makespan (its first queued to its last
    finished), Redis commands per request, and how long each flood request's batch ran (its
    start to its finish, ms: the simulated steps plus what a batch costs around them)."""
    with TenantCase(url, "flood", policy, workers, step_ms) as case:
        c = case.client
        calls0, _ = redis_counters(case.r)
        a_ids = c.submit_many([f"flood {i}" for i in range(flood)], tenant="a", max_new_tokens=16)
        b_ids = trickle_requests(c, trickle, every_s, "b")
        b = c.results(b_ids, timeout=600)
        a = c.results(a_ids, timeout=600)
        calls1, _ = redis_counters(case.r)
    last_start = max(x.timings.started_unix_ms or 0 for x in a)
    beside = [x for x in b if (x.timings.queued_unix_ms or 0) < last_start]
    first = min(x.timings.queued_unix_ms or 0 for x in a)
    makespan_s = (max(x.timings.finished_unix_ms or 0 for x in a) - first) / 1000
    waits = [float(x.timings.queue_wait_ms or 0) for x in beside]
    ran = [float((x.timings.finished_unix_ms or 0) - (x.timings.started_unix_ms or 0)) for x in a]
    return waits, makespan_s, (calls1 - calls0) / (flood + trickle), ran


def model_case(url: str, policy: str, *, model: str) -> dict[str, float]:
    """Flood vs trickle on a real model: one continuous worker, 200 requests of tenant A, then
    B's 8, one every 0.3 s."""
    worker: dict[str, object] = {"engine": "continuous", "model": model}
    with TenantCase(url, "model", policy, 1, 0.0, worker=worker) as case:
        c = case.client
        a_ids = c.submit_many(
            [f"flood {i} of many" for i in range(200)], tenant="a", max_new_tokens=16
        )
        b = c.results(trickle_requests(c, 8, 0.3, "b"), timeout=900)
        c.results(a_ids, timeout=900)
    return _waits(b)


def idle_trickle(
    url: str, *, workers: int, step_ms: float, trickle: int, every_s: float
) -> dict[str, float]:
    """B alone on an idle fleet."""
    with TenantCase(url, "idle", "fair", workers, step_ms) as case:
        return _waits(
            case.client.results(trickle_requests(case.client, trickle, every_s, "b"), timeout=600)
        )


def service_gap(
    url: str, policy: str, *, workers: int, step_ms: float, n_light: int
) -> dict[str, float]:
    """The largest gap in weighted tokens served between a heavy and a light tenant over any
    stretch of time while both wait (``_gap``): counted at each request's start, and at its
    finish; and, for comparison, counted from the heavy tenant's first submission."""
    with TenantCase(url, "gap", policy, workers, step_ms) as case:
        c = case.client
        # One call, both tenants (heavy first): in two, the workers could read every heavy
        # request into their look-aheads before the light ones arrived, and the gap would be
        # that race's, not the order's (a loaded CI machine saw fair above first come).
        items = [{"prompt": "h" * 320, "tenant": "heavy", "max_new_tokens": 160}] * (n_light // 10)
        items += [{"prompt": "l" * 32, "tenant": "light", "max_new_tokens": 16}] * n_light
        results = c.results(c.submit_many(items), timeout=900)
    started = _ms(lambda x: x.timings.started_unix_ms)
    return {
        "start": _gap(results, started),
        "finish": _gap(results, _ms(lambda x: x.timings.finished_unix_ms)),
        "produced": _gap_as_produced(results),
        FROM_FIRST: _gap(results, started, from_first=True),
    }


def _ms(field: Callable[[Result], int | None]) -> Callable[[Result], int]:
    return lambda x: field(x) or 0


def _gap(
    results: Sequence[Result], when: Callable[[Result], int], from_first: bool = False
) -> float:
    """The largest gap in weighted tokens served to the two tenants over any stretch of time
    while both wait, as VTC defines it (max over t1 < t2 of |heavy's service in [t1, t2] -
    light's|; the most the running difference rose or fell): from the moment both have a
    request queued until the first of them has nothing left to start. ``from_first``: counted
    from zero at the first submission instead (the heavy tenant's lead before the light one
    submitted counts too)."""
    begin, end = both_waiting(results, when)
    begin = 0 if from_first else begin
    diff, low, high = 0, 0, 0
    for x in sorted(results, key=when):
        if when(x) < begin or (x.timings.started_unix_ms or 0) < begin:
            continue  # chosen before both waited
        if when(x) >= end:
            break
        diff += weighted(x) if x.tenant == "heavy" else -weighted(x)
        low, high = min(low, diff), max(high, diff)
    return float(high if from_first else high - low)


def _gap_as_produced(results: Sequence[Result]) -> float:
    """``_gap`` (while both wait) with each request's service counted as it is produced: its
    prompt at its start, its generated tokens (x2) evenly from its start to its finish, as VTC
    counts tokens on an engine that reports them step by step. The difference is piecewise
    linear, so its extremes are at the starts and finishes: one sweep over them."""
    begin, end = both_waiting(results, lambda x: x.timings.started_unix_ms or 0)
    events: list[tuple[float, float, float]] = []  # (time, jump, change of slope per ms)
    for x in results:
        start, finish = x.timings.started_unix_ms or 0, x.timings.finished_unix_ms or 0
        if not begin <= start < end:
            continue
        sign = 1 if x.tenant == "heavy" else -1
        generated = 2 * x.usage.completion_tokens
        if finish > start:
            rate = sign * generated / (finish - start)
            events.append((start, sign * x.usage.prompt_tokens, rate))
            events.append((finish, 0.0, -rate))
        else:
            events.append((start, sign * (x.usage.prompt_tokens + generated), 0.0))
    diff = slope = low = high = 0.0
    at = float(begin)
    for when, jump, change in sorted(events):
        when = min(when, end)
        diff += slope * (when - at)
        low, high = min(low, diff), max(high, diff)
        diff += jump
        slope += change
        at = when
        low, high = min(low, diff), max(high, diff)
    return high - low


def quota(
    url: str, *, workers: int, step_ms: float, per_minute: int, run_s: float, every_s: float
) -> dict[str, float]:
    """A tenant limited to ``per_minute`` tokens, backlogged for ``run_s``, beside a trickle."""
    limit = {"tokens_per_minute": per_minute}
    budget: dict[str, object] = {"max_batch_tokens": BATCH_TOKENS}
    with TenantCase(url, "quota", "fair", workers, step_ms, worker=budget, capped=limit) as case:
        c = case.client
        capped = c.submit_many(["q" * 32] * 2000, tenant="capped", max_new_tokens=16)
        trickle: list[str] = []
        n = int(run_s / every_s)
        t = threading.Thread(
            target=lambda: trickle.extend(trickle_requests(c, n, every_s, "other"))
        )
        t.start()
        t.join()
        others = c.results(trickle, timeout=120)
        done = [x for x in (c.status(i) for i in capped) if x.status == "succeeded"]
    finish = sorted(
        ((x.timings.finished_unix_ms or 0), x.usage.prompt_tokens + x.usage.completion_tokens)
        for x in done
    )
    most = 0
    for i, (start, _) in enumerate(finish):  # every 60 s window that starts at a finish
        most = max(most, sum(tok for ms, tok in finish[i:] if ms < start + 60_000))
    batch_tokens = BATCH_TOKENS
    return {
        "limit": float(per_minute),
        "most_in_60s": float(most),
        "one_batch_tokens": float(batch_tokens),
        "served_requests": float(len(done)),
        "other_wait_p50_ms": _waits(others)["p50"],
        "other_wait_p99_ms": _waits(others)["p99"],
    }


def run_tenants(url: str, *, quick: bool = False) -> TenantsReport:
    """Every case (a smaller set with ``quick``)."""
    workers, step_ms = (2, 2.0) if quick else (3, 2.0)
    # B's 60 a round arrive while the flood (~3.5 s) lasts: 120 in 2 rounds, a p99 that is not
    # the largest.
    flood, trickle, every_s = (600, 6, 0.05) if quick else (5000, 60, 0.05)
    report = TenantsReport(
        workers=workers,
        step_ms=step_ms,
        batch_size=16,
        flood=flood,
        trickle=trickle,
        batch_ms=step_ms * 16,
    )
    report.idle_wait_ms = idle_trickle(  # as many as beside the flood in all rounds
        url, workers=workers, step_ms=step_ms, trickle=2 * trickle, every_s=every_s
    )
    rounds = 1 if quick else 2
    for i in range(rounds):  # the policies take turns, the first one rotating
        for policy in POLICIES[i % 2 :] + POLICIES[: i % 2]:
            waits, makespan, commands, ran = flood_vs_trickle(
                url,
                policy,
                workers=workers,
                step_ms=step_ms,
                flood=flood,
                trickle=trickle,
                every_s=every_s,
            )
            report.trickle_waits.setdefault(policy, []).extend(waits)
            report.batch_run_ms.setdefault(policy, []).extend(ran)
            report.flood_makespan_s.setdefault(policy, []).append(makespan)
            report.commands_per_request[policy] = commands
    for policy, waits in report.trickle_waits.items():
        report.trickle_wait_ms[policy] = {**_summary(waits), "beside": float(len(waits))}
    # Both backlogged long enough that the order, not a batch's size, sets the gap; 3 rounds
    # (the race between the light tenant's arrival and the batches starting then varies).
    n_light = 600 if quick else 3000  # quick: still more heavy than the first batches take
    for i in range(1 if quick else 3):
        for policy in POLICIES[i % 2 :] + POLICIES[: i % 2]:
            gaps = service_gap(url, policy, workers=workers, step_ms=step_ms / 4, n_light=n_light)
            for at, value in gaps.items():
                report.service_gap_runs.setdefault(policy, {}).setdefault(at, []).append(value)
    report.service_gap = {
        policy: {at: statistics.median(v) for at, v in runs.items()}
        for policy, runs in report.service_gap_runs.items()
    }
    # quick: still 800 requests, four times what 3 workers read ahead at once (64 each): with
    # 200 the first reads emptied an index before anything started (a window of 0, CI saw it).
    report.weights_ratio = weights(url, workers=3, step_ms=step_ms, n=400 if quick else 1200)
    report.five_weights = weights_with_a_kill(
        url, workers=3, step_ms=step_ms, n=100 if quick else 600
    )
    if not quick:
        for policy in POLICIES:
            report.model_wait_ms[policy] = model_case(url, policy, model="tiny")
        report.quota = quota(
            url, workers=workers, step_ms=step_ms, per_minute=6000, run_s=75, every_s=0.5
        )
    return report


def _ms3(w: dict[str, float]) -> str:
    return f"{w.get('p50', 0):.0f} / {w.get('p99', 0):.0f} / {w.get('max', 0):.0f}"


def _listed(values: Sequence[float]) -> str:
    return ", ".join(f"{v:.0f}" for v in values)


def tenants_markdown(rep: TenantsReport) -> str:
    """The report as a BENCHMARKS.md section."""
    fair, fifo = rep.trickle_wait_ms.get("fair", {}), rep.trickle_wait_ms.get("fifo", {})
    goal = 2 * rep.idle_wait_ms.get("p99", 0) + rep.batch_ms
    ran = statistics.median(rep.batch_run_ms.get("fair") or [rep.batch_ms])
    goal_ran = goal - rep.batch_ms + ran
    mk = {p: statistics.median(v) for p, v in rep.flood_makespan_s.items()}

    def gap(policy: str, at: str) -> float:
        return rep.service_gap.get(policy, {}).get(at, 0.0)

    def runs(policy: str, at: str) -> list[float]:
        return rep.service_gap_runs.get(policy, {}).get(at, [])

    lines = [
        f"{rep.workers} echo workers, {rep.step_ms:g} ms a step, batches of {rep.batch_size} "
        f"(one batch: {rep.batch_ms:g} ms); flood {rep.flood} requests, trickle {rep.trickle}.",
        "",
        "| case | fair | fifo (first come) | goal |",
        "|---|---|---|---|",
        f"| B's wait p50 / p99 / max beside the flood, ms (the {fair.get('beside', 0):.0f} / "
        f"{fifo.get('beside', 0):.0f} of B's requests queued while it lasted, all rounds) | "
        f"{_ms3(fair)} | {_ms3(fifo)} | p99 <= {goal:.0f} with the {rep.batch_ms:g} ms of "
        f"simulated steps, <= {goal_ran:.0f} with the {ran:.0f} ms a batch ran (median); B alone: "
        f"{_ms3(rep.idle_wait_ms)} |",
        f"| flood makespan (its first queued to its last finished), s (median of "
        f"{len(rep.flood_makespan_s.get('fair', []))}) | "
        f"{mk.get('fair', 0):.2f} | {mk.get('fifo', 0):.2f} | fair throughput >= 0.98x: "
        f"{mk.get('fifo', 0) / max(mk.get('fair', 1e-9), 1e-9):.3f}x |",
        f"| Redis commands per request | {rep.commands_per_request.get('fair', 0):.2f} | "
        f"{rep.commands_per_request.get('fifo', 0):.2f} | |",
        *(
            f"| largest service gap while both wait, weighted tokens, counted {AT[at]} (median of "
            f"{len(runs('fair', at))}: {_listed(runs('fair', at))} / {_listed(runs('fifo', at))})"
            f" | {gap('fair', at):.0f} | {gap('fifo', at):.0f} | >= 30x smaller: "
            f"{gap('fifo', at) / max(gap('fair', at), 1):.1f}x |"
            for at in ("start", "produced", "finish")
        ),
        f"| the same, counted at start from the first submission (the heavy tenant's lead "
        f"before the light one's arrived included) | {gap('fair', FROM_FIRST):.0f} | "
        f"{gap('fifo', FROM_FIRST):.0f} | "
        f"{gap('fifo', FROM_FIRST) / max(gap('fair', FROM_FIRST), 1):.1f}x |",
        f"| weights 3:1, tokens served while both are backlogged in the queue (to the first "
        f"tenant's last finish: {rep.weights_ratio.get('to_first_end', 0):.2f} : 1) | "
        f"{rep.weights_ratio.get('backlogged', 0):.2f} : 1 | | 2.7-3.3 |",
        f"| weights 3:1, tokens at each start up to the first tenant's last start | "
        f"{rep.weights_ratio.get('to_last_start', 0):.2f} : 1 | | 2.55-3.45 (within 15%) |",
        f"| weights 1, 1, 2, 4, 8, a worker killed a third of the way: largest deviation of a "
        f"tenant's tokens per unit of weight from the mean, to the first tenant's last start | "
        f"{rep.five_weights.get('backlogged', 0):.1%} while all have work queued "
        f"({rep.five_weights.get('to_last_start', 0):.1%} to the first tenant's last start) "
        f"| | <= 7% |",
    ]
    if rep.model_wait_ms:
        m_fair, m_fifo = rep.model_wait_ms["fair"], rep.model_wait_ms["fifo"]
        lines.append(
            f"| real model (continuous, tiny): B's wait p50 / p99, ms | {m_fair['p50']:.0f} / "
            f"{m_fair['p99']:.0f} | {m_fifo['p50']:.0f} / {m_fifo['p99']:.0f} | |"
        )
    if rep.quota:
        q = rep.quota
        lines.append(
            f"| quota {q['limit']:.0f} tokens/min: most served in any 60 s | "
            f"{q['most_in_60s']:.0f} | | <= {q['limit'] + q['one_batch_tokens']:.0f}; the other "
            f"tenant's wait p50 / p99 {q['other_wait_p50_ms']:.0f} / "
            f"{q['other_wait_p99_ms']:.0f} ms |"
        )
    return "\n".join(lines)


def as_dict(rep: TenantsReport) -> dict[str, Any]:
    """JSON-ready: each policy's batch run times as their median, not one per request."""
    import dataclasses

    out = dataclasses.asdict(rep)
    out["batch_run_ms"] = {p: statistics.median(v) for p, v in rep.batch_run_ms.items() if v}
    return out
