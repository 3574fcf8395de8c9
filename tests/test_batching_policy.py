"""The batching policy, tested as plain data: no Redis, no torch."""

from __future__ import annotations

import itertools

import pytest
from genq.worker.policy.batching import BatchPolicy, Candidate, effective_rank, next_batch
from hypothesis import given
from hypothesis import strategies as st

_keys = itertools.count()


def make_request(
    *,
    prompt_tokens: int = 10,
    max_new_tokens: int = 10,
    enqueued_ms: int = 0,
    priority: str = "normal",
) -> Candidate:
    rank = {"high": 0, "normal": 1, "low": 2}[priority]
    return Candidate(
        key=f"r{next(_keys)}",
        prompt_tokens=prompt_tokens,
        max_new_tokens=max_new_tokens,
        enqueued_ms=enqueued_ms,
        priority_rank=rank,
    )


def make_policy(
    *,
    max_batch_tokens: int = 10_000,
    max_batch_size: int = 32,
    max_wait_ms: int = 0,
    priority_aging_ms: int = 10_000,
) -> BatchPolicy:
    return BatchPolicy(
        max_batch_tokens=max_batch_tokens,
        max_batch_size=max_batch_size,
        max_wait_ms=max_wait_ms,
        priority_aging_ms=priority_aging_ms,
    )


def test_no_candidates_means_no_batch() -> None:
    d = next_batch([], now_ms=0, policy=make_policy())
    assert d.batch == [] and d.reason == "empty"


def test_token_budget_is_respected() -> None:
    reqs = [make_request(prompt_tokens=40, max_new_tokens=16) for _ in range(10)]
    d = next_batch(reqs, now_ms=0, policy=make_policy(max_batch_tokens=200))
    assert d.tokens <= 200
    assert len(d.batch) == 3  # 3 * 56 = 168; a fourth would make 224


def test_batch_size_is_respected() -> None:
    reqs = [make_request() for _ in range(10)]
    d = next_batch(reqs, now_ms=0, policy=make_policy(max_batch_size=4))
    assert len(d.batch) == 4 and d.reason == "full"


def test_request_over_budget_alone_still_runs_alone() -> None:
    big = make_request(prompt_tokens=500, max_new_tokens=100)
    small = make_request(prompt_tokens=5, max_new_tokens=5, enqueued_ms=1)
    d = next_batch([big, small], now_ms=10, policy=make_policy(max_batch_tokens=100))
    assert d.batch == [big]


def test_similar_lengths_are_grouped() -> None:
    short = [make_request(prompt_tokens=10 + i, enqueued_ms=i) for i in range(4)]
    long = [make_request(prompt_tokens=300 + i, enqueued_ms=10 + i) for i in range(4)]
    mixed = [x for pair in zip(short, long, strict=True) for x in pair]
    d = next_batch(mixed, now_ms=100, policy=make_policy(max_batch_size=4))
    assert set(d.batch) == set(short)


def test_anchor_is_the_oldest_of_the_highest_priority() -> None:
    old_low = make_request(priority="low", enqueued_ms=0)
    new_high = make_request(priority="high", enqueued_ms=50)
    newer_high = make_request(priority="high", enqueued_ms=60)
    d = next_batch(
        [old_low, newer_high, new_high], now_ms=100, policy=make_policy(max_batch_size=1)
    )
    assert d.batch == [new_high]


def test_higher_priority_fills_the_batch_before_lower() -> None:
    lows = [make_request(priority="low", prompt_tokens=10, enqueued_ms=i) for i in range(5)]
    highs = [make_request(priority="high", prompt_tokens=90, enqueued_ms=10 + i) for i in range(3)]
    d = next_batch(lows + highs, now_ms=100, policy=make_policy(max_batch_size=3))
    assert set(d.batch) == set(highs)


def test_lower_priority_fills_spare_room() -> None:
    high = make_request(priority="high", enqueued_ms=5)
    lows = [make_request(priority="low", enqueued_ms=i) for i in range(3)]
    d = next_batch([high, *lows], now_ms=100, policy=make_policy(max_batch_size=8))
    assert d.batch[0] is high and set(d.batch) == {high, *lows}


def test_waiting_raises_priority_one_level_per_aging_interval() -> None:
    low = make_request(priority="low", enqueued_ms=0)
    assert effective_rank(low, now_ms=999, priority_aging_ms=1000) == 2
    assert effective_rank(low, now_ms=1000, priority_aging_ms=1000) == 1
    assert effective_rank(low, now_ms=2000, priority_aging_ms=1000) == 0
    assert effective_rank(low, now_ms=9000, priority_aging_ms=1000) == 0


