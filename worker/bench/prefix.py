"""``genq bench --scenario prefix``: what placing requests by prefix does for a fleet whose
engines cache prefixes, measured with echo workers and their simulated caches.

The workload: ``SYSTEMS`` system prompts of ~2,000 tokens (the echo engine's tokens are bytes),
each request one of them plus 64-256 unique tokens, submitted at once; ``WORKERS`` echo
workers, each with a simulated prefix cache that holds about three of the system prompts
(``--echo-cache-tokens``), prefill charged per token it does not hold
(``--echo-prefill-us-per-token``) and a short decode (``--echo-step-ms``). Popularity is
uniform, or Zipf-skewed (s = 1.1). Each variant runs with ``--prefix-aware`` and with
``--no-prefix-aware``, taking turns, on a fresh queue each: the same prompts in the same order.

Online: the uniform workload arriving one by one at 80% of the capacity the offline runs
without placement measured; reported: queue wait + prefill p50 (latency less the decode).

Reported per run: makespan (first submit to last result), the fleet's cache hit rate (cached /
prompt tokens of the results), queue wait p50, and Redis commands per request (INFO
commandstats before and after). A third variant without shared prefixes (short unique prompts)
shows what affinity costs when there is nothing to gain.
"""

from __future__ import annotations

import random
import statistics
import time
from typing import Any

SYSTEMS = 8
SYSTEM_TOKENS = 2_000
WORKERS = 4
CACHE_TOKENS = 10_240  # about three system prompts with their requests' own blocks
HELD_TOKENS = 7_000  # what each worker counts itself as holding: three prompts' prefixes
PREFILL_US_PER_TOKEN = 20.0
STEP_MS = 1.0
MAX_NEW_TOKENS = 8
ONLINE_LOAD = 0.8
"""The online case's arrival rate, as a share of the fleet's capacity without placement."""


def workload(n: int, *, skew: float | None, seed: int = 7) -> list[str]:
    """``n`` prompts: a system prompt (uniform, or Zipf with exponent ``skew``) and a unique
    tail of 64-256 tokens."""
    rng = random.Random(seed)
    systems = [
        "".join(rng.choice("abcdefghij ") for _ in range(SYSTEM_TOKENS)) for _ in range(SYSTEMS)
    ]
    weights = [1.0 if skew is None else 1.0 / (k + 1) ** skew for k in range(SYSTEMS)]
    out = []
    for i in range(n):
        (system,) = rng.choices(systems, weights)
        tail = "".join(rng.choice("klmnopqrst") for _ in range(rng.randint(64, 256)))
        out.append(f"{system}#{i} {tail}")
    return out


def unique_workload(n: int, seed: int = 7) -> list[str]:
    """``n`` short prompts that share nothing."""
    rng = random.Random(seed)
    return [
        f"{i} " + "".join(rng.choice("uvwxyz") for _ in range(rng.randint(64, 256)))
        for i in range(n)
    ]


class _PrefixFleet:
    """``WORKERS`` echo workers with simulated caches on a fresh queue, placement by prefix on
    or off; Redis commands counted from when they serve."""

    def __init__(self, redis_url: str, queue: str, *, aware: bool) -> None:
        import redis
        from genq.producer import Client
        from genq.worker.devtools.worker_process import start_worker

        self.r = redis.Redis.from_url(redis_url)
        self.queue = queue
        self.names = [f"{queue}-w{i}" for i in range(WORKERS)]
        self.procs = [
            start_worker(
                redis_url=redis_url,
                queue=queue,
                consumer=name,
                engine="echo",
                echo_cache_tokens=CACHE_TOKENS,
                echo_prefill_us_per_token=PREFILL_US_PER_TOKEN,
                echo_step_ms=STEP_MS,
                prefix_cache_tokens=HELD_TOKENS,
                max_batch_size=8,
                extra_args=("--prefix-aware",) if aware else ("--no-prefix-aware",),
            )
            for name in self.names
        ]
        self.client = Client.from_url(redis_url, queue)
        self.commands0 = 0

    def __enter__(self) -> _PrefixFleet:
        from genq.worker.devtools.worker_process import wait_until_serving

        for name, proc in zip(self.names, self.procs, strict=True):
            wait_until_serving(self.r, self.queue, name, proc)
        self.commands0 = _commands(self.r)
        return self

    def commands(self) -> int:
        return _commands(self.r) - self.commands0

    def __exit__(self, *exc: object) -> None:
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            proc.wait(timeout=60)
        self.client.close()


