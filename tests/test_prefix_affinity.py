"""Placement by prefix: keys computed at submission, per tenant, indexed with each waiting
entry; the read prefers what the reader holds, leaves what another live worker holds to it
for the bound, and never lets a hot prefix pin work to a busy or dead worker."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis
from genq.common import script_calls
from genq.common import tenants as registry
from genq.common.errors import InvalidRequest
from genq.common.keys import Keys
from genq.common.lua.compose import compose
from genq.common.lua.prefix_keys import PREFIX_KEYS
from genq.common.lua.read import PULL
from genq.common.prefixes import (
    PREFIX_BYTES,
    adapter_key,
    cache_key_of,
    chat_chain,
    continuation_key,
    prefix_key,
    scoped,
)
from genq.common.settings import WorkerSettings
from genq.producer import Client
from genq.worker.runtime.doorbell import wait_for_ring
from genq.worker.runtime.queue_io import join_lanes
from genq.worker.runtime.read_trip import ReadTrip

from tests.conftest import WorkerProcess, genq_stats, wait_until

SYSTEM = [{"role": "system", "content": "You answer in one word."}]


def chat(*turns: str) -> list[dict[str, str]]:
    out = list(SYSTEM)
    for j, text in enumerate(turns):
        out.append({"role": "user" if j % 2 == 0 else "assistant", "content": text})
    return out


# -- keys ---------------------------------------------------------------------------------


def test_a_chat_is_keyed_by_everything_before_its_newest_message() -> None:
    first = prefix_key(messages=chat("What is 2+2?"))
    assert first == chat_chain(SYSTEM)[-1]
    assert prefix_key(messages=chat("Another question?")) == first, "one system prompt, one key"
    # The next turn resends the conversation and the reply: the key a worker holds after the
    # first turn.
    second = prefix_key(messages=chat("What is 2+2?", "Four.", "And 3+3?"))
    assert second == continuation_key(chat("What is 2+2?"), "Four.")
    assert second != first


def test_a_plain_prompt_is_keyed_by_its_first_kilobyte_and_a_short_one_not_at_all() -> None:
    shared = "x" * PREFIX_BYTES
    assert prefix_key(prompt=shared + "one") == prefix_key(prompt=shared + "two")
    assert prefix_key(prompt="short prompt") is None
    assert prefix_key(prompt="y" + shared) != prefix_key(prompt=shared + "y")


def test_prompt_cache_key_wins_over_the_content() -> None:
    assert prefix_key(prompt="a" * 2000, prompt_cache_key="k1") == cache_key_of("k1")
    assert prefix_key(messages=chat("hi"), prompt_cache_key="k1") == cache_key_of("k1")


@pytest.mark.parametrize("tenant", ["a", "team.b-1"])
@pytest.mark.parametrize("shared", [False, True])
def test_scoping_and_cache_keys_agree_with_their_lua_twins(
    r: redis.Redis, tenant: str, shared: bool
) -> None:
    lua = compose(
        "return {scoped(ARGV[1], ARGV[2], ARGV[3] == '1'), cache_key_of(ARGV[4])}", PREFIX_KEYS
    )
    got = r.eval(lua, 0, tenant, "0123456789abcdef", "1" if shared else "0", "my-key é")
    assert [x.decode() for x in got] == [  # type: ignore[union-attr]
        scoped(tenant, "0123456789abcdef", shared),
        cache_key_of("my-key é"),
    ]


@pytest.mark.parametrize("bad", [123, "", "k" * 257, ["k"]])
def test_a_bad_prompt_cache_key_is_refused_before_anything_reaches_redis(
    redis_url: str, queue: str, r: redis.Redis, bad: Any
) -> None:
    client = Client.from_url(redis_url, queue)
    with pytest.raises(InvalidRequest, match="prompt_cache_key"):
        client.submit("hi", prompt_cache_key=bad)
    assert not r.keys(f"genq:{{{queue}}}*")


# -- the index and the read ---------------------------------------------------------------


def index_items(r: redis.Redis, keys: Keys, tenant: str) -> list[str]:
    return [x.decode() for x in r.lrange(keys.tenant_index("normal", tenant), 0, -1)]


def test_each_waiting_entry_is_indexed_with_its_key_scoped_to_its_tenant(
    redis_url: str, queue: str, r: redis.Redis
) -> None:
    keys = Keys(queue)
    client = Client.from_url(redis_url, queue)
    registry.update(r, keys, "s1", share_prefixes=True)
    registry.update(r, keys, "s2", share_prefixes=True)
    raw = prefix_key(messages=chat("q"))
    assert raw is not None
    for tenant in ("a", "b", "s1", "s2"):
        client.submit(messages=chat("q"), tenant=tenant)
    client.submit("no key: short", tenant="a")
    keys_of = {t: [i.split(" ")[1:] for i in index_items(r, keys, t)] for t in ("a", "b", "s1")}
    assert keys_of["a"] == [[scoped("a", raw)], []]
    assert keys_of["b"] == [[scoped("b", raw)]]
    assert keys_of["a"][0] != keys_of["b"][0], "one tenant's key never meets another's"
    assert keys_of["s1"] == [[scoped("s1", raw, shared=True)]]
    assert index_items(r, keys, "s2")[0].split(" ")[1] == keys_of["s1"][0][0]


def read(
    r: redis.Redis, keys: Keys, me: str, room: int, *, wait_ms: int = 10_000, factor: int = 150
) -> list[str]:
    """One PULL of the normal stream for ``me``; the prompts it got, in order."""
    seconds, micros = r.time()
    now_ms = seconds * 1000 + micros // 1000
    args = [me, "fair", now_ms, 100_000, 0, room, 0, 0, 0, wait_ms, factor]
    reply: Any = r.eval(PULL, 4, keys.config, *keys.streams(), *args)
    out = []
    for _stream, entries in reply or []:
        for _id, fields in entries:
            body = dict(zip(fields[::2], fields[1::2], strict=True))[b"body"]
            out.append(json.loads(body)["prompt"])
    return out


def live(r: redis.Redis, keys: Keys, worker: str, held: int = 0) -> None:
    """``worker`` is alive (its stats hash) and holds ``held`` requests."""
    r.hset(keys.worker(worker), "held", held)
    r.expire(keys.worker(worker), 60)
    r.hset(keys.load, worker, held)


LONG = {p: p * (PREFIX_BYTES + 10) for p in "ABC"}  # three prefixes, by their first kilobyte


def submit_mix(client: Client, order: str) -> None:
    client.submit_many([LONG[p] + f"#{j}" for j, p in enumerate(order)])


def test_the_reader_takes_what_it_holds_before_older_cold_entries(
    redis_url: str, queue: str, r: redis.Redis
) -> None:
    keys = Keys(queue)
    client = Client.from_url(redis_url, queue)
    submit_mix(client, "ABABCB")
    key_b = scoped("default", prefix_key(prompt=LONG["B"]) or "")
    r.hset(keys.holders, key_b, "w1")
    live(r, keys, "w1")
    got = read(r, keys, "w1", 2)
    assert [g[0] for g in got] == ["B", "B"]
    assert [g[-2:] for g in got] == ["#1", "#3"], "its own, oldest first"


def test_what_another_live_worker_holds_waits_for_it_then_goes_to_anyone(
    redis_url: str, queue: str, r: redis.Redis
) -> None:
    keys = Keys(queue)
    client = Client.from_url(redis_url, queue)
    submit_mix(client, "AB")
    r.hset(keys.holders, scoped("default", prefix_key(prompt=LONG["A"]) or ""), "w1")
    live(r, keys, "w1")
    live(r, keys, "w2")
    assert [g[0] for g in read(r, keys, "w2", 4, wait_ms=200)] == ["B"], "A is w1's"
    (item,) = index_items(r, keys, "default")
    assert len(item.split(" ")) == 3, "marked when first passed over"
    assert read(r, keys, "w2", 4, wait_ms=200) == [], "within the bound"
    time.sleep(0.25)
    assert [g[0] for g in read(r, keys, "w2", 4, wait_ms=200)] == ["A"], "past the bound"


def test_a_readers_own_pass_over_ring_goes_on_to_the_idle_holder(
    redis_url: str, queue: str, r: redis.Redis
) -> None:
    """A read that passes entries over rings the doorbell for their holder. If the holder was
    not blocked on it yet (finishing a turn) and the reader's own idle wait takes that ring,
    the reader rings once more and sleeps instead of blocking, so the holder's wait gets it.
    (A fleet test saw the reader take the holder's adapter's requests once the wait bound was
    over: the ring had gone back to the reader, the holder blocked on for seconds.)"""
    keys = Keys(queue)
    settings = WorkerSettings.build({"queue": queue, "engine": "echo"}, env={})
    named = settings.model_copy(update={"consumer": "w2"})
    reader = ReadTrip(r=r, keys=keys, settings=named, read_rule="fair")
    join_lanes(r, keys, settings.heartbeat_ttl_s)
    Client.from_url(redis_url, queue).submit(LONG["A"])
    reader.wait_for_doorbell(50)  # the submission's ring woke the reader, not the holder
    r.hset(keys.holders, scoped("default", prefix_key(prompt=LONG["A"]) or ""), "w1")
    live(r, keys, "w1")
    live(r, keys, "w2")
    assert reader.read(dict.fromkeys(keys.streams(), 4)) == [], "A waits for w1"
    assert reader.left_waiting == 1
    t0 = time.monotonic()
    reader.wait_for_doorbell(5_000)  # takes its own read's ring: rings again, sleeps a tick
    assert time.monotonic() - t0 < 1.0, "no block on the doorbell it just rang"
    assert wait_for_ring(r, keys.doorbells, "w1", 50), "the holder hears it"
    # A relayed ring back at the reader is not rung a third time: one relay a pass-over.
    r.xadd(keys.doorbell, {"n": 1, "by": "w2", "relayed": 1})
    reader.wait_for_doorbell(50)
    assert not wait_for_ring(r, keys.doorbells, "w1", 20), "taken by the reader, not rung on"


def test_a_busy_or_dead_holder_claims_nothing(redis_url: str, queue: str, r: redis.Redis) -> None:
    keys = Keys(queue)
    client = Client.from_url(redis_url, queue)
    submit_mix(client, "AA")
    r.hset(keys.holders, scoped("default", prefix_key(prompt=LONG["A"]) or ""), "busy dead")
    live(r, keys, "busy", held=10)  # mean (10 + 0) / 2 = 5: above 1.5 x 5 + 1
    live(r, keys, "w2", held=0)
    r.hset(keys.load, "dead", 0)  # a load, but no stats hash: it died
    assert [g[0] for g in read(r, keys, "w2", 1)] == ["A"]
    assert not r.hexists(keys.load, "dead"), "a dead worker's load is dropped"
    live(r, keys, "busy", held=1)  # no longer above the bound: it holds A again
    assert read(r, keys, "w2", 1) == []
    assert r.scard(keys.active("normal")) == 1, "still waiting: the tenant stays active"


def test_without_affinity_the_read_takes_entries_in_order(
    redis_url: str, queue: str, r: redis.Redis
) -> None:
    keys = Keys(queue)
    client = Client.from_url(redis_url, queue)
    submit_mix(client, "ABAB")
    r.hset(keys.holders, scoped("default", prefix_key(prompt=LONG["B"]) or ""), "w2")
    live(r, keys, "w2")
    got = read(r, keys, "w1", 4, wait_ms=0)
    assert [g[0] for g in got] == ["A", "B", "A", "B"]


# -- inside a worker: the prefix rule over the order, and what it holds (pure) -------------


def cand(key: str, *, prefix: str | None, at: int, tenant: str = "t", tokens: int = 100) -> Any:
    from genq.worker.policy.batching import Candidate

    return Candidate(
        key=key,
        prompt_tokens=tokens,
        max_new_tokens=8,
        enqueued_ms=at,
        tenant=tenant,
        prefix=prefix,
    )


def decide(order: Any, candidates: list[Any], size: int) -> list[str]:
    from genq.worker.policy.batching import BatchPolicy

    policy = BatchPolicy(
        max_batch_tokens=100_000, max_batch_size=size, max_wait_ms=0, priority_aging_ms=10_000
    )
    return [c.key for c in order.decide(candidates, 1_000, policy, {}).batch]


def test_same_prefix_requests_share_a_batch_and_the_oldest_still_anchors() -> None:
    from genq.worker.policy.ordering import make_order

    pool = [
        cand("a1", prefix="A", at=1),
        cand("b1", prefix="B", at=2, tokens=100),
        cand("b2", prefix="B", at=3),
        cand("a2", prefix="A", at=4, tokens=400),
        cand("a3", prefix="A", at=5, tokens=700),
    ]
    plain = make_order("fifo")
    aware = make_order("fifo", prefix_aware=True)
    assert decide(plain, pool, 3) == ["a1", "b1", "b2"], "by length, prefixes mixed"
    assert decide(aware, pool, 3) == ["a1", "a2", "a3"], "the anchor's prefix first"


def test_a_warm_prefix_goes_before_a_cold_one_and_fair_share_still_anchors() -> None:
    from genq.worker.policy.ordering import make_order

    aware = make_order("fair", prefix_aware=True)
    aware.started([cand("w", prefix="W", at=0)])  # W is in the engine now
    pool = [
        cand("x1", prefix="X", at=1, tenant="t1"),
        cand("c1", prefix="C", at=2, tenant="t1"),
        cand("w1", prefix="W", at=3, tenant="t1"),
        cand("y1", prefix=None, at=4, tenant="t2"),
    ]
    got = decide(aware, pool, 2)
    assert got[0] in ("x1", "y1"), "the fair order picks the anchor, not the prefix"
    assert decide(aware, [p for p in pool if p.tenant == "t1"], 2) == ["x1", "w1"]


def test_holdings_let_go_of_the_least_recently_used_prefix_beyond_capacity() -> None:
    from genq.worker.policy.prefixes import Holdings

    held = Holdings(capacity_tokens=5000)
    assert held.hold("a", 2000) == (True, [])
    assert held.hold("b", 2000) == (True, [])
    assert held.hold("a", 2000) == (False, [])  # used again: most recent
    assert held.hold("c", 2000) == (True, ["b"])
    assert "a" in held and "c" in held and "b" not in held
    assert Holdings(0).hold("a", 1) == (False, [])


# -- a fleet --------------------------------------------------------------------------------


def test_a_worker_killed_while_holding_a_hot_prefix_loses_nothing_and_another_takes_over(
    redis_url: str, queue: str, r: redis.Redis, start_worker: Callable[..., WorkerProcess]
) -> None:
    keys = Keys(queue)
    client = Client.from_url(redis_url, queue)
    # Both take over entries idle for 1 s: the taker's setting is the one that counts (at the
    # default 20 s the dead holder's running batch came back 20 s after the kill, of 30 allowed).
    common = ("--engine", "echo", "--echo-cache-tokens", "65536", "--max-batch-size", "2")
    common += ("--claim-idle-ms", "1000")
    # The holder looks alive for the whole test (its stats hash outlives the kill): only the
    # bound hands its prefix's waiting work to the other worker.
    slow = ("--echo-step-ms", "100", "--heartbeat-ttl-s", "60", "--max-lookahead", "2")
    holder = start_worker(queue, *common, *slow)
    hot = [{"role": "system", "content": "Hot context. " * 100}, {"role": "user", "content": "q"}]
    first = client.generate(messages=hot, max_new_tokens=4, timeout=60)
    assert first.worker == "w0"
    key = scoped("default", prefix_key(messages=hot) or "")
    # Told with its start (the running mark's round trip), not with the holder's next read,
    # which a client reading right after its result could come before (CI saw None here once).
    assert r.hget(keys.holders, key) == b"w0"
    # 3 s a batch of the holder's (30 steps of 100 ms): its 12 would take 18 s, longer than the
    # other worker's start on a busy machine. (At 4 tokens they took 2.4 s, and a CI run saw the
    # holder end all 12 before the other was up: nothing was left to take over.)
    ids = client.submit_many(
        [{"messages": [*hot[:1], {"role": "user", "content": f"q{i}"}]} for i in range(12)],
        max_new_tokens=30,
    )
    wait_until(lambda: client.status(ids[0]).status == "running", timeout_s=30)
    other = start_worker(queue, *common, "--prefix-wait-ms", "300")
    wait_until(lambda: r.exists(keys.worker("w1")), timeout_s=30)
    holder.kill()
    killed = time.monotonic()
    results = client.results(ids, timeout=120)
    assert [x.status for x in results] == ["succeeded"] * 12
    assert {x.worker for x in results} >= {"w1"}
    taken_over = [x for x in results if x.worker == "w1"]
    assert taken_over, "the other worker took the dead holder's prefix"
    assert time.monotonic() - killed < 30
    stats = genq_stats(redis_url, queue)
    assert sum(w.get("succeeded", 0) for w in stats["workers"] if w["consumer"] == "w1") == len(
        taken_over
    ), "each request ran to its end once"
    other.stop()


def test_a_started_requests_prefix_is_told_to_the_fleet_while_it_runs(
    redis_url: str, queue: str, r: redis.Redis, start_worker: Callable[..., WorkerProcess]
) -> None:
    """The hold goes with the start's round trip: the fleet knows where a prefix is cached
    while its first request still runs, and always before that request's result reaches the
    client (who may send the next turn at once)."""
    keys = Keys(queue)
    client = Client.from_url(redis_url, queue)
    cache = ("--echo-cache-tokens", "4096")  # (a worker that keeps no prefix tells none)
    worker = start_worker(queue, "--engine", "echo", "--echo-step-ms", "200", *cache)
    hot = [{"role": "system", "content": "Context. " * 50}, {"role": "user", "content": "q"}]
    request_id = client.submit(messages=hot, max_new_tokens=8)  # 1.6 s of steps
    wait_until(lambda: client.status(request_id).status == "running", timeout_s=30)
    key = scoped("default", prefix_key(messages=hot) or "")
    assert r.hget(keys.holders, key) == b"w0"
    assert client.status(request_id).status == "running"  # told before it ended
    assert client.result(request_id, timeout=30).status == "succeeded"
    worker.stop()


def test_an_entry_handed_back_keeps_its_key_and_its_place(
    redis_url: str, queue: str, r: redis.Redis
) -> None:
    from genq.common.lua.hand_back import GIVE_BACK

    keys = Keys(queue)
    client = Client.from_url(redis_url, queue)
    submit_mix(client, "AB")
    before = index_items(r, keys, "default")
    read(r, keys, "w1", 1, wait_ms=0)  # w1 reads A's entry...
    entry_id = before[0].split(" ")[0]
    args = [keys.config, *keys.streams(), 0, int(r.time()[0]), 2, entry_id, "default", 0, 0]
    r.eval(GIVE_BACK, 4, *args)  # ...and hands it back unstarted
    assert index_items(r, keys, "default") == before


def test_a_tenant_whose_turn_waits_for_its_holder_is_not_served_out_of_turn(
    redis_url: str, queue: str, r: redis.Redis
) -> None:
    # The fair share's turn is a's (less served); a's entries are w1's prefix. Reader w2 takes
    # nothing rather than b's entries (which would give b a's turn: with a 3:1 weight, a run
    # of such reads served b alone), until the bound hands a's entries over.
    keys = Keys(queue)
    client = Client.from_url(redis_url, queue)
    client.submit_many([LONG["A"] + f"#{j}" for j in range(3)], tenant="a")
    client.submit_many([f"short {j}" for j in range(3)], tenant="b")
    r.zadd(keys.vtc, {"a": 0, "b": 10_000})
    r.hset(keys.holders, scoped("a", prefix_key(prompt=LONG["A"]) or ""), "w1")
    live(r, keys, "w1")
    live(r, keys, "w2")
    assert read(r, keys, "w2", 2, wait_ms=200) == []
    time.sleep(0.25)
    assert [g[0] for g in read(r, keys, "w2", 2, wait_ms=200)] == ["A", "A"]


def test_the_worker_that_answered_a_chat_holds_its_next_turn(
    redis_url: str, queue: str, r: redis.Redis, start_worker: Callable[..., WorkerProcess]
) -> None:
    keys = Keys(queue)
    client = Client.from_url(redis_url, queue)
    start_worker(queue, "--engine", "echo", "--echo-cache-tokens", "65536")
    turn = chat("What is in the bag?")
    reply = client.generate(messages=turn, max_new_tokens=16, tenant="t", timeout=60).text or ""
    next_turn = [*turn, {"role": "assistant", "content": reply}, {"role": "user", "content": "?"}]
    key = scoped("t", prefix_key(messages=next_turn) or "")
    wait_until(lambda: r.hget(keys.holders, key) == b"w0", timeout_s=10)


def test_a_reader_with_its_own_prefixes_leaves_unheld_ones_to_a_reader_without(
    redis_url: str, queue: str, r: redis.Redis
) -> None:
    # w1 holds A; C is nobody's. w1 takes its A and leaves C (marked passed over), so that
    # workers keep to their prefixes; w2, with nothing of its own, takes C at once.
    keys = Keys(queue)
    client = Client.from_url(redis_url, queue)
    submit_mix(client, "CAC")
    r.hset(keys.holders, scoped("default", prefix_key(prompt=LONG["A"]) or ""), "w1")
    live(r, keys, "w1")
    live(r, keys, "w2")
    assert [g[0] for g in read(r, keys, "w1", 3)] == ["A"]
    assert all(len(i.split(" ")) == 3 for i in index_items(r, keys, "default"))
    assert [g[0] for g in read(r, keys, "w2", 3)] == ["C", "C"]


# -- adapters: the same placement -----------------------------------------------------------


def test_adapter_keys_agree_with_their_lua_twin(r: redis.Redis) -> None:
    lua = compose("return adapter_key(ARGV[1])", PREFIX_KEYS)
    for name in ("a1", "org/my-lora@v2"):
        assert r.eval(lua, 0, name) == adapter_key(name).encode()
    assert adapter_key("a1") != adapter_key("a2")


def test_an_adapters_entries_carry_its_key_unless_they_have_a_prefix_of_their_own(
    redis_url: str, queue: str, r: redis.Redis
) -> None:
    keys = Keys(queue)
    r.sadd(keys.adapters, "a1")  # what a worker with --lora a1=PATH does at its start
    client = Client.from_url(redis_url, queue)
    client.submit_many(
        [
            {"prompt": "short", "model": "a1"},
            {"prompt": LONG["A"], "model": "a1"},
            {"prompt": "short", "model": "other-model"},
        ],
        tenant="t",
    )
    a1 = [i.decode() for i in r.lrange(keys.lane("a1").tenant_index("normal", "t"), 0, -1)]
    assert [i.split(" ")[1] for i in a1] == [
        adapter_key("a1"),
        scoped("t", prefix_key(prompt=LONG["A"]) or "", model="a1"),
    ]
    other = r.lrange(keys.lane("other-model").tenant_index("normal", "t"), 0, -1)
    assert [len(i.split(b" ")) for i in other] == [1], "a model that is no adapter: no key"


def read_lanes(
    r: redis.Redis, keys: Keys, me: str, lanes: tuple[str, ...] = ("a1",), *, wait_ms: int = 200
) -> list[str]:
    """One PULL of these adapters' lanes for ``me`` (room 4 each): the models it got."""
    seconds, micros = r.time()
    streams = [s for lane in lanes for s in keys.lane(lane).streams()]
    rooms = [4 if s.endswith(":normal") else 0 for s in streams]
    args = [me, "fair", seconds * 1000 + micros // 1000, 100_000, *rooms, 0, 0, wait_ms, 150]
    reply: Any = r.eval(PULL, 1 + len(streams), keys.config, *streams, *args)
    return [
        json.loads(dict(zip(f[::2], f[1::2], strict=True))[b"body"])["model"]
        for _stream, entries in reply or []
        for _id, f in entries
    ]


def test_an_adapters_requests_wait_for_the_worker_that_has_it_loaded_then_go_to_anyone(
    redis_url: str, queue: str, r: redis.Redis
) -> None:
    keys = Keys(queue)
    r.sadd(keys.adapters, "a1")
    Client.from_url(redis_url, queue).submit_many([{"prompt": "x", "model": "a1"}] * 2)
    r.hset(keys.holders, adapter_key("a1"), "w1")
    live(r, keys, "w1")
    live(r, keys, "w2")
    assert read_lanes(r, keys, "w2") == [], "w1 has a1 loaded"
    assert r.xlen(keys.lane("a1").doorbell) == 1, "the read woke an idle worker: w1, if idle"
    time.sleep(0.25)
    assert read_lanes(r, keys, "w2") == ["a1", "a1"], "past the bound: anyone"


def test_an_adapter_nobody_holds_goes_to_a_reader_with_a_free_adapter_slot(
    redis_url: str, queue: str, r: redis.Redis
) -> None:
    keys = Keys(queue)
    r.sadd(keys.adapters, "a1", "a2")
    Client.from_url(redis_url, queue).submit_many(
        [{"prompt": "x", "model": m} for m in ("a1", "a2", "a1", "a2")]
    )
    live(r, keys, "w1")
    live(r, keys, "w2")
    r.hset(keys.adapter_slots, mapping={"w1": 1, "w2": 0})
    assert read_lanes(r, keys, "w1", ("a1", "a2")) == ["a1", "a1"], "one slot: one adapter"
    assert read_lanes(r, keys, "w2", ("a1", "a2")) == [], "no slot free: a2 waits for one"
    time.sleep(0.25)
    assert read_lanes(r, keys, "w2", ("a1", "a2")) == ["a2", "a2"], "past the bound: anyone"


def adapter_holdings(queue: str, adapters: list[str], max_loras: int) -> Any:
    """A worker's ``PrefixAffinity`` with these adapters (consumer w1)."""
    from genq.worker.runtime.prefixes import PrefixAffinity

    return PrefixAffinity(
        keys=Keys(queue),
        consumer="w1",
        capacity_tokens=0,
        enabled=True,
        sharing=set,
        adapters=adapters,
        max_loras=max_loras,
    )


def requests_for(*models: str | None) -> list[Any]:
    """One ``Held`` request per model (None: the base model)."""
    from genq.common.models import Request
    from genq.worker.policy.lookahead import Held

    return [
        Held(
            stream="s",
            entry_id=f"{j}-0",
            request=Request(id=f"r{j}", prompt="x", model=m),
            prompt_ids=[1],
            enqueued_ms=0,
        )
        for j, m in enumerate(models)
    ]


def test_a_worker_tells_the_fleet_which_adapters_it_holds_as_its_engine_keeps_them() -> None:
    held = adapter_holdings("q", ["a1", "a2"], max_loras=1)
    held.started(requests_for("a1", None))  # None: the base model, no adapter
    assert held._ops == {adapter_key("a1"): "+"}
    held._told([])  # (the read that told it went through)
    held.started(requests_for("a2"))  # past --max-loras 1: a1 is no longer loaded
    assert held._ops == {adapter_key("a2"): "+", adapter_key("a1"): "-"}


def test_a_worker_tells_its_free_adapter_slots_as_it_reads_requests_for_adapters(
    r: redis.Redis, queue: str
) -> None:
    keys = Keys(queue)
    held = adapter_holdings(queue, ["a1", "a2", "a3"], max_loras=2)

    def tell() -> int:
        """How many changes the next read tells (its HOLD call's: EVALSHA sha 1 config me ...)."""
        pipe = r.pipeline(transaction=False)
        told = held.ride(pipe)
        if told is None:
            return 0
        ops = pipe.command_stack[0][0][5:]
        script_calls.execute(pipe)
        told([])
        return len(ops)

    assert tell() == 1 and r.hget(keys.adapter_slots, "w1") == b"2"
    assert tell() == 0, "nothing new: no call"
    held.read(requests_for("a1"))
    assert tell() == 2  # a1 held, one slot left
    assert r.hget(keys.adapter_slots, "w1") == b"1"
    assert r.hget(keys.holders, adapter_key("a1")) == b"w1"


def test_the_worker_that_has_an_adapter_loaded_gets_its_requests(
    redis_url: str,
    queue: str,
    r: redis.Redis,
    start_worker: Callable[..., WorkerProcess],
    tmp_path: Any,
) -> None:
    from genq.worker.engines.lora_builder import build_tiny_adapter

    lora = f"--lora=a1={build_tiny_adapter(tmp_path / 'a1', seed=1)}"
    keys = Keys(queue)
    client = Client.from_url(redis_url, queue)
    start_worker(queue, "--model", "tiny", lora)
    first = client.generate("hello", model="a1", max_new_tokens=4, timeout=120)
    assert first.worker == "w0"
    wait_until(lambda: r.hget(keys.holders, adapter_key("a1")) == b"w0", timeout_s=10)
    start_worker(queue, "--model", "tiny", lora)
    wait_until(lambda: r.hexists(keys.load, "w1"), timeout_s=120)
    for _ in range(3):
        ids = client.submit_many([{"prompt": f"p{j}", "model": "a1"} for j in range(3)])
        results = client.results(ids, timeout=60)
        assert {x.worker for x in results} == {"w0"}, "w1 leaves a1's requests to w0"


def test_a_worker_that_keeps_no_prefix_tells_the_fleet_it_holds_none() -> None:
    """Capacity 0 (the static engine, echo without its cache): the prefixes it runs are not
    told as held (they were, and never let go: the holders hash grew a field a request)."""
    from genq.worker.runtime.prefixes import PrefixAffinity

    kept = PrefixAffinity(
        keys=Keys("q"), consumer="w1", capacity_tokens=100, enabled=True, sharing=set
    )
    none = PrefixAffinity(
        keys=Keys("q"), consumer="w1", capacity_tokens=0, enabled=True, sharing=set
    )
    for affinity in (kept, none):
        for k in range(3):
            affinity._hold(f"p{k}", 60)
    assert kept._ops == {"p0": "-", "p1": "-", "p2": "+"}  # the last one fits; the others go
    assert none._ops == {} and not none.untold