def test_low_priority_is_not_starved_by_a_stream_of_high() -> None:
    """Simulate: one batch of size 1 per 100 ms, a new high request arriving every 50 ms.
    The low request must be served within 2 aging intervals (plus one batch)."""
    aging_ms = 1000
    policy = make_policy(max_batch_size=1, priority_aging_ms=aging_ms)
    low = make_request(priority="low", enqueued_ms=0)
    waiting = [low]
    served_at = None
    for step in range(200):
        now = step * 100
        waiting += [
            make_request(priority="high", enqueued_ms=now - 50),
            make_request(priority="high", enqueued_ms=now),
        ]
        d = next_batch(waiting, now_ms=now, policy=policy)
        for c in d.batch:
            waiting.remove(c)
        if low in d.batch:
            served_at = now
            break
    assert served_at is not None
    assert served_at <= 2 * aging_ms + 100


def test_shallow_queue_waits_up_to_max_wait() -> None:
    r = make_request(enqueued_ms=0)
    policy = make_policy(max_wait_ms=20)
    d = next_batch([r], now_ms=5, policy=policy)
    assert d.batch == [] and d.reason == "waiting" and d.wait_ms == 15
    d = next_batch([r], now_ms=20, policy=policy)
    assert d.batch == [r] and d.reason == "waited"


def test_full_batch_does_not_wait() -> None:
    reqs = [make_request(enqueued_ms=0) for _ in range(4)]
    d = next_batch(reqs, now_ms=1, policy=make_policy(max_wait_ms=1000, max_batch_size=4))
    assert len(d.batch) == 4


def test_policy_rejects_nonsense_limits() -> None:
    with pytest.raises(ValueError, match="max_batch_size"):
        make_policy(max_batch_size=0)
    with pytest.raises(ValueError, match="max_wait_ms"):
        make_policy(max_wait_ms=-1)


candidate_lists = st.lists(
    st.builds(
        make_request,
        prompt_tokens=st.integers(1, 500),
        max_new_tokens=st.integers(1, 200),
        enqueued_ms=st.integers(0, 10_000),
        priority=st.sampled_from(["high", "normal", "low"]),
    ),
    max_size=60,
)


@given(
    candidate_lists,
    st.integers(1, 3000),
    st.integers(1, 64),
    st.integers(0, 20_000),
)
def test_any_decision_is_within_limits_and_never_empty_when_waited(
    reqs: list[Candidate], budget: int, size: int, now: int
) -> None:
    policy = make_policy(max_batch_tokens=budget, max_batch_size=size)
    d = next_batch(reqs, now_ms=now, policy=policy)
    if not reqs:
        assert d.batch == []
        return
    assert 1 <= len(d.batch) <= size
    assert len(set(d.batch)) == len(d.batch)
    assert d.tokens <= budget or len(d.batch) == 1


@given(
    st.lists(
        st.tuples(
            st.integers(0, 5000),
            st.sampled_from(["high", "normal", "low"]),
            st.integers(1, 50),
            st.integers(1, 50),
        ),
        min_size=1,
        max_size=30,
    ),
    st.integers(0, 20_000),
)
def test_the_batch_follows_effective_rank_then_length_distance(
    specs: list[tuple[int, str, int, int]], now: int
) -> None:
    reqs = [
        make_request(enqueued_ms=t, priority=p, prompt_tokens=n, max_new_tokens=m)
        for t, p, n, m in specs
    ]
    policy = BatchPolicy(
        max_batch_tokens=10**6, max_batch_size=len(reqs), max_wait_ms=0, priority_aging_ms=1000
    )
    batch = next_batch(reqs, now, policy).batch
    rank = {c.key: effective_rank(c, now, 1000) for c in reqs}
    anchor = min(reqs, key=lambda c: (rank[c.key], c.enqueued_ms, c.key))
    assert batch[0] is anchor and len(batch) == len(reqs)

    def distance(c: Candidate) -> int:
        return abs(c.prompt_tokens - anchor.prompt_tokens) + abs(
            c.max_new_tokens - anchor.max_new_tokens
        )

    order = [(rank[c.key], distance(c), c.enqueued_ms) for c in batch[1:]]
    assert order == sorted(order)


