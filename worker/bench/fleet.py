"""``genq bench --scenario fleet``: a fleet of simulated GPU workers on one queue.

Each worker is a real ``genq worker --engine echo --echo-step-ms S`` process: a batch takes
``S`` ms x its longest ``max_new_tokens``, so the ideal schedule is known exactly. Every request
asks for the same ``max_new_tokens``, so a batch on a worker always takes the same time.

- **Bursts**: N requests at once. Makespan (submit to last result) against the ideal, and each
  worker's share of the requests.
- **Poisson arrivals** at a set utilisation of the fleet's capacity: queue waits (enqueue to
  start, as the workers record them) against an ideal central queue simulated in-process on the
  same arrival times: the same servers and batch rule (a free server takes up to a batch of the
  oldest waiting requests at once, the fastest free server first).

Also Redis commands and Redis CPU per request (INFO commandstats and INFO cpu, before and after).
Simulated workers mostly sleep, so up to 32 fit on a 2-core machine.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import redis
from genq.producer import Client
from genq.worker.bench.modes import percentile
from genq.worker.devtools.worker_process import start_worker, wait_until_serving, worker_args

MAX_NEW_TOKENS = 100
"""Every request's length in decode steps (a batch takes step_ms x this)."""


@dataclass(kw_only=True)
class FleetResult:
    """What one scenario measured."""

    name: str
    workers: list[float]
    """Step time of each worker, ms."""
    requests: int
    makespan_s: float | None = None
    ideal_makespan_s: float | None = None
    shares: dict[str, int] = field(default_factory=dict)
    """Requests served per worker (consumer name)."""
    wait_p50_ms: float | None = None
    wait_p99_ms: float | None = None
    ideal_wait_p50_ms: float | None = None
    ideal_wait_p99_ms: float | None = None
    redis_commands_per_request: float = 0.0
    redis_cpu_ms_per_request: float = 0.0


def ideal_central_queue(
    arrivals_s: Sequence[float], batch_s: Sequence[float], batch_size: int
) -> list[float]:
    """Each request's start time under one central queue feeding ``len(batch_s)`` servers
    (server i runs a batch in ``batch_s[i]``): as soon as a server is free and requests wait,
    the fastest free server takes up to ``batch_size`` of the oldest at once."""
    order = sorted(range(len(arrivals_s)), key=lambda i: arrivals_s[i])
    starts = [0.0] * len(arrivals_s)
    free_at = [0.0] * len(batch_s)
    nxt = 0
    while nxt < len(order):
        now = max(min(free_at), arrivals_s[order[nxt]])
        server = min((i for i, f in enumerate(free_at) if f <= now), key=lambda i: batch_s[i])
        taken = 0
        while nxt < len(order) and taken < batch_size and arrivals_s[order[nxt]] <= now:
            starts[order[nxt]] = now
            nxt, taken = nxt + 1, taken + 1
        free_at[server] = now + batch_s[server]
    return starts


def redis_counters(r: redis.Redis) -> tuple[int, float]:
    """Redis' commands run and CPU seconds used so far (INFO commandstats, INFO cpu)."""
    stats: Any = r.info("commandstats")
    calls = sum(int(v["calls"]) for v in stats.values())
    cpu: Any = r.info("cpu")
    return calls, float(cpu["used_cpu_sys"]) + float(cpu["used_cpu_user"])


