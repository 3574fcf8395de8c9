"""The worker's streamed-text thread (worker/runtime/streamed_text.py), on a real redis-server:
a step's pieces go in one round trip, each request's pieces arrive in order and add up to its
text, ``flush`` sends what is queued before a final write, and pieces wait out a Redis that is
away. (Streaming end to end, through the client and the gateway, is in test_client.py and
test_gateway.py.)"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import redis
from genq.common.keys import Keys
from genq.common.wire import DELTA_EVENT, EVENT_DATA_FIELD, EVENT_TYPE_FIELD
from genq.worker.runtime.streamed_text import TextSender

from tests.conftest import wait_until


class CountingPipelines:
    """Fresh transactions on ``r``, counting how many were sent; ``hold`` keeps them back."""

    def __init__(self, r: redis.Redis) -> None:
        self.r = r
        self.sent = 0
        self.expires = 0
        self.hold = threading.Event()
        self.hold.set()
        self.away = False

    def __call__(self) -> Any:
        pipe = self.r.pipeline(transaction=True)
        execute, expire = pipe.execute, pipe.expire

        def counted_expire(*args: Any, **kwargs: Any) -> Any:
            self.expires += 1
            return expire(*args, **kwargs)

        def counted() -> Any:
            self.hold.wait(10)
            if self.away:
                raise redis.exceptions.ConnectionError("away")
            self.sent += 1
            return execute()

        pipe.execute = counted  # type: ignore[method-assign]
        pipe.expire = counted_expire  # type: ignore[method-assign]
        return pipe


def texts(r: redis.Redis, keys: Keys, request_id: str) -> list[str]:
    import json

    out = []
    for _, fields in r.xrange(keys.events(request_id)):
        assert fields[EVENT_TYPE_FIELD.encode()] == DELTA_EVENT.encode()
        out.append(json.loads(fields[EVENT_DATA_FIELD.encode()])["text"])
    return out


def test_a_steps_pieces_go_in_one_round_trip_in_order(r: redis.Redis, queue: str) -> None:
    keys, pipes = Keys(queue), CountingPipelines(r)
    sender = TextSender(pipes, keys, ttl_s=60)
    try:
        pipes.hold.clear()  # the first send waits: everything after it queues behind it
        sender.add("a", "one ")
        wait_until(lambda: len(sender) == 0)  # the thread took it, and waits on Redis
        for step in range(3):
            for request_id in ("a", "b", "c"):
                sender.add(request_id, f"{request_id}{step} ")
        pipes.hold.set()
        wait_until(lambda: len(sender) == 0 and pipes.sent == 2)
    finally:
        sender.stop()
    assert pipes.sent == 2  # the first piece, then the 9 queued meanwhile at once
    assert texts(r, keys, "a") == ["one ", "a0 a1 a2 "]  # joined, in order
    assert texts(r, keys, "b") == ["b0 b1 b2 "]
    assert 0 < r.ttl(keys.events("c")) <= 60
    assert pipes.expires == 3  # once a request, not once a piece


def test_flush_sends_what_is_queued_before_a_final_write(r: redis.Redis, queue: str) -> None:
    keys, pipes = Keys(queue), CountingPipelines(r)
    sender = TextSender(pipes, keys, ttl_s=60)
    try:
        for n in range(50):
            sender.add("x", f"{n},")
        sender.flush()  # the writer's call: after it, every piece queued before is in Redis
        r.xadd(keys.events("x"), {EVENT_TYPE_FIELD: "final", EVENT_DATA_FIELD: "{}"})
        sender.flush()
    finally:
        sender.stop()
    entries = r.xrange(keys.events("x"))
    assert entries[-1][1][EVENT_TYPE_FIELD.encode()] == b"final"
    assert "".join(texts_of(entries[:-1])) == "".join(f"{n}," for n in range(50))


def texts_of(entries: list[Any]) -> list[str]:
    import json

    return [json.loads(f[EVENT_DATA_FIELD.encode()])["text"] for _, f in entries]


def test_pieces_wait_while_redis_is_away_then_go_in_order(r: redis.Redis, queue: str) -> None:
    keys, pipes = Keys(queue), CountingPipelines(r)
    pipes.away = True
    sender = TextSender(pipes, keys, ttl_s=60)
    try:
        sender.add("y", "first ")
        sender.add("y", "second ")
        with pytest.raises(redis.exceptions.ConnectionError):  # the writer's flush meets it
            sender.flush()
        sender.add("y", "third")
        assert r.exists(keys.events("y")) == 0 and len(sender) == 1
        pipes.away = False  # back: the thread's next try sends everything, in order
        wait_until(lambda: len(sender) == 0 and r.exists(keys.events("y")) == 1)
    finally:
        sender.stop()
    assert "".join(texts(r, keys, "y")) == "first second third"


def test_stop_sends_what_is_left(r: redis.Redis, queue: str) -> None:
    keys, pipes = Keys(queue), CountingPipelines(r)
    sender = TextSender(pipes, keys, ttl_s=60)
    pipes.hold.clear()
    sender.add("z", "a")
    wait_until(lambda: len(sender) == 0)
    sender.add("z", "b")
    pipes.hold.set()
    sender.stop()
    assert "".join(texts(r, keys, "z")) == "ab"


def test_a_long_stream_renews_its_ttl_once_half_of_it_passed(r: redis.Redis, queue: str) -> None:
    keys, pipes = Keys(queue), CountingPipelines(r)
    sender = TextSender(pipes, keys, ttl_s=2)
    try:
        for piece in ("a", "b"):  # within the first second: one EXPIRE
            sender.add("long", piece)
            wait_until(lambda: len(sender) == 0)
            sender.flush()
        time.sleep(1.2)
        sender.add("long", "c")  # past half the TTL: set again, so the stream outlives it
        wait_until(lambda: len(sender) == 0)
        sender.flush()
    finally:
        sender.stop()
    assert pipes.expires == 2
    assert "".join(texts(r, keys, "long")) == "abc" and r.ttl(keys.events("long")) > 1
