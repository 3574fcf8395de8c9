"""The worker's pure decision units, tested as plain data: no Redis, no torch, no clock.

The look-ahead (what a worker holds, and its room per stream), planning within a running batch's
room, the adaptive budget, the suspect gate, and admission's verdicts. The batching rule itself
has its own file (test_batching_policy.py).
"""

from __future__ import annotations

import itertools
import typing
from collections import Counter

import pytest
from genq.common.errors import (
    ContextTooLong,
    MaxNewTokensTooLarge,
    PromptTooLong,
    RequestTooLarge,
)
from genq.common.models import Request
from genq.common.settings import WorkerSettings
from genq.common.wire import decode_request
from genq.worker.policy.admission import Action, Limits, judge_entry, judge_prompt
from genq.worker.policy.arrivals import ArrivalEstimate
from genq.worker.policy.batching import BatchPolicy, Candidate, next_batch
from genq.worker.policy.budget import AdaptiveBudget
from genq.worker.policy.fair_share import FairShare
from genq.worker.policy.lookahead import Held, Lookahead
from genq.worker.policy.ordering import ORDERS, FirstCome, WaitingOrder, make_order
from genq.worker.policy.planning import plan_start
from genq.worker.policy.suspects import Gate, SuspectGate

STREAMS = ["genq:{q}:high", "genq:{q}:normal", "genq:{q}:low"]
_ids = itertools.count(1)


def make_held(
    *,
    stream: str = "genq:{q}:normal",
    prompt_tokens: int = 10,
    max_new_tokens: int = 10,
    enqueued_ms: int = 1_000,
    starts: int = 0,
    priority: str = "normal",
) -> Held:
    n = next(_ids)
    request = Request(
        id=f"r{n}",
        prompt="x",
        max_new_tokens=max_new_tokens,
        priority=priority,  # type: ignore[arg-type]
    )
    return Held(
        stream=stream,
        entry_id=f"{enqueued_ms}-{n}",
        request=request,
        prompt_ids=[0] * prompt_tokens,
        enqueued_ms=enqueued_ms,
        starts=starts,
    )


def make_policy(
    *, max_batch_tokens: int = 1_000, max_batch_size: int = 8, max_wait_ms: int = 0
) -> BatchPolicy:
    return BatchPolicy(
        max_batch_tokens=max_batch_tokens, max_batch_size=max_batch_size, max_wait_ms=max_wait_ms
    )


# -- the look-ahead ------------------------------------------------------------------------


def test_lookahead_room_is_per_stream_and_freed_when_requests_start() -> None:
    la = Lookahead(streams=STREAMS, max_per_stream=3)
    held = [make_held(stream=STREAMS[1]) for _ in range(3)]
    for h in held:
        la.add(h)
    assert la.room() == {STREAMS[0]: 3, STREAMS[1]: 0, STREAMS[2]: 3}
    la.take([held[0].key])
    assert la.room()[STREAMS[1]] == 1
    assert la.holds(held[0].key) and held[0].key in la.starting


def test_lookahead_put_back_makes_a_batch_wait_again_with_its_room_taken() -> None:
    la = Lookahead(streams=STREAMS, max_per_stream=2)
    a, b = make_held(), make_held()
    la.add(a)
    la.add(b)
    batch = la.take([a.key, b.key])
    assert la.room()[a.stream] == 2 and not la.waiting
    la.put_back(batch)
    assert set(la.waiting) == {a.key, b.key} and not la.starting
    assert la.room()[a.stream] == 0


def test_lookahead_entries_cover_waiting_and_starting_until_handed_on() -> None:
    la = Lookahead(streams=STREAMS, max_per_stream=4)
    a, b = make_held(), make_held()
    la.add(a)
    la.add(b)
    la.take([a.key])
    assert sorted(la.entries()) == sorted([(a.stream, a.entry_id), (b.stream, b.entry_id)])
    la.started([a])
    assert la.entries() == [(b.stream, b.entry_id)]
    assert len(la) == 1