class Fleet:
    """Echo workers with the given step times on one queue, started and stopped together."""

    def __init__(
        self,
        redis_url: str,
        queue: str,
        step_ms: Sequence[float],
        batch_size: int,
        **settings: object,
    ) -> None:
        """``settings``: more ``genq worker`` settings for every worker."""
        self.redis_url, self.queue = redis_url, queue
        self.step_ms, self.batch_size = list(step_ms), batch_size
        self.settings = settings
        self.procs: list[Any] = []

    def __enter__(self) -> Fleet:
        r = redis.Redis.from_url(self.redis_url)
        for i, step in enumerate(self.step_ms):
            proc = start_worker(
                redis_url=self.redis_url,
                queue=self.queue,
                engine="echo",
                consumer=f"w{i:02d}-{step:g}ms",
                echo_step_ms=step,
                max_batch_size=self.batch_size,
                extra_args=tuple(worker_args(**self.settings)),
            )
            self.procs.append(proc)
        for i, (proc, step) in enumerate(zip(self.procs, self.step_ms, strict=True)):
            wait_until_serving(r, self.queue, f"w{i:02d}-{step:g}ms", proc, timeout_s=300)
        r.close()
        return self

    def __exit__(self, *exc: object) -> None:
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            proc.wait(timeout=60)


def run_burst(
    redis_url: str, name: str, step_ms: Sequence[float], n: int, batch_size: int = 8
) -> FleetResult:
    """``n`` requests at once over workers of these step times."""
    queue = f"fleet-{name}-{int(time.time() * 1000)}"
    r = redis.Redis.from_url(redis_url)
    with Fleet(redis_url, queue, step_ms, batch_size), Client(r, queue) as client:
        calls0, cpu0 = redis_counters(r)
        t0 = time.perf_counter()
        ids = client.submit_many([f"burst {i}" for i in range(n)], max_new_tokens=MAX_NEW_TOKENS)
        results = client.results(ids, timeout=600)
        makespan = time.perf_counter() - t0
        calls1, cpu1 = redis_counters(r)
    batch_s = [s * MAX_NEW_TOKENS / 1000 for s in step_ms]
    ideal = _ideal_burst_makespan(n, batch_s, batch_size)
    return FleetResult(
        name=name,
        workers=list(step_ms),
        requests=n,
        makespan_s=makespan,
        ideal_makespan_s=ideal,
        shares=dict(sorted(Counter(x.worker or "?" for x in results).items())),
        redis_commands_per_request=(calls1 - calls0) / n,
        redis_cpu_ms_per_request=(cpu1 - cpu0) * 1000 / n,
    )


def _ideal_burst_makespan(n: int, batch_s: Sequence[float], batch_size: int) -> float:
    """When the last batch of a burst ends under the ideal central queue."""
    servers = [(0.0, b, i) for i, b in enumerate(batch_s)]
    left, end = n, 0.0
    while left > 0:
        servers.sort(key=lambda s: (s[0] + s[1], s[1]))  # who would finish a batch first
        free_at, b, i = servers[0]
        servers[0] = (free_at + b, b, i)
        end = max(end, free_at + b)
        left -= batch_size
    return end


def run_poisson(
    redis_url: str,
    name: str,
    step_ms: Sequence[float],
    *,
    utilisation: float,
    duration_s: float,
    batch_size: int = 8,
    seed: int = 0,
) -> FleetResult:
    """Poisson arrivals at ``utilisation`` of the fleet's capacity for ``duration_s``."""
    batch_s = [s * MAX_NEW_TOKENS / 1000 for s in step_ms]
    capacity = sum(batch_size / b for b in batch_s)  # requests per second
    rng = random.Random(seed)
    arrivals, t = [], 0.0
    while True:
        t += rng.expovariate(utilisation * capacity)
        if t > duration_s:
            break
        arrivals.append(t)
    queue = f"fleet-{name}-{int(time.time() * 1000)}"
    r = redis.Redis.from_url(redis_url)
    with Fleet(redis_url, queue, step_ms, batch_size), Client(r, queue) as client:
        calls0, cpu0 = redis_counters(r)
        t0 = time.perf_counter()
        ids: list[str] = []
        for at in arrivals:
            delay = at - (time.perf_counter() - t0)
            if delay > 0:
                time.sleep(delay)
            ids.append(client.submit(f"poisson {len(ids)}", max_new_tokens=MAX_NEW_TOKENS))
        results = client.results(ids, timeout=600)
        calls1, cpu1 = redis_counters(r)
    waits = [float(x.timings.queue_wait_ms or 0) for x in results]
    starts = ideal_central_queue(arrivals, batch_s, batch_size)
    ideal = [(s - a) * 1000 for s, a in zip(starts, arrivals, strict=True)]
    return FleetResult(
        name=name,
        workers=list(step_ms),
        requests=len(ids),
        shares=dict(sorted(Counter(x.worker or "?" for x in results).items())),
        wait_p50_ms=percentile(waits, 0.5),
        wait_p99_ms=percentile(waits, 0.99),
        ideal_wait_p50_ms=percentile(ideal, 0.5),
        ideal_wait_p99_ms=percentile(ideal, 0.99),
        redis_commands_per_request=(calls1 - calls0) / max(1, len(ids)),
        redis_cpu_ms_per_request=(cpu1 - cpu0) * 1000 / max(1, len(ids)),
    )


