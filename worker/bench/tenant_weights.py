"""Weights in ``genq bench --scenario tenants``: tokens served to tenants of different weights
while they are all backlogged, counted at each request's start; 3:1 over the whole fleet, and
weights 1, 1, 2, 4, 8 with a worker killed mid-way."""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Sequence

from genq.common.keys import Keys
from genq.common.models import Result
from genq.worker.bench.tenant_fleet import TenantCase, both_waiting, weighted


def weights(url: str, *, workers: int, step_ms: float, n: int) -> dict[str, float]:
    """Tokens served to a weight-3 tenant over a weight-1 one while both are backlogged: counted
    at each request's start from when both have a request queued until one has none left queued
    in Redis (a watcher reads their indexes every few ms); and, as before, at finishes until
    the first tenant's last (which adds the tail where one tenant's last requests wait only in
    some workers' look-aheads while the others, work-conserving, serve the other tenant)."""
    with TenantCase(url, "weights", "fair", workers, step_ms, three={"weight": 3}) as case:
        c = case.client
        # One call, both tenants: submitted one after the other, the first one's backlog could
        # all be read into the workers' look-aheads before the second's arrived (its index
        # empty at once: no stretch with both backlogged, a ratio of 0; CI saw it).
        items = [{"prompt": "w" * 32, "tenant": t} for t in ("three", "one") for _ in range(n)]
        ids = c.submit_many(items, max_new_tokens=16)
        with _DrainWatch(case, ("three", "one")) as drained:
            results = c.results(ids, timeout=900)
    begin, _ = both_waiting(results, lambda x: 0, ("three", "one"))
    start = [x for x in results if begin <= (x.timings.started_unix_ms or 0) < drained.at_ms]
    end = min(
        max(x.timings.finished_unix_ms or 0 for x in results if x.tenant == t)
        for t in ("three", "one")
    )
    finish = [x for x in results if (x.timings.finished_unix_ms or 0) < end]
    last = _first_last_start(results, ("three", "one"))
    to_last = [x for x in results if begin <= (x.timings.started_unix_ms or 0) <= last]
    return {
        "backlogged": _ratio(start),
        "to_first_end": _ratio(finish),
        "to_last_start": _ratio(to_last),
    }


class _DrainWatch:
    """Watches the tenants' waiting indexes every few ms until one of them is empty: ``at_ms``
    is when, on Redis' clock (as the results' timings)."""

    def __init__(self, case: TenantCase, tenants: Sequence[str]) -> None:
        self.case, self.tenants = case, tenants
        self.at_ms = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch)

    def _watch(self) -> None:
        keys = Keys(self.case.queue)
        while not self._stop.wait(0.002):
            lengths = [self.case.r.llen(keys.tenant_index("normal", t)) for t in self.tenants]
            if 0 in lengths:
                seconds, micros = self.case.r.time()
                self.at_ms = seconds * 1000 + micros // 1000
                return

    def __enter__(self) -> _DrainWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _first_last_start(results: Sequence[Result], tenants: Sequence[str]) -> int:
    """The earliest of the tenants' last starts: the end of the stretch where all of them had
    work starting."""
    return min(
        max(x.timings.started_unix_ms or 0 for x in results if x.tenant == t) for t in tenants
    )


FIVE_WEIGHTS = {"t1": 1.0, "t2": 1.0, "t3": 2.0, "t4": 4.0, "t5": 8.0}


def weights_with_a_kill(
    url: str, *, workers: int, step_ms: float, n: int, kill: bool = True
) -> dict[str, float]:
    """Five tenants at weights 1, 1, 2, 4, 8, ``n`` requests each, all backlogged; one worker
    killed (SIGKILL) a third of the way through, its requests reclaimed by the others. Tokens
    served per unit of weight, counted at each start from when all have work queued until one
    has none left queued in Redis (``backlogged``), and to the first tenant's last start
    (``to_last_start``): each tenant's over their mean, and the largest deviation."""
    settings = {t: {"weight": w} for t, w in FIVE_WEIGHTS.items()}
    more: dict[str, object] = {"claim_idle_ms": 500}
    with TenantCase(url, "five", "fair", workers, step_ms, worker=more, **settings) as case:
        ids = []
        for tenant in FIVE_WEIGHTS:
            ids += case.client.submit_many(["w" * 32] * n, tenant=tenant, max_new_tokens=16)
        with _DrainWatch(case, tuple(FIVE_WEIGHTS)) as drained:
            waiting = Keys(case.queue).waiting
            while case.r.llen(waiting) > 2 * len(ids) // 3:  # a third taken by the workers
                time.sleep(0.005)
            if kill:
                case.fleet.procs[0].kill()
            results = case.client.results(ids, timeout=900)
    begin, _ = both_waiting(results, lambda x: 0, tuple(FIVE_WEIGHTS))
    out = _per_weight(results, begin, drained.at_ms - 1, "backlogged")
    last = _first_last_start(results, tuple(FIVE_WEIGHTS))
    return {**out, **_per_weight(results, begin, last, "to_last_start")}


def _per_weight(results: Sequence[Result], begin: int, end: int, name: str) -> dict[str, float]:
    """Tokens per unit of weight of each tenant started in [begin, end], over their mean, and
    the largest deviation (``name``)."""
    served = dict.fromkeys(FIVE_WEIGHTS, 0.0)
    for x in results:
        if begin <= (x.timings.started_unix_ms or 0) <= end:
            served[x.tenant] += weighted(x) / FIVE_WEIGHTS[x.tenant]
    mean = statistics.mean(served.values()) or 1.0
    out = {f"{name}:{t}": round(v / mean, 4) for t, v in served.items()}
    out[name] = round(max(abs(v / mean - 1) for v in served.values()), 4)
    return out


def _ratio(results: Sequence[Result]) -> float:
    got = {"three": 0, "one": 0}
    for x in results:
        got[x.tenant] += weighted(x)
    return got["three"] / max(1, got["one"])