def test_the_next_suspect_is_the_oldest_request_started_before() -> None:
    la = Lookahead(streams=STREAMS, max_per_stream=8)
    la.add(make_held(enqueued_ms=1))
    late = make_held(enqueued_ms=30, starts=1)
    early = make_held(enqueued_ms=20, starts=2)
    la.add(late)
    la.add(early)
    assert la.next_suspect() is early
    assert Lookahead(streams=STREAMS, max_per_stream=1).next_suspect() is None


def test_a_held_request_is_costed_and_ranked_once_for_the_policy() -> None:
    h = make_held(prompt_tokens=12, max_new_tokens=30, priority="high")
    assert h.cost_tokens == 42
    assert h.candidate.priority_rank == 0 and h.candidate.key == h.key


# -- planning within the runner's room -----------------------------------------------------


def test_with_nothing_running_the_plan_is_the_batching_policy() -> None:
    cands = [make_held(prompt_tokens=10 * i).candidate for i in range(1, 6)]
    policy = make_policy(max_batch_tokens=100)
    planned = plan_start(
        cands, now_ms=5_000, policy=policy, running=0, running_tokens=0, wait_to_fill=True
    )
    assert planned == next_batch(cands, 5_000, policy)


def test_requests_join_a_running_batch_only_within_what_is_left_of_the_budget() -> None:
    cands = [make_held(prompt_tokens=40, max_new_tokens=10).candidate for _ in range(4)]
    planned = plan_start(
        cands,
        now_ms=5_000,
        policy=make_policy(max_batch_tokens=300),
        running=2,
        running_tokens=150,
        wait_to_fill=False,
    )
    assert len(planned.batch) == 3 and planned.tokens <= 150


def test_nothing_starts_while_the_most_urgent_request_does_not_fit_beside_the_running() -> None:
    big = make_held(prompt_tokens=200, enqueued_ms=1).candidate
    small = make_held(prompt_tokens=5, enqueued_ms=2).candidate
    planned = plan_start(
        [big, small],
        now_ms=5_000,
        policy=make_policy(max_batch_tokens=300),
        running=1,
        running_tokens=150,
        wait_to_fill=False,
    )
    assert planned.batch == [] and planned.reason == "no room"


def test_no_free_slot_means_no_start() -> None:
    planned = plan_start(
        [make_held().candidate],
        now_ms=5_000,
        policy=make_policy(max_batch_size=2),
        running=2,
        running_tokens=40,
        wait_to_fill=False,
    )
    assert planned.batch == []


def busy_arrivals(*, gap_ms: int, last_ms: int) -> ArrivalEstimate:
    arrivals = ArrivalEstimate()
    arrivals.observe(range(last_ms - 10 * gap_ms, last_ms + 1, gap_ms))
    return arrivals


def test_only_a_runner_that_waits_to_fill_waits_for_more_arrivals() -> None:
    cands = [make_held(enqueued_ms=4_995).candidate]
    policy = make_policy(max_wait_ms=50)
    busy = busy_arrivals(gap_ms=5, last_ms=4_995)
    waiting = plan_start(
        cands,
        now_ms=5_000,
        policy=policy,
        running=0,
        running_tokens=0,
        wait_to_fill=True,
        arrivals=busy,
    )
    assert waiting.batch == [] and waiting.wait_ms == 45
    at_once = plan_start(
        cands,
        now_ms=5_000,
        policy=policy,
        running=0,
        running_tokens=0,
        wait_to_fill=False,
        arrivals=busy,
    )
    assert [c.key for c in at_once.batch] == [cands[0].key]


def test_a_lone_request_on_an_idle_queue_starts_at_once() -> None:
    cands = [make_held(enqueued_ms=4_999).candidate]
    policy = make_policy(max_wait_ms=10)
    for arrivals in (
        ArrivalEstimate(),  # nothing known yet
        busy_arrivals(gap_ms=500, last_ms=4_999),  # one request every half second
        busy_arrivals(gap_ms=2, last_ms=3_000),  # a burst long ago, quiet since
    ):
        planned = plan_start(
            cands,
            now_ms=5_000,
            policy=policy,
            running=0,
            running_tokens=0,
            wait_to_fill=True,
            arrivals=arrivals,
        )
        assert [c.key for c in planned.batch] == [cands[0].key], arrivals