def run_fleet_scenarios(redis_url: str, *, quick: bool = False) -> list[FleetResult]:
    """The issue's scenarios: bursts over 3 and 16 equal workers, a fast and a slow worker,
    2 workers with 1 s batches, and Poisson arrivals at 70% (``quick``: smaller, for tests)."""
    if quick:
        return [run_burst(redis_url, "burst-3", [5, 5, 5], 48)]
    return [
        run_burst(redis_url, "burst-3", [5, 5, 5], 96),
        run_burst(redis_url, "burst-16", [5] * 16, 512),
        run_burst(redis_url, "mixed-5-10", [5, 10], 48),
        run_burst(redis_url, "two-1s", [10, 10], 64),
        run_poisson(redis_url, "poisson-70", [5, 5, 5, 5], utilisation=0.7, duration_s=20),
        run_poisson(redis_url, "poisson-70-mixed", [5, 5, 10, 10], utilisation=0.7, duration_s=20),
    ]


def fleet_markdown(results: Sequence[FleetResult]) -> str:
    """The scenarios as BENCHMARKS.md tables."""
    lines = [
        "| scenario | workers (ms/step) | requests | makespan s | ideal s | ratio | shares "
        "| Redis cmds/req | Redis CPU ms/req |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for x in results:
        if x.makespan_s is None or x.ideal_makespan_s is None:
            continue
        lines.append(
            f"| {x.name} | {_steps(x.workers)} | {x.requests} | {x.makespan_s:.2f} | "
            f"{x.ideal_makespan_s:.2f} | {x.makespan_s / x.ideal_makespan_s:.2f} | "
            f"{_shares(x.shares)} | {x.redis_commands_per_request:.1f} | "
            f"{x.redis_cpu_ms_per_request:.3f} |"
        )
    lines += [
        "",
        "| scenario | workers (ms/step) | requests | wait p50 / p99 ms | ideal central queue "
        "p50 / p99 ms | p99 ratio | shares | Redis cmds/req | Redis CPU ms/req |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for x in results:
        if x.wait_p99_ms is None or x.ideal_wait_p99_ms is None:
            continue
        ratio = x.wait_p99_ms / x.ideal_wait_p99_ms if x.ideal_wait_p99_ms else float("nan")
        lines.append(
            f"| {x.name} | {_steps(x.workers)} | {x.requests} | {x.wait_p50_ms:.0f} / "
            f"{x.wait_p99_ms:.0f} | {x.ideal_wait_p50_ms:.0f} / {x.ideal_wait_p99_ms:.0f} | "
            f"{ratio:.2f} | {_shares(x.shares)} | {x.redis_commands_per_request:.1f} | "
            f"{x.redis_cpu_ms_per_request:.3f} |"
        )
    return "\n".join(lines)


def _steps(workers: Sequence[float]) -> str:
    counts = Counter(workers)
    return ", ".join(f"{n}x{s:g}" for s, n in sorted(counts.items()))


def _shares(shares: dict[str, int]) -> str:
    values = list(shares.values())
    if len(values) > 4:
        return f"{min(values)}-{max(values)} each"
    return " / ".join(str(v) for v in values)
