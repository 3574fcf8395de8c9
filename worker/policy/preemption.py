"""Preemption (#41): which running requests yield their places to higher-priority ones that
wait, and which paused ones run again. Pure: no Redis, no engine.

With every place of an iteration-level engine taken, a request that waits with a priority above
some running request's takes the place of the lowest-priority running one below it, the most
recently started first (it has generated the least, so the least work is done again). A paused
request runs again as soon as a place is free once the waiting requests that outrank it have
theirs: the highest priority first, then the one paused first (before waiting requests of its
own priority: it waited already). Priorities are the requests' own (not aged): a low
request that waited long rises in the order of what starts, never to preempt.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

RANK = {"high": 3, "normal": 2, "low": 1}


@dataclass(frozen=True)
class Running:
    """A request the engine runs (or has paused): its key, priority and start time."""

    key: str
    priority: str
    started_ms: int


def victims(running: Sequence[Running], waiting: Sequence[str], free: int) -> list[str]:
    """The running requests (keys) that yield to ``waiting`` (the priorities of requests that
    wait to start, in any order) when ``free`` places are left: one for each waiting request
    beyond the free places that outranks the lowest running request left."""
    want = sorted((RANK[p] for p in waiting), reverse=True)[max(0, free) :]
    pool = sorted(running, key=lambda r: (RANK[r.priority], -r.started_ms))
    out: list[str] = []
    for rank in want:
        if not pool or RANK[pool[0].priority] >= rank:
            break
        out.append(pool.pop(0).key)
    return out


def to_resume(paused: Sequence[Running], waiting: Sequence[str], free: int) -> list[str]:
    """The paused requests (keys, ``paused`` in the order they were paused) that run again in
    ``free`` places: the highest priority first, then the earliest paused, each once the
    waiting requests that outrank it have places of their own."""
    order = sorted(range(len(paused)), key=lambda i: (-RANK[paused[i].priority], i))
    out: list[str] = []
    for i in order:
        rank = RANK[paused[i].priority]
        above = sum(1 for p in waiting if RANK[p] > rank)
        if len(out) + above >= free:
            break
        out.append(paused[i].key)
    return out