# -- arrivals ------------------------------------------------------------------------------


def test_the_arrival_estimate_follows_the_gaps_between_arrivals() -> None:
    arrivals = ArrivalEstimate()
    assert arrivals.expected_gap_ms(now_ms=0) is None
    arrivals.observe([100, 104, 108, 112])  # gaps of 4 ms
    assert arrivals.expected_gap_ms(now_ms=112) == 4
    assert arrivals.worth_waiting(10, now_ms=113) and not arrivals.worth_waiting(3, now_ms=113)
    assert arrivals.expected_gap_ms(now_ms=400) == 288  # quiet since: the gap stretches


def test_arrivals_read_out_of_order_or_again_add_no_false_gaps() -> None:
    arrivals = ArrivalEstimate()
    arrivals.observe([300, 100, 200])  # read from several streams at once
    assert arrivals.mean_gap_ms is not None and 96 <= arrivals.mean_gap_ms <= 100
    arrivals.observe([150])  # an older entry (another priority, or reclaimed)
    assert arrivals.last_ms == 300 and 96 <= arrivals.mean_gap_ms <= 100


def test_waits_that_bring_no_one_stop_and_are_tried_again_each_second() -> None:
    # A client that sends its next request only when the last is answered: arrivals every
    # ~11 ms look like one is coming within a 12 ms window, yet no one ever comes during a wait.
    arrivals = ArrivalEstimate()
    now, waited = 0, 0
    for _ in range(20):
        now += 11
        arrivals.observe([now])
        if arrivals.worth_waiting(12, now_ms=now):
            waited += 1
            arrivals.waiting(now)
            now += 12  # the whole window: nobody came
        arrivals.batch_started()
    assert waited == 3  # three fruitless waits, then it starts at once
    arrivals.observe([now + 500])
    assert not arrivals.worth_waiting(600, now_ms=now + 500)  # one would come, but waits don't pay
    arrivals.observe([now + 1_000])
    assert arrivals.worth_waiting(600, now_ms=now + 1_000)  # a second on: try once more
    # Arrivals during the waits (an open stream): waiting keeps paying, so it goes on.
    busy = ArrivalEstimate()
    t = 0
    busy.observe([t])
    for _ in range(20):
        t += 4
        busy.observe([t])
        assert busy.worth_waiting(12, now_ms=t)
        busy.waiting(t)
        t += 4
        busy.observe([t])  # someone came while it waited
        busy.batch_started()
    assert busy.payoff > 0.9


# -- the adaptive budget -------------------------------------------------------------------


def test_out_of_memory_halves_the_budget_to_at_most_half_the_failed_batch() -> None:
    budget = AdaptiveBudget(full_tokens=16_000, backoff_s=60)
    assert budget.lower(failed_tokens=3_000, now_s=100.0) == 1_500
    assert budget.lower(failed_tokens=10_000, now_s=101.0) == 750  # half of what is in force
    assert budget.lower(failed_tokens=1, now_s=102.0) == 1  # never below one token


def test_the_full_budget_comes_back_after_the_backoff_and_only_then() -> None:
    budget = AdaptiveBudget(full_tokens=1_000, backoff_s=60)
    budget.lower(failed_tokens=1_000, now_s=100.0)
    assert not budget.restore_due(159.9) and budget.tokens == 500
    assert budget.restore_due(160.0) and budget.tokens == 1_000
    assert not budget.restore_due(200.0)  # once


# -- the suspect gate ----------------------------------------------------------------------