@given(
    st.lists(
        st.tuples(st.integers(1, 400), st.integers(1, 64), st.integers(0, 50)),
        min_size=1,
        max_size=40,
    ),
    st.integers(1, 1000),
    st.integers(1, 40),
)
def test_the_fill_takes_every_request_that_fits_what_is_left_in_order(
    specs: list[tuple[int, int, int]], budget: int, size: int
) -> None:
    # First fit, in the policy's order: one that does not fit is passed over and a cheaper
    # one after it still joins (the fill stops early only when none after it could).
    reqs = [make_request(prompt_tokens=n, max_new_tokens=m, enqueued_ms=t) for n, m, t in specs]
    policy = make_policy(max_batch_tokens=budget, max_batch_size=size)
    batch = next_batch(reqs, now_ms=10**6, policy=policy).batch
    anchor = batch[0]

    def order(c: Candidate) -> tuple[int, int, str]:
        distance = abs(c.prompt_tokens - anchor.prompt_tokens)
        return distance + abs(c.max_new_tokens - anchor.max_new_tokens), c.enqueued_ms, c.key

    expected, tokens = [anchor], anchor.cost_tokens
    for c in sorted((c for c in reqs if c is not anchor), key=order):
        if len(expected) < size and tokens + c.cost_tokens <= budget:
            expected.append(c)
            tokens += c.cost_tokens
    assert batch == expected


@given(
    st.lists(
        st.tuples(
            st.integers(0, 5000),
            st.sampled_from(["high", "normal", "low"]),
            st.integers(1, 80),
            st.sampled_from(["a", "b", "c"]),
            st.sampled_from([None, "base-model", "lora-x"]),
        ),
        min_size=1,
        max_size=40,
    ),
    st.integers(0, 20_000),
    st.integers(1, 16),
    st.sampled_from(["fair", "fifo"]),
    st.booleans(),
)
def test_the_affinity_rule_with_nothing_to_group_decides_as_the_order_it_wraps(
    rows: list[tuple[int, str, int, str, str | None]],
    now: int,
    size: int,
    order_name: str,
    prefixes: bool,
) -> None:
    """``Affinity.decide`` hands a pool with no prefix and no adapter of the worker's straight
    to the wrapped order; the full rule gives the same decision for such a pool."""
    from genq.worker.policy.affinity import Affinity
    from genq.worker.policy.ordering import make_order

    rank = {"high": 0, "normal": 1, "low": 2}
    pool = [
        Candidate(
            key=f"k{j}",
            prompt_tokens=p,
            max_new_tokens=8,
            enqueued_ms=ms,
            priority_rank=rank[pr],
            tenant=t,
            model=m,
        )
        for j, (ms, pr, p, t, m) in enumerate(rows)
    ]
    policy = make_policy(max_batch_tokens=400, max_batch_size=size)
    weights = {"a": 1.0, "b": 2.0}
    for started in ([], pool[:3]):
        inner, full = (
            make_order(order_name),
            Affinity(make_order(order_name), prefixes=prefixes, adapters=["other-lora"]),
        )
        inner.started(started)
        full.started(started)
        shortcut = full.decide(pool, now, policy, weights)
        by_rule = next_batch(pool, now, policy, full.preference(pool, weights))
        assert shortcut == inner.decide(pool, now, policy, weights) == by_rule


def test_an_embedding_anchored_batch_takes_no_lower_priority_and_a_generation_still_does() -> None:
    query = make_request(prompt_tokens=12, max_new_tokens=0, priority="high", enqueued_ms=5)
    bulk = [make_request(prompt_tokens=300, max_new_tokens=0, priority="low") for _ in range(4)]
    same = make_request(prompt_tokens=9, max_new_tokens=0, priority="high", enqueued_ms=6)
    d = next_batch([*bulk, query, same], now_ms=10, policy=make_policy())
    assert d.batch == [query, same]  # the low indexing job's inputs wait for the next batch
    d = next_batch(bulk, now_ms=10, policy=make_policy())
    assert d.batch == bulk  # with nothing above them, they fill the batch
    chat = make_request(prompt_tokens=12, max_new_tokens=8, priority="high", enqueued_ms=5)
    low = [make_request(prompt_tokens=30, max_new_tokens=8, priority="low") for _ in range(3)]
    d = next_batch([*low, chat], now_ms=10, policy=make_policy())
    assert d.batch[0] == chat and len(d.batch) == 4  # decode steps shared: the lows ride along
