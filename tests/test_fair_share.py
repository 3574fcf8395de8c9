"""A fair share of tokens between tenants, within each priority, across the fleet: the keys the
submit script writes, the order the read script (PULL) serves, weights, tokens per minute,
most queued, and VTC's lift of a tenant back from idle. Against a real redis-server; the
pure charge and refund arithmetic is tested on plain data."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from typing import Any

import openai
import pytest
import redis
from genq.common import tenants as registry
from genq.common.errors import QueueFull
from genq.common.fair_share import READ_RULES, weighted_tokens
from genq.common.keys import GROUP, QUEUED, Keys
from genq.common.lua.compose import compose
from genq.common.lua.read import PULL
from genq.common.lua.tenants import COST
from genq.producer import Client
from genq.worker.policy.batching import BatchPolicy, Candidate, next_batch
from genq.worker.policy.fair_share import Refund, Shares, TenantShares, Totals, charge, merged
from genq.worker.policy.ordering import ORDERS

from tests.conftest import WorkerProcess, wait_until


def pull(
    r: redis.Redis,
    keys: Keys,
    room: int,
    *,
    priority: int = 1,
    policy: str = "fair",
    now_ms: int | None = None,
    probe: int = 0,
    held: tuple[str, ...] = (),
    affinity: tuple[int, int] = (0, 150),
) -> list[tuple[str, bytes]]:
    """One worker read (the PULL script) of up to ``room`` entries of one priority
    (0 high, 1 normal, 2 low), at ``now_ms`` (default: Redis' clock), with a batch budget of
    100,000 tokens, and ``probe`` more from tenants not ``held`` (``PRIORITY|TENANT``):
    (tenant, body) per entry, in the order served."""
    rooms = [0, 0, 0]
    rooms[priority] = room
    if now_ms is None:
        seconds, micros = r.time()
        now_ms = seconds * 1000 + micros // 1000
    args = ["reader", policy, now_ms, 100_000, *rooms, 0, probe, *affinity, *held]
    reply: Any = r.eval(PULL, 4, keys.config, *keys.streams(), *args)
    out = []
    for _stream, entries in reply or []:
        for _id, fields in entries:
            body = dict(zip(fields[::2], fields[1::2], strict=True))[b"body"]
            out.append((json.loads(body).get("tenant", "default"), body))
    return out


def served(order: list[tuple[str, bytes]]) -> Counter[str]:
    """Weighted tokens charged per tenant for these entries (what PULL charged)."""
    total: Counter[str] = Counter()
    for tenant, body in order:
        est, max_new = charge(body)
        total[tenant] += est + 2 * max_new
    return total


def test_the_submit_script_indexes_each_request_under_its_tenant(
    redis_url: str, queue: str, r: redis.Redis
) -> None:
    keys = Keys(queue)
    client = Client.from_url(redis_url, queue)
    ids = client.submit_many(["a", "b"], tenant="t1", priority="low")
    client.submit("c", tenant="t2")
    # The script builds these names itself: they must be keys.py's.
    assert r.llen(keys.tenant_index("low", "t1")) == 2
    assert r.llen(keys.tenant_index("normal", "t2")) == 1
    assert r.smembers(keys.active("low")) == {b"t1"}
    assert r.smembers(keys.active("normal")) == {b"t2"}
    assert r.llen(keys.waiting) == 3
    # Delivered at once to the placeholder consumer that holds what waits.
    pending: Any = r.xpending_range(keys.stream("low"), GROUP, "-", "+", 10, QUEUED)
    assert len(pending) == 2
    assert client.status(ids[0]).tenant == "t1"


def test_equal_entry_ids_in_two_priorities_are_indexed_under_their_own_tenants(
    redis_url: str, queue: str, r: redis.Redis
) -> None:
    # The three streams hand out ids independently: within one millisecond the high stream
    # and the low one can give the same id. Set them up so that they do, deterministically
    # (ids in the future: XADD '*' then counts on from the last id), one ahead of the other.
    keys = Keys(queue)
    client = Client.from_url(redis_url, queue)
    client.submit("first", tenant="z")  # makes the streams and the group
    future_ms = int(r.time()[0]) * 1000 + 600_000
    r.execute_command("XSETID", keys.stream("high"), f"{future_ms}-1")
    r.execute_command("XSETID", keys.stream("low"), f"{future_ms}-0")
    ids = client.submit_many(
        [
            {"prompt": "1", "tenant": "a", "priority": "high"},
            {"prompt": "2", "tenant": "a", "priority": "low"},
            {"prompt": "3", "tenant": "b", "priority": "high"},
            {"prompt": "4", "tenant": "b", "priority": "low"},
        ]
    )
    entries = {p: [e[0].decode() for e in r.xrange(keys.stream(p))] for p in ("high", "low")}
    assert set(entries["high"]) & set(entries["low"]), "the set-up should make equal ids"
    for priority in ("high", "low"):
        for tenant in "ab":
            index = [x.decode() for x in r.lrange(keys.tenant_index(priority, tenant), 0, -1)]
            assert len(index) == 1, (priority, tenant, index)
    assert [client.status(i).tenant for i in ids] == ["a", "a", "b", "b"]


@pytest.mark.parametrize("n", [1, 3])
def test_a_read_charges_what_the_python_estimate_says(
    redis_url: str, queue: str, r: redis.Redis, n: int
) -> None:
    keys = Keys(queue)
    client = Client.from_url(redis_url, queue)
    client.submit("héllo wörld " * 7, tenant="t", max_new_tokens=9, n=n)
    [(tenant, body)] = pull(r, keys, 5)
    est, max_new = charge(body)
    assert tenant == "t" and max_new == 9 * n  # n choices: n times the tokens
    assert float(r.zscore(keys.reserved, "t") or 0) == est + 2 * max_new  # read, not started
    assert r.zscore(keys.vtc, "t") is None
    window: Any = r.hgetall(keys.window("t"))
    assert sum(int(v) for v in window.values()) == est + max_new
    assert r.llen(keys.waiting) == 0 and not r.smembers(keys.active("normal"))


@pytest.mark.parametrize(
    "body",
    [
        # The key first where no number follows it (a plain XADD's metadata), then for real.
        b'{"prompt":"a","metadata":{"max_new_tokens":null,"n":"two"},"max_new_tokens":7,"n":3}',
        b'{"prompt":"' + b"x" * 9000 + b'","max_new_tokens" :5,"n": 2}',  # no digits: default
        b'{"prompt":"\\"max_new_tokens\\":99 ' + b"y" * 300 + b'","max_new_tokens":\t11}',
    ],
)
def test_a_read_charges_an_odd_body_as_the_python_estimate_does(
    queue: str, r: redis.Redis, body: bytes
) -> None:
    # PULL finds each number from its key's first place, searched as plain text: the same
    # answer as a pattern search of the whole body (the Python twin's), wherever it is.
    keys = Keys(queue)
    r.xgroup_create(keys.stream("normal"), GROUP, "0", mkstream=True)
    r.xadd(keys.stream("normal"), {"id": "odd-1", "body": body})
    [(tenant, got)] = pull(r, keys, 5)
    est, max_new = charge(got)
    assert tenant == "default" and got == body
    assert float(r.zscore(keys.reserved, "default") or 0) == est + 2 * max_new


def test_a_flood_does_not_hold_back_a_trickle(redis_url: str, queue: str, r: redis.Redis) -> None:
    keys = Keys(queue)
    client = Client.from_url(redis_url, queue)
    client.submit_many([f"flood {i}" for i in range(300)], tenant="a")
    client.submit_many([f"trickle {i}" for i in range(5)], tenant="b")
    first = [t for t, _ in pull(r, keys, 12)]
    assert first.count("b") == 5, first  # not behind a's 300: served in turn
    assert len(pull(r, keys, 400)) == 300 - 7  # and the rest of the flood after
    # First come, first served (--tenant-policy fifo): b waits for the whole flood.
    client.submit_many([f"flood {i}" for i in range(30)], tenant="a")
    client.submit_many([f"trickle {i}" for i in range(5)], tenant="b")
    order = [t for t, _ in pull(r, keys, 40, policy="fifo")]
    assert order == ["a"] * 30 + ["b"] * 5


def test_a_probe_reads_past_a_full_look_ahead_only_tenants_the_reader_holds_none_of(
    redis_url: str, queue: str, r: redis.Redis
) -> None:
    keys = Keys(queue)
    client = Client.from_url(redis_url, queue)
    client.submit_many([f"flood {i}" for i in range(100)], tenant="a")
    assert [t for t, _ in pull(r, keys, 8)] == ["a"] * 8  # the look-ahead: a's only
    assert pull(r, keys, 0, probe=4, held=("normal|a",)) == []  # nobody else waits
    client.submit_many([f"late {i}" for i in range(10)], tenant="b")
    # Full (no room): the probe brings b, whom the reader holds none of, and no more of a.
    probed = [t for t, _ in pull(r, keys, 0, probe=4, held=("normal|a",))]
    assert probed == ["b"] * 4
    assert pull(r, keys, 0, probe=4, held=("normal|a", "normal|b")) == []
    # With room: the room goes by service as always, and the probe adds what the room did
    # not bring of tenants held none of (here the read's own a's count as held).
    r.zincrby(keys.vtc, 1_000_000, "b")  # b far ahead: the room is all a's
    assert Counter(t for t, _ in pull(r, keys, 6, probe=3)) == {"a": 6, "b": 3}


def test_weights_share_the_tokens_three_to_one_while_both_wait(
    redis_url: str, queue: str, r: redis.Redis
) -> None:
    keys = Keys(queue)
    registry.update(r, keys, "big", weight=3)
    client = Client.from_url(redis_url, queue)
    client.submit_many(["x" * 40] * 400, tenant="big")
    client.submit_many(["x" * 40] * 400, tenant="small")
    order = pull(r, keys, 200)
    share = served(order)
    assert 2.7 <= share["big"] / share["small"] <= 3.3, share


def test_a_heavier_tenant_gets_the_same_tokens_not_the_same_requests(
    redis_url: str, queue: str, r: redis.Redis
) -> None:
    keys = Keys(queue)
    client = Client.from_url(redis_url, queue)
    client.submit_many(["x" * 400] * 100, tenant="heavy", max_new_tokens=100)
    client.submit_many(["x" * 40] * 500, tenant="light", max_new_tokens=10)
    order = pull(r, keys, 300)
    # The largest gap in weighted tokens charged while both wait: one heavy request, at most.
    gap, running = 0, Counter[str]()
    for tenant, body in order:
        est, max_new = charge(body)
        running[tenant] += est + 2 * max_new
        gap = max(gap, abs(running["heavy"] - running["light"]))
    heaviest = max(sum(charge(b)) + charge(b)[1] for _, b in order)
    assert gap <= heaviest, (gap, heaviest)


def test_a_tenant_over_its_tokens_per_minute_waits_and_others_do_not(
    redis_url: str, queue: str, r: redis.Redis
) -> None:
    keys = Keys(queue)
    client = Client.from_url(redis_url, queue)
    client.submit_many(["y" * 36] * 50, tenant="capped", max_new_tokens=10)
    client.submit_many(["y" * 36] * 50, tenant="free", max_new_tokens=10)
    now = 1_800_000_000_000  # the reads' clock, set by hand: no refill between them
    [(first, body)] = pull(r, keys, 1, now_ms=now)  # a tie: the first name first
    assert first == "capped"
    one = sum(charge(body))  # the tokens one request is charged against its limit
    registry.update(r, keys, "capped", tokens_per_minute=5 * one)
    # Its bucket starts full (5 requests' worth): then it waits; the other is not slowed.
    order = [t for t, _ in pull(r, keys, 80, now_ms=now)]
    assert Counter(order) == {"capped": 5, "free": 50}
    assert pull(r, keys, 10, now_ms=now) == []  # nothing else waits but the capped one's
    assert r.llen(keys.tenant_index("normal", "capped")) == 44  # waiting, not failed
    # Refilled at its rate: a request's worth every 12 s (60 s / 5), one read at a time.
    assert [t for t, _ in pull(r, keys, 10, now_ms=now + 12_000)] == ["capped"]
    assert [t for t, _ in pull(r, keys, 10, now_ms=now + 24_000)] == ["capped"]
    registry.delete(r, keys, "capped")  # changed while its requests wait: served again
    assert {t for t, _ in pull(r, keys, 10, now_ms=now + 24_000)} == {"capped"}


def test_max_queued_refuses_that_tenants_submits_only(
    redis_url: str, queue: str, r: redis.Redis
) -> None:
    keys = Keys(queue)
    registry.update(r, keys, "small", max_queued=3)
    client = Client.from_url(redis_url, queue)
    client.submit_many(["1", "2", "3"], tenant="small")
    with pytest.raises(QueueFull, match="tenant 'small' has 3 requests waiting, its limit is 3"):
        client.submit("4", tenant="small")
    client.submit_many(["a", "b", "c", "d"], tenant="other")  # others are unaffected
    assert "small" in [t for t, _ in pull(r, keys, 3)]  # a worker takes one of small's
    client.submit("4", tenant="small")  # room for one more


def test_a_tenant_back_from_idle_gets_no_credit_for_its_idle_time(
    redis_url: str, queue: str, r: redis.Redis
) -> None:
    keys = Keys(queue)
    client = Client.from_url(redis_url, queue)
    client.submit_many(["z"] * 20, tenant="busy")
    pull(r, keys, 10)
    assert float(r.zscore(keys.reserved, "busy") or 0) > 0
    r.zincrby(keys.vtc, 500, "busy")  # what its started requests were charged
    client.submit("back", tenant="idle")  # it has 0: lifted to the lowest active's served
    # Not to what busy merely holds in look-aheads: a hand-back would return that.
    assert float(r.zscore(keys.vtc, "idle") or 0) == 500
    assert [t for t, _ in pull(r, keys, 1)] == ["idle"]  # busy's reserved counts in the order


def test_every_charge_settles_to_what_was_used_when_the_work_is_done(
    redis_url: str, queue: str, r: redis.Redis, start_worker: Callable[..., WorkerProcess]
) -> None:
    keys = Keys(queue)
    client = Client.from_url(redis_url, queue)
    ids = client.submit_many(["a" * 30] * 40, tenant="a", max_new_tokens=6)
    ids += client.submit_many(["b" * 5] * 12, tenant="b", max_new_tokens=3)
    ids += client.submit_many(["c"] * 3, tenant="c", deadline_in_s=0.001)  # expire: never started
    ids += client.submit_many(["d" * 9] * 4, tenant="d", max_new_tokens=5, n=3)  # 3 choices
    worker = start_worker(queue, "--engine", "echo", "--max-batch-size", "8")
    results = client.results(ids, timeout=60)
    assert worker.stop() == 0  # leaving sends the corrections it still held
    used = Counter[str]()
    for x in results:
        used[x.tenant] += x.usage.prompt_tokens + 2 * x.usage.completion_tokens
    assert {x.status for x in results if x.tenant == "c"} == {"expired"}
    for tenant in ("a", "b", "c", "d"):
        assert float(r.zscore(keys.reserved, tenant) or 0) == 0, tenant
        assert float(r.zscore(keys.vtc, tenant) or 0) == used[tenant], tenant


def test_refunds_leave_what_was_used() -> None:
    body = b'{"prompt":"' + b"x" * 100 + b'","max_new_tokens":20}'
    charged = charge(body)
    assert charged == (len(body), 20)
    ran = Refund(tenant="t", charged=charged, prompt_tokens=30, completion_tokens=5)
    assert ran.weighted == charged[0] + 40 - (30 + 10) and ran.tokens == charged[0] + 20 - 35
    never = Refund(tenant="t", charged=charged)
    assert never.weighted == charged[0] + 40 and never.used == 0
    unread = Refund(tenant="t", charged=charged, started=False)  # back to reserved
    assert merged([ran, never, ran, unread]) == {
        "t": Totals(
            served=2 * ran.weighted + never.weighted,
            reserved=unread.weighted,
            tokens=2 * ran.tokens + never.tokens + unread.tokens,
            used=70,
            requests=2,
        )
    }
    assert charge(b'{"prompt":"hi"}')[1] == 64  # the default max_new_tokens


def test_a_fleet_serves_a_trickle_through_a_flood_and_settles_every_charge(
    redis_url: str, queue: str, r: redis.Redis, start_worker: Callable[..., WorkerProcess]
) -> None:
    keys = Keys(queue)
    client = Client.from_url(redis_url, queue)
    flood = client.submit_many([f"f{i}" for i in range(400)], tenant="flood", max_new_tokens=4)
    # A trickle request the killed worker took starts again only once it is reclaimed (1-1.25 s
    # after the kill: idle past --claim-idle-ms, at a check every quarter of it): the flood
    # left for one worker (some 390 requests, 49 batches of 4 steps of 20 ms: about 4 s) must
    # outlast that, or such a request starts behind the whole flood.
    args = ("--engine", "echo", "--echo-step-ms", "20", "--max-batch-size", "8")
    args += ("--claim-idle-ms", "1000")
    first = start_worker(queue, *args)
    start_worker(queue, *args)
    wait_until(lambda: r.llen(keys.waiting) < 390, timeout_s=30)
    trickle = client.submit_many([f"t{i}" for i in range(6)], tenant="trickle", max_new_tokens=4)
    first.kill()  # kill -9 mid-way: what it held is taken over, nothing is lost
    done = {x.id: x for x in client.results(trickle, timeout=60)}
    assert {x.status for x in done.values()} == {"succeeded"}
    results = client.results(flood, timeout=120)
    assert {x.status for x in results} == {"succeeded"}
    # Started before most of the flood (as it started, not as its results were read back:
    # one status read per request took long enough for the flood to end meanwhile).
    trickle_started = max(int(x.timings.started_unix_ms or 0) for x in done.values())
    after = sum(1 for x in results if int(x.timings.started_unix_ms or 0) > trickle_started)
    assert after > 100, "the trickle was not served behind the whole flood"
    assert {x.tenant for x in results} == {"flood"}
    # Every charge settled against what was used: the totals are the real tokens.
    used: Any = r.hgetall(keys.served)
    assert int(used[b"trickle:requests"]) == 6
    assert int(used[b"flood:requests"]) >= 400  # a killed worker's may have run twice
    wait_until(lambda: r.llen(keys.waiting) == 0)


def test_the_gateway_answers_429_when_a_keys_tenant_is_at_its_max_queued(
    redis_url: str, queue: str, r: redis.Redis, tmp_path: Any
) -> None:
    from genq.worker.devtools.gateway_process import GatewayProcess

    registry.update(r, Keys(queue), "team-a", max_queued=1)
    Client.from_url(redis_url, queue).submit("already waiting", tenant="team-a")
    r.hset(Keys(queue).worker("fake"), "model", "echo")  # a live worker, as the gateway sees it
    r.xgroup_createconsumer(Keys(queue).stream("normal"), GROUP, "fake")
    g = GatewayProcess(redis_url, queue, tmp_path / "gw.log", ["--api-key", "ka=team-a"])
    try:
        client = openai.OpenAI(base_url=g.url, api_key="ka", max_retries=0, timeout=30)
        with pytest.raises(openai.RateLimitError, match="max_queued"):
            client.completions.create(model="echo", prompt="one more", max_tokens=2)
    finally:
        g.stop()


def make(key: str, tenant: str, *, enqueued_ms: int, rank: int = 1) -> Candidate:
    return Candidate(
        key=key,
        prompt_tokens=10,
        max_new_tokens=10,
        enqueued_ms=enqueued_ms,
        priority_rank=rank,
        tenant=tenant,
    )


POLICY = BatchPolicy(max_batch_tokens=10_000, max_batch_size=2, priority_aging_ms=1_000)


def test_within_a_priority_the_tenant_with_the_least_service_anchors_the_batch() -> None:
    flood = [make(f"a{i}", "a", enqueued_ms=i) for i in range(10)]
    late = make("b0", "b", enqueued_ms=50_000)  # aged far less than the flood
    now = 60_000
    assert next_batch([*flood, late], now, POLICY).batch[0].key == "a0"  # no shares: oldest
    fair = next_batch([*flood, late], now, POLICY, Shares(service={"a": 40.0, "b": 0.0}))
    assert fair.batch[0].key == "b0"
    # A tie (b was just lifted to a's service) goes to the tenant with fewer waiting here.
    tie = Shares(service={"a": 0.0, "b": 0.0})
    assert next_batch([*flood, late], now, POLICY, tie).batch[0].key == "b0"


def test_aging_still_decides_which_priority_goes_first() -> None:
    old_low = make("low", "a", enqueued_ms=0, rank=2)  # waited 3 agings: ranks with high
    high = make("high", "b", enqueued_ms=2_900, rank=0)
    now = 3_000
    decision = next_batch([high, old_low], now, POLICY, Shares(service={"a": 1e9, "b": 0.0}))
    assert decision.batch[0].key == "low"  # aging is not undone by a tenant's service
    fresh_low = make("low2", "a", enqueued_ms=2_950, rank=2)
    shares = Shares(service={"a": 0.0, "b": 1e9})
    assert next_batch([high, fresh_low], now, POLICY, shares).batch[0].key == "high"


def test_a_batch_is_filled_fairly_by_weight() -> None:
    a = [make(f"a{i}", "a", enqueued_ms=i) for i in range(20)]
    b = [make(f"b{i}", "b", enqueued_ms=100 + i) for i in range(20)]
    policy = BatchPolicy(max_batch_tokens=10_000, max_batch_size=8)
    even = next_batch([*a, *b], 1_000, policy, Shares(service={"a": 0.0, "b": 0.0}))
    assert Counter(c.tenant for c in even.batch) == {"a": 4, "b": 4}
    weighted = Shares(service={"a": 0.0, "b": 0.0}, weights={"a": 3.0})
    three = next_batch([*a, *b], 1_000, policy, weighted)
    assert Counter(c.tenant for c in three.batch) == {"a": 6, "b": 2}
    # One tenant alone (no shares): the oldest, as before tenants.
    assert [c.key for c in next_batch(a, 1_000, policy).batch] == [f"a{i}" for i in range(8)]


def test_tenant_shares_lift_a_newcomer_and_forget_the_absent() -> None:
    shares = TenantShares()
    assert shares.view(["a"]) == {"a": 0.0}
    shares.charge("a", 300)
    assert shares.view(["a", "b"]) == {"a": 300.0, "b": 300.0}  # b: no credit for being away
    shares.charge("b", 100)
    assert shares.view(["b"]) == {"b": 400.0}  # a left: forgotten
    assert shares.view(["a", "b"]) == {"a": 400.0, "b": 400.0}


def test_genq_stats_shows_each_tenant(
    redis_url: str, queue: str, r: redis.Redis, start_worker: Callable[..., WorkerProcess]
) -> None:
    import subprocess
    import sys

    from tests.conftest import ROOT

    def stats() -> dict[str, Any]:
        args = ["stats", "--redis-url", redis_url, "--queue", queue, "--json"]
        out = subprocess.run(
            [sys.executable, "-m", "genq.worker", *args],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=ROOT,
        )
        assert out.returncode == 0, out.stderr
        tenants: dict[str, Any] = json.loads(out.stdout)["tenants"]
        return tenants

    keys = Keys(queue)
    registry.update(r, keys, "slow", weight=2, tokens_per_minute=100)
    client = Client.from_url(redis_url, queue)
    client.submit_many(["a"] * 3, tenant="fast", max_new_tokens=2)
    client.submit_many(["b" * 20] * 4, tenant="slow", max_new_tokens=5)  # 25 tokens each
    before = stats()
    assert (before["fast"]["waiting"], before["slow"]["waiting"]) == (3, 4)
    assert before["slow"]["weight"] == 2 and before["slow"]["tokens_per_minute"] == 100
    start_worker(queue, "--engine", "echo")
    # A tenant with no settings is listed while it has requests waiting or served: for the
    # moment its last ones run, it is in neither (see the closing note of this change).
    wait_until(lambda: stats().get("fast", {}).get("requests_total") == 3)
    # Its bucket (100 tokens) runs dry after a few requests: the rest wait, shown throttled.
    wait_until(lambda: stats()["slow"]["throttled"])
    after = stats()
    assert after["fast"]["tokens_total"] == 3 * (1 + 1)  # prompt "a" + its echo, 1 token each
    slow = after["slow"]
    assert slow["waiting"] >= 1 and slow["waiting"] + slow["requests_total"] == 4
    assert slow["tokens_last_minute"] <= 2 * 100  # its limit + a full bucket, at most


def test_a_lone_tenants_requests_are_read_in_order_and_charged_in_one_go(
    redis_url: str, queue: str, r: redis.Redis
) -> None:
    keys = Keys(queue)
    Client.from_url(redis_url, queue).submit_many([f"p{i}" for i in range(10)], tenant="solo")
    first = pull(r, keys, 4)
    assert [json.loads(b)["prompt"] for _, b in first] == ["p0", "p1", "p2", "p3"]
    rest = pull(r, keys, 10)
    assert [json.loads(b)["prompt"] for _, b in rest] == [f"p{i}" for i in range(4, 10)]
    assert float(r.zscore(keys.reserved, "solo") or 0) == sum(served(first + rest).values())
    assert r.llen(keys.waiting) == 0 and not r.smembers(keys.active("normal"))


def test_a_read_claims_entries_out_of_order_and_far_apart_as_xclaim_would(
    redis_url: str, queue: str, r: redis.Redis
) -> None:
    # The read claims by id alone and reads the fields back over the ids' span (claims.py): an
    # index out of stream order (hand-backs, prefixes picked first), ids far apart, and an
    # entry deleted while waiting must still give exactly XCLAIM's answer, in the index's order.
    keys = Keys(queue)
    Client.from_url(redis_url, queue).submit_many([f"p{i}" for i in range(80)], tenant="solo")
    index = keys.tenant_index("normal", "solo")
    ids = [i.decode() for i in r.lrange(index, 0, -1)]
    order = [ids[70], ids[2], ids[3], ids[4], ids[79], ids[0], ids[40], ids[41]]
    r.delete(index)
    r.rpush(index, *order, *[i for i in ids if i not in order])
    r.xdel(keys.stream("normal"), ids[3])  # gone while waiting: XCLAIM skips it
    got = pull(r, keys, len(order))
    want = [70, 2, 4, 79, 0, 40, 41]
    assert [json.loads(b)["prompt"] for _, b in got] == [f"p{i}" for i in want]
    mine = r.xpending_range(keys.stream("normal"), GROUP, "-", "+", 100, consumername="reader")
    assert sorted(m["message_id"].decode() for m in mine) == sorted(ids[i] for i in want)
    waiting = r.xpending_range(keys.stream("normal"), GROUP, "-", "+", 100, consumername=QUEUED)
    assert len(waiting) == 80 - len(order)
    rest = [i for i in ids if i not in order]  # in order: 1, 5, 6, ..., 78
    r.delete(index)
    r.rpush(index, rest[0], rest[-1], *rest[1:-1])
    far = pull(r, keys, 2)  # their span is longer than the one XRANGE reads
    assert [json.loads(b)["prompt"] for _, b in far] == ["p1", "p78"]
    near = pull(r, keys, 5)  # one after another: all in the span
    assert [json.loads(b)["prompt"] for _, b in near] == ["p5", "p6", "p7", "p8", "p9"]


def test_a_read_over_several_priorities_charges_each_of_them(
    redis_url: str, queue: str, r: redis.Redis
) -> None:
    keys = Keys(queue)
    client = Client.from_url(redis_url, queue)
    client.submit_many(["a"] * 3, tenant="solo", priority="high")
    client.submit_many(["b"] * 2, tenant="solo", priority="normal")
    seconds, micros = r.time()
    rooms = ["reader", "fair", seconds * 1000 + micros // 1000, 100_000, 5, 5, 0]
    reply: Any = r.eval(PULL, 4, keys.config, *keys.streams(), *rooms)
    bodies = [dict(zip(f[::2], f[1::2], strict=True))[b"body"] for _, es in reply for _, f in es]
    assert len(bodies) == 5
    assert float(r.zscore(keys.reserved, "solo") or 0) == sum(
        served([("solo", b) for b in bodies]).values()
    )


def test_a_read_capped_in_all_takes_the_highest_priorities_first(
    redis_url: str, queue: str, r: redis.Redis
) -> None:
    """A continuous worker reads only what it can start (its free slots): capped in all, a
    read never brings a low request beside the high ones (it would run before the high ones
    still waiting)."""
    keys = Keys(queue)
    client = Client.from_url(redis_url, queue)
    client.submit_many(["low"] * 5, priority="low")
    client.submit_many(["high"] * 3, priority="high")
    seconds, micros = r.time()
    now = seconds * 1000 + micros // 1000

    def read(total: int) -> list[str]:
        reply: Any = r.eval(
            PULL, 4, keys.config, *keys.streams(), "reader", "fair", now, 100_000, 4, 4, 4, total
        )
        return [
            json.loads(dict(zip(f[::2], f[1::2], strict=True))[b"body"])["prompt"]
            for _, es in reply or []
            for _, f in es
        ]

    assert read(2) == ["high", "high"]
    assert read(2) == ["high", "low"]
    assert read(0) == ["low"] * 4  # no cap: each priority up to its room


@pytest.mark.parametrize(("prompt", "generated"), [(0, 0), (1, 0), (0, 1), (123, 45), (10**9, 7)])
def test_the_cost_has_one_formula_and_its_lua_twin_agrees(
    r: redis.Redis, prompt: int, generated: int
) -> None:
    lua = compose("return weighted(tonumber(ARGV[1]), tonumber(ARGV[2]))", COST)
    assert r.eval(lua, 0, prompt, generated) == weighted_tokens(prompt, generated)


def test_every_order_reads_by_a_rule_the_read_script_knows(r: redis.Redis, queue: str) -> None:
    assert {order.read_rule for order in ORDERS.values()} <= set(READ_RULES)
    keys = Keys(queue)
    args = [keys.config, *keys.streams(), "me", "prefix", 0, 100, 1, 1, 1, 0, 0, 0, 150]
    with pytest.raises(redis.ResponseError, match="unknown read rule prefix"):
        r.eval(PULL, 4, *args)