def test_a_suspect_starts_alone_after_a_flush_and_so_does_the_start_after_it() -> None:
    gate = SuspectGate()
    assert gate.check(suspect_waiting=False, running=0, suspect_running=False) is Gate.OPEN
    assert gate.check(suspect_waiting=True, running=0, suspect_running=False) is Gate.FLUSH_FIRST
    gate.passed(suspect=True)
    assert gate.check(suspect_waiting=False, running=0, suspect_running=False) is Gate.FLUSH_FIRST
    gate.passed(suspect=False)
    assert gate.check(suspect_waiting=False, running=0, suspect_running=False) is Gate.OPEN


def test_nothing_starts_beside_a_suspect_and_a_suspect_waits_for_the_running() -> None:
    gate = SuspectGate()
    assert gate.check(suspect_waiting=False, running=1, suspect_running=True) is Gate.CLOSED
    assert gate.check(suspect_waiting=True, running=3, suspect_running=False) is Gate.CLOSED


def test_a_gate_that_could_not_flush_stays_shut_for_the_suspect() -> None:
    gate = SuspectGate()
    first = gate.check(suspect_waiting=True, running=0, suspect_running=False)
    assert first is Gate.FLUSH_FIRST  # the caller could not flush: it does not call passed()
    assert gate.check(suspect_waiting=True, running=0, suspect_running=False) is Gate.FLUSH_FIRST


# -- admission verdicts --------------------------------------------------------------------

LIMITS = Limits(
    max_new_tokens=100, max_prompt_tokens=50, max_context_tokens=120, max_batch_tokens=140
)


def test_an_entry_without_a_usable_id_is_dead_lettered_with_the_reason() -> None:
    verdict = judge_entry(decode_request("normal", {b"body": b"{}"}), now_ms=0, enqueued_ms=0)
    assert verdict.action is Action.DEAD_LETTER
    assert verdict.error is not None and "'id'" in str(verdict.error)


def test_an_entry_with_an_id_and_a_bad_body_fails_under_that_id() -> None:
    decoded = decode_request("normal", {b"id": b"r1", b"body": b"[]"})
    verdict = judge_entry(decoded, now_ms=0, enqueued_ms=0)
    assert verdict.action is Action.FAIL and verdict.request_id == "r1"
    assert verdict.error is not None and verdict.error.code == "malformed_entry"


def test_an_entry_past_its_deadline_expires_and_a_good_one_runs() -> None:
    body = b'{"prompt": "hi", "deadline_unix_ms": 1000}'
    decoded = decode_request("high", {b"id": b"r2", b"body": body})
    assert judge_entry(decoded, now_ms=1_000, enqueued_ms=0).action is Action.EXPIRE
    assert judge_entry(decoded, now_ms=999, enqueued_ms=0).action is Action.RUN


def test_a_relative_deadline_counts_from_the_entrys_time() -> None:
    body = b'{"prompt": "hi", "deadline_in_ms": 300}'
    decoded = decode_request("high", {b"id": b"r3", b"body": body})
    assert judge_entry(decoded, now_ms=10_299, enqueued_ms=10_000).action is Action.RUN
    assert judge_entry(decoded, now_ms=10_300, enqueued_ms=10_000).action is Action.EXPIRE


def test_a_deadline_of_zero_has_passed_however_the_workers_clock_lags() -> None:
    # The worker's view of Redis' clock can lag it by a millisecond or two (measured to the
    # ms, halfway through a round trip); Redis' own clock is at least the entry's time.
    body = b'{"prompt": "hi", "deadline_in_ms": 0}'
    decoded = decode_request("normal", {b"id": b"r4", b"body": body})
    assert judge_entry(decoded, now_ms=9_998, enqueued_ms=10_000).action is Action.EXPIRE
    later = decode_request(
        "normal", {b"id": b"r5", b"body": b'{"prompt": "hi", "deadline_in_ms": 5}'}
    )
    assert judge_entry(later, now_ms=9_998, enqueued_ms=10_000).action is Action.RUN


