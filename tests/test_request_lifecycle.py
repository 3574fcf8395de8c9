"""Every request ends in exactly one final state: engine errors and out-of-memory isolate the
culprit, late duplicates change nothing, duplicate ids are one request, a full queue refuses
clearly, deadlines expire, cancels stop work, and no key is left without a TTL."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest
import redis
from genq.common.errors import QueueFull, RequestNotFound
from genq.common.keys import Keys
from genq.common.models import Result
from genq.common.scripts import APPLY, apply, apply_args
from genq.producer import Client
from genq.worker.runtime.planner import batch_policy

from tests.conftest import WorkerProcess, wait_until, worker_thread
from tests.faults import OOM_BATCH_TOKENS, OomEngine, RaiseEngine


def test_an_engine_error_fails_only_the_culprit_found_by_splitting_the_batch(
    redis_url: str, queue: str
) -> None:
    client = Client.from_url(redis_url, queue)
    prompts = [f"prompt {i}" for i in range(15)] + ["BOOM here"]
    ids = client.submit_many(prompts, max_new_tokens=8)  # all queued before the worker starts
    engine = RaiseEngine()
    with worker_thread(redis_url, queue, engine, max_batch_size=16, max_wait_ms=200):
        results = client.results(ids, timeout=30)
    assert [x.status for x in results[:-1]] == ["succeeded"] * 15
    boom = results[-1]
    assert boom.status == "failed" and boom.error is not None
    assert boom.error.code == "generation_error" and "index out of range" in boom.error.message
    # Bisection: 16 -> 8+8 -> 4+4 -> 2+2 -> 1+1 is 9 calls; trying each row alone would be 17.
    assert engine.calls <= 10


def test_out_of_memory_splits_the_batch_lowers_the_budget_and_fails_no_innocent(
    redis_url: str, queue: str
) -> None:
    client = Client.from_url(redis_url, queue)
    ids = client.submit_many([f"row {i:02d}" for i in range(12)], max_new_tokens=40)  # 46 each
    too_big = client.submit("x" * 200, max_new_tokens=200)  # over the OOM line even alone
    with worker_thread(redis_url, queue, OomEngine(), max_batch_size=16, max_wait_ms=200) as w:
        results = client.results([*ids, too_big], timeout=30)
        assert w.counters.oom_splits >= 1
        budget = w.planner.budget
        assert batch_policy(w.settings, budget).max_batch_tokens < OOM_BATCH_TOKENS  # lowered
    assert [x.status for x in results[:-1]] == ["succeeded"] * 12
    alone = results[-1]
    assert alone.status == "failed" and alone.error is not None
    assert "out of memory even alone" in alone.error.message


def _apply_final(r: redis.Redis, keys: Keys, request_id: str, text: str) -> int:
    state = Result(id=request_id, status="succeeded", text=text).model_dump_json()
    script_keys, args = apply_args(keys, 60, "final", [(request_id, None, "", state)])
    reply: list[int] = r.eval(APPLY, len(script_keys), *script_keys, *args)  # type: ignore[assignment]
    return reply[0]


def test_a_final_result_is_written_once(r: redis.Redis, queue: str) -> None:
    keys = Keys(queue)
    assert _apply_final(r, keys, "once-1", "first worker") == 1
    assert _apply_final(r, keys, "once-1", "late duplicate") == 0
    client = Client(r, queue)
    assert client.status("once-1").text == "first worker"
    assert r.xlen(keys.events("once-1")) == 1  # one final event
    running = [("once-1", None, "", '{"id":"once-1","status":"running"}')]
    assert apply(r, keys, 60, "running", running, max_attempts=3, token="late") == [0]
    assert client.status("once-1").text == "first worker"
    assert r.get(keys.attempts("once-1")) is None  # a start refused counts nothing
    # A final state in another layout (keys in another order, spaces) is read in full.
    r.set(keys.result("once-2"), '{ "status": "cancelled", "id": "once-2" }')
    assert _apply_final(r, keys, "once-2", "too late") == 0
    assert r.get(keys.result("once-2")) == b'{ "status": "cancelled", "id": "once-2" }'


def test_a_client_given_id_submitted_twice_is_one_request(
    redis_url: str, queue: str, r: redis.Redis, start_worker: Callable[..., WorkerProcess]
) -> None:
    client = Client.from_url(redis_url, queue)
    assert client.submit("hello", request_id="dup-1") == "dup-1"
    assert client.submit("hello again", request_id="dup-1") == "dup-1"
    client.submit_many(
        [{"prompt": "a", "request_id": "dup-2"}, {"prompt": "b", "request_id": "dup-2"}]
    )
    assert r.xlen(Keys(queue).stream("normal")) == 2
    start_worker(queue, "--engine", "echo")
    assert client.result("dup-1", timeout=30).text == "hello"
    assert client.submit("third time", request_id="dup-1") == "dup-1"  # its result still lives
    assert client.result("dup-1", timeout=5).text == "hello"
    assert r.xlen(Keys(queue).events("dup-1")) == 1


def test_a_full_queue_refuses_submissions_clearly_and_atomically(
    redis_url: str, queue: str, r: redis.Redis
) -> None:
    r.hset(Keys(queue).config, "max_queue_depth", "5")  # as `genq worker --max-queue-depth 5`
    client = Client.from_url(redis_url, queue)
    client.submit_many(["a", "b", "c", "d"])
    with pytest.raises(QueueFull, match="4 requests waiting or running, its limit is 5") as err:
        client.submit_many(["e", "f"])
    assert err.value.submitted == []
    assert sum(r.xlen(s) for s in Keys(queue).streams()) == 4  # neither went in
    client.submit("e")
    with pytest.raises(QueueFull):
        client.submit("f", priority="high")


def test_the_worker_publishes_the_queue_depth_limit(
    redis_url: str, queue: str, r: redis.Redis, start_worker: Callable[..., WorkerProcess]
) -> None:
    start_worker(queue, "--engine", "echo", "--max-queue-depth", "7")
    wait_until(lambda: r.hget(Keys(queue).config, "max_queue_depth") == b"7")


def test_a_request_whose_deadline_passed_in_the_queue_expires_without_running(
    redis_url: str, queue: str, start_worker: Callable[..., WorkerProcess]
) -> None:
    client = Client.from_url(redis_url, queue)
    late = client.submit("too late", deadline_in_s=0.05)
    fine = client.submit("in time", deadline_in_s=60)
    time.sleep(0.1)
    start_worker(queue, "--engine", "echo")
    res = {x.id: x for x in client.results([late, fine], timeout=30)}
    assert res[late].status == "expired" and res[late].timings.started_unix_ms is None
    assert res[fine].status == "succeeded"


def test_cancelling_a_queued_request(
    redis_url: str, queue: str, r: redis.Redis, start_worker: Callable[..., WorkerProcess]
) -> None:
    client = Client.from_url(redis_url, queue)
    doomed, kept = client.submit_many(["cancel me", "keep me"])
    assert client.cancel(doomed) is True
    assert client.cancel(doomed) is False  # already final
    with pytest.raises(RequestNotFound):
        client.cancel("never-submitted")
    start_worker(queue, "--engine", "echo")
    assert client.result(kept, timeout=30).status == "succeeded"
    res = client.result(doomed, timeout=5)
    assert res.status == "cancelled" and res.error is not None and res.error.code == "cancelled"
    wait_until(lambda: r.xlen(Keys(queue).stream("normal")) == 0)  # acknowledged, deleted


def test_cancelling_a_running_request_frees_its_place(
    redis_url: str, queue: str, r: redis.Redis, start_worker: Callable[..., WorkerProcess]
) -> None:
    client = Client.from_url(redis_url, queue)
    start_worker(queue, "--engine", "continuous", "--max-batch-size", "1")
    # "story 0" runs all 1000 tokens on the tiny model (no eos): seconds of decoding.
    long = client.submit("story 0", max_new_tokens=1000)
    wait_until(lambda: client.status(long).status == "running", timeout_s=60)
    after = client.submit("next in line", max_new_tokens=4)
    assert client.cancel(long) is True
    # With one slot, "next in line" can only run once the cancelled one left the engine.
    assert client.result(after, timeout=60).status == "succeeded"
    res = client.result(long, timeout=5)
    assert res.status == "cancelled"
    assert client.status(after).timings.finished_unix_ms is not None
    wait_until(lambda: r.xinfo_groups(Keys(queue).stream("normal"))[0]["pending"] == 0)


def test_no_key_is_left_without_a_ttl_but_the_queues_own(
    redis_url: str, queue: str, r: redis.Redis, start_worker: Callable[..., WorkerProcess]
) -> None:
    keys = Keys(queue)
    client = Client.from_url(redis_url, queue)
    ids = client.submit_many([f"p{i}" for i in range(20)], max_new_tokens=4)
    ids.append(client.submit("streamed", stream=True, max_new_tokens=4))
    ids.append(client.submit("bad", max_new_tokens=10_000))  # over the worker limit: failed
    cancelled = client.submit("cancelled")
    client.cancel(cancelled)
    r.xadd(keys.stream("low"), {"garbage": "entry"})  # dead-lettered
    start_worker(queue, "--engine", "echo")
    client.results([*ids, cancelled], timeout=30)
    wait_until(lambda: r.xlen(keys.dead_letter) == 1)
    # The queue's own, and its tenants' service and totals (one member or field per tenant).
    queue_own = {*keys.streams(), keys.dead_letter, keys.config, keys.vtc, keys.reserved}
    queue_own.add(keys.served)
    mine = [k.decode() for k in r.scan_iter(match=f"genq:*{{{queue}}}*")]
    mine += [k.decode() for i in [*ids, cancelled] for k in r.scan_iter(match=f"genq:*:{{{i}}}")]
    assert mine
    no_ttl = [k for k in mine if r.ttl(k) == -1 and k not in queue_own]
    assert no_ttl == []


def test_a_start_sent_twice_is_counted_once(r: redis.Redis, queue: str) -> None:
    """A client library may resend a pipeline whose reply was lost (redis-py's cluster pipeline
    resends the whole stack after a failover): the same start must not count twice, or a
    healthy request would be failed as poison."""
    keys = Keys(queue)
    state = '{"id": "x", "status": "running"}'
    item = [(f"{queue}-x", None, "", state)]
    for _ in range(5):  # the same start, resent
        assert apply(r, keys, 60, "running", item, max_attempts=3, token="w:1") == [1]
    assert r.get(keys.attempts(f"{queue}-x")) == b"1 - w:1"  # STARTS ENTRY TOKEN (no entry here)
    assert apply(r, keys, 60, "running", item, max_attempts=3, token="w:2") == [1]
    assert apply(r, keys, 60, "running", item, max_attempts=3, token="w:3") == [1]
    before = (r.get(keys.result(f"{queue}-x")), r.ttl(keys.result(f"{queue}-x")))
    assert apply(r, keys, 60, "running", item, max_attempts=3, token="w:4") == [-2]  # poison
    assert (r.get(keys.result(f"{queue}-x")), r.ttl(keys.result(f"{queue}-x"))) == before
    assert r.get(keys.attempts(f"{queue}-x")) == b"3 - w:3"


def test_a_second_entry_with_a_started_requests_id_changes_nothing(
    r: redis.Redis, queue: str
) -> None:
    """An entry added later with the id of a request already started (a plain XADD from
    another language, a replayed file) is a duplicate: its start writes nothing, and the
    request's attempts still name its own entry, whose end then goes through."""
    keys, client = Keys(queue), Client(r, queue)
    rid = client.submit("first", request_id=f"{queue}-dup")
    entry = (r.xrange(keys.stream("normal")) or [[b""]])[-1][0].decode()
    mine = [(rid, keys.stream("normal"), entry, '{"id": "x", "status": "running"}')]
    assert apply(r, keys, 60, "running", mine, max_attempts=3, token="w:1") == [1]
    before = (r.get(keys.result(rid)), r.get(keys.attempts(rid)))
    assert before[1] == f"1 normal/{entry} w:1".encode()
    late = r.xadd(keys.stream("normal"), {"id": rid, "body": "{}"}).decode()
    other = [(rid, keys.stream("normal"), late, '{"id": "y", "status": "running"}')]
    assert apply(r, keys, 60, "running", other, max_attempts=3, token="w:2") == [-3]
    assert (r.get(keys.result(rid)), r.get(keys.attempts(rid))) == before
    assert _apply_final(r, keys, rid, "mine") == 1


