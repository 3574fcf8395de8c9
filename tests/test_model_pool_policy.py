"""The model pool's decision (``worker/policy/model_pool.py``) on plain data: what a worker
loads and evicts, by each swap policy. No Redis, no engine."""

from __future__ import annotations

from genq.worker.policy.model_pool import Backlog, PoolRules, Resident, Swap, decide, fits

NOW = 1_000_000
RULES = PoolRules(
    capacity=1,
    min_resident_ms=10_000,
    model_wait_ms=30_000,
    model_idle_ms=300_000,
    drain_tokens_per_s=100.0,
)
LOAD = {"A": 1_000, "B": 1_000, "C": 1_000, "D": 1_000}
"""Each load takes 1 s: 100 weighted tokens of work at the drain rate."""


def old(model: str, running: int = 0, used_ago_ms: int = 20_000) -> Resident:
    """A model resident for a minute, last used ``used_ago_ms`` ago."""
    return Resident(model=model, loaded_ms=NOW - 60_000, used_ms=NOW - used_ago_ms, running=running)


def waiting(tokens: int, waited_ms: int = 1_000, rank: int = 2, holders: int = 0) -> Backlog:
    return Backlog(
        waiting=max(1, tokens // 10),
        tokens=tokens,
        oldest_ms=NOW - waited_ms,
        top_rank=rank,
        holders=holders,
    )


def test_a_free_place_is_filled_when_the_backlog_outweighs_the_load() -> None:
    rules = PoolRules(capacity=2, drain_tokens_per_s=100.0)
    busy = {"A": waiting(500)}  # a load delays 100 tokens of A's work
    assert decide({**busy, "B": waiting(150)}, [old("A")], LOAD, NOW, rules) == Swap(
        load="B", evict=None, reason="backlog 150", need=1
    )
    assert decide({**busy, "B": waiting(80)}, [old("A")], LOAD, NOW, rules) is None, "less"
    assert decide({"B": waiting(10)}, [old("A")], LOAD, NOW, rules) is not None, "idle: free"


def test_a_swap_needs_more_waiting_than_the_evicted_model_keeps_plus_the_load() -> None:
    near = {"A": waiting(500), "B": waiting(550)}
    assert decide(near, [old("A")], LOAD, NOW, RULES) is None, "no thrash over a near tie"
    far = {"A": waiting(500), "B": waiting(700)}
    swap = decide(far, [old("A")], LOAD, NOW, RULES)
    assert swap == Swap(load="B", evict="A", reason="backlog 700", need=1)


def test_a_model_stays_its_minimum_residence_and_keeps_its_running_requests() -> None:
    young = Resident(model="A", loaded_ms=NOW - 2_000, used_ms=NOW - 2_000)
    assert decide({"B": waiting(5_000)}, [young], LOAD, NOW, RULES) is None
    assert decide({"B": waiting(5_000)}, [old("A", running=3)], LOAD, NOW, RULES) is None


def test_a_model_is_swapped_out_only_once_idle_as_long_as_its_load_takes() -> None:
    between_waves = old("A", used_ago_ms=600)  # its last requests ended 0.6 s ago
    assert decide({"B": waiting(5_000)}, [between_waves], LOAD, NOW, RULES) is None
    idle = old("A", used_ago_ms=1_000)  # as long as a reload of A takes
    assert decide({"B": waiting(5_000)}, [idle], LOAD, NOW, RULES) == Swap(
        load="B", evict="A", reason="backlog 5000", need=2
    )
    starving = {"B": waiting(10, waited_ms=31_000)}
    assert decide(starving, [between_waves], LOAD, NOW, RULES) is not None, "the bound wins"
    for policy in ("arrival", "collate"):  # the peers' rules have no such wait
        rules = PoolRules(capacity=1, policy=policy, drain_tokens_per_s=100.0)
        assert decide({"B": waiting(5_000)}, [between_waves], LOAD, NOW, rules) is not None


def test_a_starving_model_is_loaded_whatever_else_waits_its_place_drained_first() -> None:
    young_busy = Resident(model="A", loaded_ms=NOW - 2_000, used_ms=NOW, running=4)
    backlogs = {"A": waiting(90_000), "D": waiting(10, waited_ms=31_000, rank=1)}
    swap = decide(backlogs, [young_busy], LOAD, NOW, RULES)
    assert swap == Swap(load="D", evict="A", reason="waited 31 s", drain=True, need=1)


def test_a_model_that_would_starve_before_the_next_look_starves_now() -> None:
    rules = PoolRules(capacity=1, model_wait_ms=30_000, look_ms=250, drain_tokens_per_s=100.0)
    young = Resident(model="A", loaded_ms=NOW - 2_000, used_ms=NOW)
    soon = {"A": waiting(90_000), "D": waiting(10, waited_ms=29_800, rank=1)}
    assert decide(soon, [young], LOAD, NOW, rules) is not None
    later = {"A": waiting(90_000), "D": waiting(10, waited_ms=29_700, rank=1)}
    assert decide(later, [young], LOAD, NOW, rules) is None


def test_a_cold_models_higher_priority_outranks_a_resident_low_backlog() -> None:
    low_running = Resident("A", NOW - 60_000, NOW, running=2, running_rank=1)
    swap = decide({"H": waiting(40, rank=3)}, [low_running], LOAD, NOW, RULES)
    assert swap == Swap("H", "A", "outranks the resident", drain=True, need=1)
    backlogs = {"A": waiting(90_000, rank=1), "H": waiting(40, rank=3)}
    swap = decide(backlogs, [old("A", running=2)], LOAD, NOW, RULES)
    assert swap == Swap("H", "A", "outranks the resident", drain=True, need=1)
    same = {"A": waiting(90_000, rank=3), "H": waiting(40, rank=3)}
    assert decide(same, [old("A", running=2)], LOAD, NOW, RULES) is None, "equal rank: the backlog"


def test_a_model_other_workers_hold_is_loaded_here_only_when_its_backlog_needs_more() -> None:
    # One worker drains 100 tokens/s x 30 s = 3,000 tokens within the wait bound.
    assert decide({"B": waiting(2_000, holders=1)}, [old("A")], LOAD, NOW, RULES) is None
    assert decide({"B": waiting(7_000, holders=2)}, [old("A")], LOAD, NOW, RULES) is not None
    served = {"B": waiting(10, waited_ms=40_000, holders=1)}
    assert decide(served, [old("A")], LOAD, NOW, RULES) is None, "its holder serves it"
    young = Resident(model="A", loaded_ms=NOW - 2_000, used_ms=NOW, running=4)
    alone = {"A": waiting(90_000), "B": waiting(10, waited_ms=40_000, holders=0)}
    swap = decide(alone, [young], LOAD, NOW, RULES)
    assert swap is not None and swap.need == 1, "held by nobody: it starves, one worker loads it"


def test_an_idle_model_is_evicted_alone() -> None:
    idle = old("A", used_ago_ms=301_000)
    assert decide({}, [idle], LOAD, NOW, RULES) == Swap(load=None, evict="A", reason="idle 301 s")
    assert decide({"A": waiting(10)}, [idle], LOAD, NOW, RULES) is None, "something waits"
    assert decide({}, [old("A", used_ago_ms=5_000)], LOAD, NOW, RULES) is None


def test_the_place_taken_is_the_one_that_loses_least() -> None:
    rules = PoolRules(capacity=2, drain_tokens_per_s=100.0)
    held = [old("A", used_ago_ms=1_000), old("B", used_ago_ms=9_000)]
    backlogs = {"A": waiting(50), "B": waiting(50), "C": waiting(5_000)}
    lru = decide(backlogs, held, LOAD, NOW, rules)
    assert lru == Swap("C", "B", "backlog 5000", need=2), "the least recently used"
    backlogs["B"] = waiting(300)
    less = decide(backlogs, held, LOAD, NOW, rules)
    assert less == Swap("C", "A", "backlog 5000", need=2), "the one with less waiting"


def test_arrival_loads_what_the_oldest_request_needs() -> None:
    rules = PoolRules(capacity=1, policy="arrival", drain_tokens_per_s=100.0)
    backlogs = {"A": waiting(9_000, waited_ms=1_000), "B": waiting(10, waited_ms=2_000)}
    swap = decide(backlogs, [old("A")], LOAD, NOW, rules)
    assert swap == Swap("B", "A", "the oldest request", need=1)
    backlogs["A"] = waiting(9_000, waited_ms=3_000)
    assert decide(backlogs, [old("A")], LOAD, NOW, rules) is None, "the oldest is resident's"


def test_collate_drains_the_resident_models_before_the_next() -> None:
    rules = PoolRules(capacity=1, policy="collate", drain_tokens_per_s=100.0)
    backlogs = {"A": waiting(10), "B": waiting(90_000, waited_ms=60_000)}
    assert decide(backlogs, [old("A")], LOAD, NOW, rules) is None, "A's queue first, unbounded"
    backlogs["A"] = Backlog()
    swap = decide(backlogs, [old("A")], LOAD, NOW, rules)
    assert swap == Swap("B", "A", "the resident models drained", need=30)


def test_every_policy_keeps_running_requests() -> None:
    for policy in ("arrival", "collate"):
        rules = PoolRules(capacity=1, policy=policy, drain_tokens_per_s=100.0)  # type: ignore[arg-type]
        busy = old("A", running=1)
        assert decide({"B": waiting(500, waited_ms=50_000)}, [busy], LOAD, NOW, rules) is None


def test_what_fits_is_counted_by_the_largest_models_in_a_share_of_free_memory() -> None:
    """Without ``--resident-models``: N such that the N largest together fit in 60% of what is
    free, at most the whole pool; 0 (the pool cannot work) when not even the largest fits."""
    gib = 2**30
    assert fits([1 * gib, 2 * gib, 3 * gib], 9 * gib) == 2  # 3 + 2 GiB in 5.4 GiB, not 3 + 2 + 1
    assert fits([1 * gib, 1 * gib], 100 * gib) == 2
    assert fits([1 * gib, 7 * gib], 10 * gib) == 0
    assert fits([5 * gib], 10 * gib) == 1