def run_once(redis_url: str, queue: str, prompts: list[str], *, aware: bool) -> dict[str, Any]:
    """One run: a fresh fleet on ``queue``, every prompt submitted at once, all results."""
    with _PrefixFleet(redis_url, queue, aware=aware) as fleet:
        t0 = time.perf_counter()
        ids = fleet.client.submit_many(prompts, max_new_tokens=MAX_NEW_TOKENS)
        results = fleet.client.results(ids, timeout=900)
        makespan_s = time.perf_counter() - t0
        commands = fleet.commands()
    prompt = sum(x.usage.prompt_tokens for x in results)
    cached = sum(x.usage.cached_tokens for x in results)
    waits = [x.timings.queue_wait_ms or 0 for x in results]
    return {
        "aware": aware,
        "requests": len(results),
        "succeeded": sum(x.status == "succeeded" for x in results),
        "makespan_s": round(makespan_s, 3),
        "hit_rate": round(cached / prompt, 4) if prompt else 0.0,
        "wait_p50_ms": statistics.median(waits),
        "commands_per_request": round(commands / len(results), 2),
        "per_worker": dict(sorted(_per_worker(results).items())),
    }


def run_online(
    redis_url: str, queue: str, prompts: list[str], *, aware: bool, rate: float
) -> dict[str, Any]:
    """One run: the prompts arriving one by one at ``rate`` a second (exponential gaps,
    seeded), all results. A request's queue wait + prefill is its latency (queued to
    finished) less its decode (``MAX_NEW_TOKENS`` steps)."""
    rng = random.Random(11)
    with _PrefixFleet(redis_url, queue, aware=aware) as fleet:
        t0 = time.perf_counter()
        due = 0.0
        ids = []
        for prompt in prompts:
            due += rng.expovariate(rate)
            time.sleep(max(0.0, t0 + due - time.perf_counter()))
            ids.append(fleet.client.submit(prompt, max_new_tokens=MAX_NEW_TOKENS))
        results = fleet.client.results(ids, timeout=900)
        commands = fleet.commands()
    decode_ms = MAX_NEW_TOKENS * STEP_MS
    latency = [(x.timings.finished_unix_ms or 0) - (x.timings.queued_unix_ms or 0) for x in results]
    prompt_tokens = sum(x.usage.prompt_tokens for x in results)
    cached = sum(x.usage.cached_tokens for x in results)
    return {
        "aware": aware,
        "rate": round(rate, 1),
        "requests": len(results),
        "succeeded": sum(x.status == "succeeded" for x in results),
        "wait_prefill_p50_ms": max(0.0, statistics.median(latency) - decode_ms),
        "latency_p99_ms": sorted(latency)[int(0.99 * (len(latency) - 1))],
        "hit_rate": round(cached / prompt_tokens, 4) if prompt_tokens else 0.0,
        "commands_per_request": round(commands / len(results), 2),
    }


def _per_worker(results: list[Any]) -> dict[str, int]:
    out: dict[str, int] = {}
    for x in results:
        out[str(x.worker)] = out.get(str(x.worker), 0) + 1
    return out


def _commands(r: Any) -> int:
    """Commands Redis ran so far (INFO commandstats: scripts' commands included)."""
    stats = r.info("commandstats")
    return sum(int(v["calls"]) for v in stats.values())