def test_an_attempts_key_written_before_ids_had_owners_still_counts_a_start_once(
    r: redis.Redis, queue: str
) -> None:
    """Workers of an older genq wrote ``STARTS TOKEN``: a start resent over such a key is
    counted once, and the entry is no duplicate of anything."""
    keys = Keys(queue)
    rid = f"{queue}-old"
    r.set(keys.attempts(rid), "1 w:1")
    item = [(rid, keys.stream("normal"), "5-0", '{"id": "x", "status": "running"}')]
    assert apply(r, keys, 60, "running", item, max_attempts=3, token="w:1") == [1]
    assert r.get(keys.attempts(rid)) == b"1 normal/5-0 w:1"


def test_a_result_waited_for_longer_than_the_socket_timeout_arrives(
    redis_url: str, queue: str, start_worker: Callable[..., WorkerProcess]
) -> None:
    client = Client.from_url(redis_url, queue)  # redis-py's 5 s socket timeout
    late = client.submit("late", max_new_tokens=2)
    streamed = client.submit("late too", max_new_tokens=2, stream=True)
    starter = threading.Timer(6.0, lambda: start_worker(queue, "--engine", "echo"))
    starter.start()
    try:
        assert client.result(late, timeout=60).status == "succeeded"
        final = list(client.stream(streamed, timeout=60))[-1]
        assert isinstance(final, Result) and final.status == "succeeded"
    finally:
        starter.join()
        client.close()
