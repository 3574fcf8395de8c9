"""Preemption: which running requests yield their places to higher-priority ones that
wait, and which paused ones run again. Pure: no Redis, no engine.

With every place of an iteration-level engine taken, a request that waits with a priority above
some running request's takes the place of the lowest-priority running one below it, the most
recently started first (it has generated the least, so the least work is done again). A paused
request runs again as soon as a place is free once the waiting requests ahead of it have
theirs: those that outrank it and those of its priority that waited since before it was
paused; the highest priority first, then the one paused first. Priorities are the requests'
own (not aged): a low request that waited long rises in the order of what starts, never to
preempt.

A **time slice** keeps long requests from holding places while others wait at their own
priority: a running request that has run longer than its slice since it
last started yields to a waiting request of equal or higher priority when that pays for the
work it throws away (``worth_pausing``): the waiting one's new tokens plus twice what the
running one has generated in this run are fewer than the new tokens it asks for (never to its
like: a backlog of equal requests would only churn), the one past its slice the
longest-running first. Each pause doubles the request's next slice (``slice_ms``), so a long
request paused again and again still ends: run again from its prompt each time, it does its
work over at most once more in all (1 + 2 + 4 + ... < the last slice), and what arrives after
its pause waits for it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

RANK = {"high": 3, "normal": 2, "low": 1}


MAX_DOUBLINGS = 16
"""A slice doubles at most this many times (it is then ~65,000 base slices: never reached)."""


@dataclass(frozen=True)
class Running:
    """A request the engine runs (or has paused): its key, priority, when its current run
    started (paused: when it was paused), how many times it has yielded its place, the new
    tokens it asks for and those it has generated."""

    key: str
    priority: str
    started_ms: int
    pauses: int = 0
    max_new_tokens: int = 0
    generated: int = 0
    """The new tokens its current run has generated so far (an estimate: a paused request
    starts again from its prompt, so these are what a pause throws away)."""


@dataclass(frozen=True)
class Waiting:
    """A request that waits to start: its priority and the new tokens it asks for."""

    priority: str
    max_new_tokens: int = 0
    since_ms: int = 0
    """When it was enqueued."""


def slice_ms(running: Running, base_ms: int) -> int:
    """How long ``running`` may run while others of its priority wait: ``base_ms``, doubled
    for each time it yielded its place (0: no time slice)."""
    return _slice_ms(running.pauses, base_ms)


def _slice_ms(pauses: int, base_ms: int) -> int:
    return base_ms << min(pauses, MAX_DOUBLINGS) if base_ms > 0 else 0


def past_slice(running: Running, now_ms: int, base_ms: int) -> bool:
    """Whether ``running`` has run past its slice (never without a time slice)."""
    return ran_past_slice(running.started_ms, running.pauses, now_ms, base_ms)


def ran_past_slice(started_ms: int, pauses: int, now_ms: int, base_ms: int) -> bool:
    """``past_slice`` from a run's start and pauses (a worker asks it of every running
    request, several times a turn: no ``Running`` to build)."""
    return base_ms > 0 and now_ms - started_ms >= _slice_ms(pauses, base_ms)


def worth_pausing(running: Running, ask: Waiting) -> bool:
    """Whether ``running`` should yield its place to ``ask`` at its slice: it runs again from
    its prompt, so a pause costs the ``generated`` tokens it has, done again later. For the two
    requests, ``ask`` first and ``running`` after it (started again) end, summed, sooner than
    ``running`` first and ``ask`` after it, exactly when ask + generated < what running has
    left (max_new_tokens - generated). So a request that has done much of its work keeps its
    place, and none yields to a request as long as itself."""
    return ask.max_new_tokens + 2 * running.generated < running.max_new_tokens


def victims(
    running: Sequence[Running],
    waiting: Sequence[Waiting],
    free: int,
    *,
    now_ms: int = 0,
    base_slice_ms: int = 0,
) -> list[str]:
    """The running requests (keys) that yield to ``waiting`` (in any order) when ``free``
    places are left: for each waiting request beyond the free places (highest priority first,
    then fewest tokens), the lowest-priority running request below it (the most recently
    started of them), else, with a time slice (``base_slice_ms`` > 0), a running request of its
    priority or below that ran past its slice and is ``worth_pausing`` for it (the lowest, then
    the earliest started)."""
    asks = sorted(waiting, key=lambda w: (-RANK[w.priority], w.max_new_tokens))[max(0, free) :]
    pool = sorted(running, key=lambda r: (RANK[r.priority], -r.started_ms))
    out: list[str] = []
    for ask in asks:
        rank = RANK[ask.priority]
        if pool and RANK[pool[0].priority] < rank:
            out.append(pool.pop(0).key)
            continue
        over = [
            r
            for r in pool
            if RANK[r.priority] <= rank
            and worth_pausing(r, ask)
            and past_slice(r, now_ms, base_slice_ms)
        ]
        if not over:
            continue
        pick = min(over, key=lambda r: (RANK[r.priority], r.started_ms))
        pool.remove(pick)
        out.append(pick.key)
    return out


def to_resume(paused: Sequence[Running], waiting: Sequence[Waiting], free: int) -> list[str]:
    """The paused requests that run again in ``free`` places: the highest priority first,
    then the earliest paused, each once the waiting requests ahead of it have places of their
    own: those that outrank it, and those of its priority that waited since before it was
    paused (what came after it waits for it, so a request paused again and again still runs)."""
    order = sorted(paused, key=lambda p: (-RANK[p.priority], p.started_ms))
    out: list[str] = []
    for p in order:
        rank = RANK[p.priority]
        ahead = sum(
            1
            for w in waiting
            if RANK[w.priority] > rank or (RANK[w.priority] == rank and w.since_ms < p.started_ms)
        )
        if len(out) + ahead >= free:
            break
        out.append(p.key)
    return out