def run_prefix(redis_url: str, *, requests: int, rounds: int) -> dict[str, Any]:
    """Each variant ``rounds`` times, aware and not taking turns (order swapped each round);
    then the online case, at ``ONLINE_LOAD`` of the capacity the offline uniform runs without
    placement by prefix measured (their median throughput)."""
    variants = {
        "uniform": workload(requests, skew=None),
        "zipf": workload(requests, skew=1.1),
        "no shared prefix": unique_workload(requests),
    }
    runs: dict[str, list[dict[str, Any]]] = {}
    for name, prompts in variants.items():
        for k in range(rounds):
            for aware in (True, False) if k % 2 == 0 else (False, True):
                queue = f"bench-prefix-{name.replace(' ', '-')}-{k}-{int(aware)}"
                runs.setdefault(name, []).append(run_once(redis_url, queue, prompts, aware=aware))
    capacity = requests / _median(runs["uniform"], False, "makespan_s")
    online_prompts = workload(requests // 2, skew=None, seed=8)
    online: list[dict[str, Any]] = []
    for k in range(rounds):
        for aware in (True, False) if k % 2 == 0 else (False, True):
            queue = f"bench-prefix-online-{k}-{int(aware)}"
            rate = ONLINE_LOAD * capacity
            online.append(run_online(redis_url, queue, online_prompts, aware=aware, rate=rate))
    return {
        "requests": requests,
        "rounds": rounds,
        "workers": WORKERS,
        "runs": runs,
        "online": online,
        "capacity_per_s": round(capacity, 1),
    }


def _median(runs: list[dict[str, Any]], aware: bool, field: str) -> float:
    return float(statistics.median(x[field] for x in runs if x["aware"] == aware))


def prefix_markdown(res: dict[str, Any]) -> str:
    """The BENCHMARKS.md table: medians per variant, and the ratios."""
    lines = [
        f"{res['requests']} requests at once, {res['workers']} echo workers (cache "
        f"{CACHE_TOKENS} tokens each, {PREFILL_US_PER_TOKEN:g} us/token prefill, "
        f"{STEP_MS:g} ms/step x {MAX_NEW_TOKENS}); medians of {res['rounds']} rounds, "
        "aware and not taking turns.",
        "",
        "| workload | prefix-aware | makespan s | hit rate | wait p50 ms | Redis cmds/request |",
        "|---|---|---|---|---|---|",
    ]
    for name, runs in res["runs"].items():
        for aware in (True, False):
            lines.append(
                f"| {name} | {'on' if aware else 'off'} | "
                f"{_median(runs, aware, 'makespan_s'):.2f} | "
                f"{_median(runs, aware, 'hit_rate'):.1%} | "
                f"{_median(runs, aware, 'wait_p50_ms'):.0f} | "
                f"{_median(runs, aware, 'commands_per_request'):.1f} |"
            )
    lines += ["", "| workload | makespan off / on | hit rate on | throughput on / off |"]
    lines.append("|---|---|---|---|")
    for name, runs in res["runs"].items():
        ratio = _median(runs, False, "makespan_s") / _median(runs, True, "makespan_s")
        lines.append(
            f"| {name} | {ratio:.2f}x | {_median(runs, True, 'hit_rate'):.1%} | {ratio:.3f} |"
        )
    online = res.get("online") or []
    if online:
        on = _median(online, True, "wait_prefill_p50_ms")
        off = _median(online, False, "wait_prefill_p50_ms")
        lines += [
            "",
            f"Online: the uniform workload ({online[0]['requests']} requests) arriving "
            f"at {ONLINE_LOAD:.0%} of the capacity without placement ({res['capacity_per_s']:g} "
            f"requests/s, exponential gaps): {online[0]['rate']:g} requests/s.",
            "",
            "| prefix-aware | queue wait + prefill p50 ms | latency p99 ms | hit rate | "
            "Redis cmds/request |",
            "|---|---|---|---|---|",
        ]
        for aware in (True, False):
            lines.append(
                f"| {'on' if aware else 'off'} | "
                f"{_median(online, aware, 'wait_prefill_p50_ms'):.1f} | "
                f"{_median(online, aware, 'latency_p99_ms'):.0f} | "
                f"{_median(online, aware, 'hit_rate'):.1%} | "
                f"{_median(online, aware, 'commands_per_request'):.1f} |"
            )
        lines += ["", f"Queue wait + prefill p50: {1 - on / off:.0%} lower with placement."]
    return "\n".join(lines)


def run_and_print(params: dict[str, Any]) -> None:
    """``genq bench --scenario prefix`` with the command's parameters."""
    from genq.worker.bench.modes import report_on_redis

    requests, rounds = (240, 1) if params["quick"] else (2000, 3)
    report_on_redis(
        params,
        lambda url: run_prefix(url, requests=requests, rounds=rounds),
        prefix_markdown,
    )
