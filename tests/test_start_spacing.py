"""Staggered starts: a saturated fleet of static workers spreads its batches' starts over a
turn, so that a newcomer waits for the next start anywhere, not a whole batch. The rule is a pure
unit (``worker/policy/spacing.py``); the phases go through a real Redis
(``worker/runtime/spacing.py``); and the fleet is tried end to end."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
import redis
from genq.common.keys import Keys
from genq.producer import Client
from genq.worker.engines.echo import EchoEngine
from genq.worker.policy.batching import Candidate, Decision
from genq.worker.policy.spacing import MIN_HOLD_MS, MIXED_MS, Phase, StartSpacing, hold_ms
from genq.worker.runtime.batch_reads import ReadsDuringBatch
from genq.worker.runtime.clock import now_ms
from genq.worker.runtime.heartbeat import Counters
from genq.worker.runtime.spacing import STALE_MS, StaggeredStarts

from tests.conftest import wait_until, worker_thread

T = 40  # a turn, ms


def candidate(enqueued_ms: int, tenant: str = "default") -> Candidate:
    return Candidate(
        tenant=tenant,
        key=f"k{enqueued_ms}",
        prompt_tokens=4,
        max_new_tokens=16,
        enqueued_ms=enqueued_ms,
    )


# -- the rule ------------------------------------------------------------------------------


def test_a_worker_just_behind_another_holds_half_the_way_to_the_next_start() -> None:
    # The other started 1 ms ago: its next start is 39 ms away. Mid-way: hold 19.
    assert hold_ms(1_000, T, [Phase(999, T)]) == 19
    # Started in the same millisecond: it is behind by 0, its next start a whole turn away.
    assert hold_ms(1_000, T, [Phase(1_000, T)]) == 20


def test_a_hold_is_at_most_a_turn_over_the_workers() -> None:
    # Three workers within 2 ms: the hold that would put this one mid-way (18 ms) is more than
    # a third of a turn; a third it is, and the next round spaces the rest.
    assert hold_ms(1_000, 39, [Phase(999, 39), Phase(998, 39)]) == 13


def test_spread_or_unlike_workers_are_not_held_for() -> None:
    assert hold_ms(1_000, T, []) == 0
    assert hold_ms(1_000, T, [Phase(980, T)]) == 0  # mid-way already
    # Behind by 10 of a 40-ms turn with two workers: half the even spacing (20) away, enough.
    assert hold_ms(1_000, T, [Phase(990, T)]) == 0
    assert hold_ms(1_000, T, [Phase(991, T)]) == 11  # 9 behind, 31 ahead: mid-way
    assert hold_ms(1_000, T, [Phase(1_005, T)]) == 0  # its planned start is ahead: nearer
    assert hold_ms(1_000, T, [Phase(999, 60)]) == 0  # a turn half again as long: drifts apart
    assert hold_ms(1_000, T, [Phase(1_000 - 2 * T, T)]) == 0  # two turns old: gone or idle
    assert hold_ms(1_000, T, [Phase(999, 0)]) == 0  # no turn known
    # A hold shorter than MIN_HOLD_MS is none: behind by 2, ahead by 5, three workers.
    assert MIN_HOLD_MS > (5 - 2) // 2
    assert hold_ms(1_000, 38, [Phase(998, 38), Phase(1_005, 38)]) == 0


MIXED = [candidate(0), candidate(0, tenant="b")]
"""A batch of two tenants: requests can pass a backlog here, so the spacing holds."""


def spacing_after_turns(enabled: bool = True, start_ms: int = 10_000) -> StartSpacing:
    """A spacing that has started four batches of two tenants a turn apart (its turn known),
    the last at ``start_ms``."""
    s = StartSpacing(enabled)
    for k in range(4):
        assert s.hold(MIXED, start_ms - (3 - k) * T, saturated=False) == 0
    assert s.turn_ms == T and s.last_start_ms == start_ms
    return s


def test_turns_are_measured_start_to_start_and_an_idle_spell_is_not_one() -> None:
    s = StartSpacing()
    assert s.hold([candidate(0)], 1_000, saturated=True) == 0
    assert s.turn_ms == 0  # fewer than three turns: nothing is held
    for t in (1_030, 1_060, 1_090, 5_000, 5_030):
        assert s.hold([candidate(0)], t, saturated=True) == 0
    assert s.turn_ms == 30  # the 3,910-ms gap was idle


def test_a_held_batch_waits_for_its_planned_start_then_starts() -> None:
    s = spacing_after_turns()
    s.others = {"b": Phase(10_039, T)}  # it started 1 ms before this worker's next start
    batch = [candidate(0)]
    assert s.hold(batch, 10_040, saturated=True) == 19
    assert s.target_ms == 10_059
    assert s.hold(batch, 10_050, saturated=True) == 9  # the same hold, not a new one
    assert s.hold(batch, 10_059, saturated=True) == 0
    assert s.target_ms is None and s.last_start_ms == 10_059


def test_a_newcomer_is_never_held_and_ends_a_hold_under_way() -> None:
    s = spacing_after_turns()
    s.others = {"b": Phase(10_039, T)}
    newcomer = candidate(10_030)  # arrived within the last turn
    assert s.hold([candidate(0), newcomer], 10_040, saturated=True) == 0
    s.others = {"b": Phase(10_079, T)}
    assert s.hold([candidate(0)], 10_080, saturated=True) == 19
    assert s.hold([candidate(0), candidate(10_085)], 10_085, saturated=True) == 0
    assert s.last_start_ms == 10_085


@pytest.mark.parametrize("enabled, saturated", [(False, True), (True, False)])
def test_off_or_unsaturated_nothing_is_held(enabled: bool, saturated: bool) -> None:
    s = spacing_after_turns(enabled)
    s.others = {"b": Phase(10_039, T)}
    assert s.hold([candidate(0)], 10_040, saturated=saturated) == 0


def test_in_one_tenants_line_nothing_is_held() -> None:
    """Nobody can pass one tenant's backlog of one priority, wherever the starts are: holding
    would only cost. A batch of two tenants (or priorities) makes the spacing hold again for
    ``MIXED_MS``."""
    s = StartSpacing()
    for k in range(5):
        assert s.hold([candidate(0)], 10_000 + k * T, saturated=True) == 0
    s.others = {"b": Phase(10_000 + 5 * T - 1, T)}
    assert s.hold([candidate(0)], 10_000 + 5 * T, saturated=True) == 0
    assert s.hold(MIXED, 10_000 + 6 * T, saturated=True) == 0  # (nobody just behind)
    s.others = {"b": Phase(10_000 + 7 * T - 1, T)}
    assert s.hold([candidate(0)], 10_000 + 7 * T, saturated=True) == 19
    s.target_ms = None
    late = 10_000 + 6 * T + MIXED_MS + 1
    s.others = {"b": Phase(late - 1, T)}
    assert s.hold([candidate(0)], late, saturated=True) == 0


# -- the phases, through Redis -------------------------------------------------------------


def staggered(
    r: redis.Redis, queue: str, consumer: str, last_start_ms: int, clock: Callable[[], int]
) -> StaggeredStarts:
    spacing = StartSpacing()
    for k in range(4):
        spacing.hold(MIXED, last_start_ms - (3 - k) * T, saturated=False)
    return StaggeredStarts(
        r,
        Keys(queue).starts,
        consumer,
        spacing,
        saturated=lambda: True,
        counters=Counters(),
        ttl_s=30,
        clock=clock,
    )


def test_workers_exchange_phases_and_one_just_behind_publishes_its_hold(
    r: redis.Redis, queue: str
) -> None:
    key = Keys(queue).starts
    now = now_ms()
    a = staggered(r, queue, "a", now - 1, lambda: now - 1)
    b = staggered(r, queue, "b", now - T, lambda: now)  # its next start is due now
    r.hset(key, mapping={"junk": "not a phase", "gone": f"{now - STALE_MS - 1_000} {T}"})
    a.exchange()
    b.exchange()
    assert b.spacing.others == {"a": Phase(now - 1, T)}
    assert set(r.hkeys(key)) == {b"a", b"b"}  # the malformed and the minute-old deleted
    assert r.ttl(key) > 0
    # b's next start, 1 ms behind a's: it is held mid-way, and says where to.
    decision = Decision(batch=[candidate(0)], reason="full")
    held = b.held(decision, static=True)
    assert held.reason == "spacing" and not held.batch and held.wait_ms == 19
    assert b.counters.spacing_holds == 1
    planned, turn = (int(x) for x in r.hget(key, "b").split())
    assert turn == T and planned == b.spacing.target_ms
    # a's next start, a turn later, sees b's planned start mid-way: no hold.
    a.exchange()
    assert a.spacing.others["b"] == Phase(planned, T)
    assert hold_ms(now - 1 + T, T, a.spacing.others.values()) == 0
    # A continuous worker (not static) is never held.
    assert a.held(decision, static=False) is decision


def test_the_batch_reads_thread_exchanges_as_a_window_opens_and_after_its_first_read() -> None:
    calls: list[str] = []
    batch_reads = ReadsDuringBatch(
        lambda fetched: calls.append("read") or [], lambda: calls.append("x")
    )
    batch_reads.start()
    try:
        with batch_reads.window(100):
            wait_until(lambda: calls.count("x") == 2, timeout_s=10, every_s=0.005)
            batch_reads.ring()  # a second read: no exchange after it
            wait_until(lambda: calls.count("read") == 2, timeout_s=10, every_s=0.005)
            time.sleep(0.05)
    finally:
        batch_reads.stop()
    assert calls == ["x", "read", "x", "read"]


# -- a fleet, end to end ---------------------------------------------------------------------


@pytest.mark.parametrize("stagger", [True, False])
def test_a_saturated_static_fleet_publishes_its_phases_and_serves_everything(
    r: redis.Redis, redis_url: str, queue: str, stagger: bool
) -> None:
    """Two echo workers of 2 ms steps (a batch of 16 tokens: 32 ms, within the batch-reads
    window) drain a flood: with ``--stagger-starts`` both publish their phases (and any hold
    they make is counted); without, nothing is published or held. Every request ends
    succeeded either way, with the newcomer's text."""
    client = Client.from_url(redis_url, queue)
    settings = {"max_batch_size": 8, "max_wait_ms": 0, "stagger_starts": stagger}
    with (
        worker_thread(redis_url, queue, EchoEngine(step_ms=2.0), consumer="a", **settings) as a,
        worker_thread(redis_url, queue, EchoEngine(step_ms=2.0), consumer="b", **settings) as b,
    ):
        flood = client.submit_many([f"flood {i}" for i in range(320)], max_new_tokens=16)
        if stagger:
            key = Keys(queue).starts
            wait_until(lambda: r.hlen(key) == 2, timeout_s=30)
        newcomer = client.submit("newcomer", tenant="b", max_new_tokens=16)
        results = client.results([*flood, newcomer], timeout=120)
        held = a.counters.spacing_holds + b.counters.spacing_holds
        assert r.hexists(Keys(queue).worker("a"), "spacing_holds")  # (its stats hash)
    client.close()
    assert [x.status for x in results] == ["succeeded"] * 321
    assert results[-1].text.startswith("newcomer")
    if not stagger:
        assert held == 0 and not r.exists(Keys(queue).starts)