def test_prompt_verdicts_name_the_limit_that_was_crossed() -> None:
    ok = Request(id="a", prompt="x", max_new_tokens=20)
    assert judge_prompt(ok, 30, LIMITS).action is Action.RUN
    cases = [
        (Request(id="b", prompt="x", max_new_tokens=101), 10, MaxNewTokensTooLarge),
        (ok, 51, PromptTooLong),
        (Request(id="c", prompt="x", max_new_tokens=90), 40, ContextTooLong),  # together
    ]
    for request, tokens, error in cases:
        verdict = judge_prompt(request, tokens, LIMITS)
        assert verdict.action is Action.FAIL and isinstance(verdict.error, error)
    # Which limit, by its code: the prompt alone, or the prompt with max_new_tokens.
    assert judge_prompt(ok, 51, LIMITS).error.code == "prompt_too_long"  # type: ignore[union-attr]
    context = judge_prompt(Request(id="c", prompt="x", max_new_tokens=90), 40, LIMITS).error
    assert context is not None and context.code == "context_too_long"
    assert "lower max_new_tokens" in str(context)
    wide = Limits(
        max_new_tokens=100, max_prompt_tokens=None, max_context_tokens=None, max_batch_tokens=40
    )
    verdict = judge_prompt(ok, 30, wide)
    assert isinstance(verdict.error, RequestTooLarge)


def test_candidates_are_plain_data_the_batching_policy_reads() -> None:
    cands = [make_held().candidate for _ in range(3)]
    assert all(isinstance(c, Candidate) for c in cands)


def _serve(
    order: WaitingOrder, candidates: list[Candidate], turns: int, **weights: float
) -> Counter[str]:
    """Start ``turns`` batches of 2 under ``order`` (each turn: decide, started); the tenants
    of what started."""
    policy = BatchPolicy(max_batch_tokens=10_000, max_batch_size=2)
    waiting, served = list(candidates), Counter[str]()
    for _ in range(turns):
        batch = order.decide(waiting, 100_000, policy, weights).batch
        order.started(batch)
        served.update(c.tenant for c in batch)
        waiting = [c for c in waiting if c not in batch]
    return served


def _tenant_flood(tenant: str, n: int, first_ms: int) -> list[Candidate]:
    return [
        Candidate(
            key=f"{tenant}{i}",
            prompt_tokens=10,
            max_new_tokens=10,
            enqueued_ms=first_ms + i,
            tenant=tenant,
        )
        for i in range(n)
    ]


def test_the_fair_order_remembers_across_turns_what_each_tenant_started() -> None:
    a, b = _tenant_flood("a", 20, 0), _tenant_flood("b", 20, 1_000)  # a's are all older
    assert _serve(FirstCome(), a + b, 5) == {"a": 10}
    assert _serve(FairShare(), a + b, 5) == {"a": 5, "b": 5}
    assert _serve(FairShare(), a + b, 8, a=3.0) == {"a": 12, "b": 4}
    # A tenant that was away comes back at the least service of those waiting: no credit.
    fair = FairShare()
    assert _serve(fair, a[:10], 3) == {"a": 6}
    assert _serve(fair, a[6:] + b, 4) == {"a": 4, "b": 4}


def test_a_tenant_alone_is_not_charged_and_loses_nothing_by_it() -> None:
    # A tenant alone takes the fair order's short path (no shares weighed, none charged): one
    # that comes back after it must still find the two even, whatever either was served before.
    a, b = _tenant_flood("a", 40, 0), _tenant_flood("b", 40, 0)
    fair = FairShare()
    assert _serve(fair, a[:4] + b[:20], 6) == {"a": 4, "b": 8}  # b was served more
    assert _serve(fair, b[20:30], 5) == {"b": 10}  # b alone: uncharged
    assert _serve(fair, a[4:] + b[30:], 4) == {"a": 4, "b": 4}  # even again, no debt


def test_every_order_is_a_value_of_the_tenant_policy_setting() -> None:
    field = WorkerSettings.model_fields["tenant_policy"]
    assert set(typing.get_args(field.annotation)) == set(ORDERS)
    assert {type(make_order(name)).name for name in ORDERS} == set(ORDERS)
    with pytest.raises(ValueError, match="unknown order 'lifo'"):
        make_order("lifo")
