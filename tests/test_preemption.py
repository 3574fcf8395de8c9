"""Preemption on the continuous engine: a high-priority request takes the place of a
running low one, which is paused and run again; greedy, it ends with the text it would have had,
its stream sends nothing twice, and cancel still works on it. The policy is tested alone; the
rest with a real redis-server and ``genq worker --engine continuous`` on the tiny model."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from genq.producer import Client
from genq.worker.policy.preemption import (
    Running,
    Waiting,
    past_slice,
    ran_past_slice,
    slice_ms,
    to_resume,
    victims,
    worth_pausing,
)

from tests.conftest import WorkerProcess, wait_until

LOW_PROMPTS = ["once upon a time", "the quick brown fox"]
COUNTING = "Count from 1 to 2000, separated by commas: 1, 2, 3,"
"""smollm2-135m answers with a long run of numbers and no eos."""


def w(*priorities: str, tokens: int = 8, since: int = 0) -> list[Waiting]:
    return [Waiting(p, tokens, since) for p in priorities]


def test_a_waiting_request_takes_the_place_of_the_lowest_most_recent_running_one() -> None:
    run = [Running("a", "low", 1), Running("b", "low", 5), Running("c", "normal", 9)]
    assert victims(run, w("high"), free=0) == ["b"]  # low before normal; the latest low first
    assert victims(run, w("high", "high"), free=0) == ["b", "a"]
    assert victims(run, w("high", "high", "high"), free=0) == ["b", "a", "c"]
    assert victims(run, w("normal", "normal", "normal"), free=0) == ["b", "a"]  # not c: equal
    assert victims(run, w("high"), free=1) == []  # a free place: nobody yields
    assert victims(run, w("low"), free=0) == []  # never for an equal or lower priority
    assert victims([], w("high"), free=0) == []


def test_past_its_slice_a_long_request_yields_to_a_shorter_one_of_its_priority() -> None:
    long = Running("long", "low", started_ms=0, max_new_tokens=4000)
    short = Running("short", "low", started_ms=0, max_new_tokens=16)
    sliced = {"now_ms": 1000, "base_slice_ms": 1000}
    assert victims([long, short], w("low", tokens=16), free=0, **sliced) == ["long"]
    assert victims([long], w("low", tokens=16), free=0, now_ms=999, base_slice_ms=1000) == []
    assert victims([long], w("low", tokens=16), free=0, now_ms=5000) == []  # no slice: never
    assert victims([short], w("low", tokens=16), free=0, **sliced) == []  # never to its like
    assert victims([long], w("low", tokens=4000), free=0, **sliced) == []
    assert victims([long], w("high", tokens=16), free=0, **sliced) == ["long"]
    assert victims([long], w("low", tokens=16), free=1, **sliced) == []  # a free place
    normal = Running("n", "normal", started_ms=0, max_new_tokens=4000)
    assert victims([normal], w("low", tokens=16), free=0, **sliced) == []  # not to a lower one
    # Each pause doubles the next slice: after 3, 8 base slices.
    thrice = Running("long", "low", started_ms=0, pauses=3, max_new_tokens=4000)
    assert slice_ms(thrice, 1000) == 8000 and slice_ms(thrice, 0) == 0
    assert victims([thrice], w("low", tokens=16), free=0, now_ms=7999, base_slice_ms=1000) == []
    assert victims([thrice], w("low", tokens=16), free=0, now_ms=8000, base_slice_ms=1000)


def test_past_its_slice_a_request_yields_only_where_the_work_it_throws_away_pays() -> None:
    # A pause throws away what the running request generated (it runs again from its prompt):
    # it yields only when the waiting one's tokens plus twice those are below its own.
    sliced = {"now_ms": 1000, "base_slice_ms": 1000}

    def ran(generated: int) -> Running:
        return Running("r", "low", started_ms=0, max_new_tokens=128, generated=generated)

    assert worth_pausing(ran(0), Waiting("low", 127))
    assert not worth_pausing(ran(0), Waiting("low", 128))
    assert worth_pausing(ran(50), Waiting("low", 27))  # 27 + 100 < 128: the short one first
    assert not worth_pausing(ran(50), Waiting("low", 28))  # 28 + 100 = 128: it keeps its place
    assert victims([ran(50)], w("low", tokens=27), free=0, **sliced) == ["r"]
    assert victims([ran(50)], w("low", tokens=28), free=0, **sliced) == []
    assert victims([ran(64)], w("low", tokens=1), free=0, **sliced) == []  # half done: never
    # Whatever it generated, a higher priority still takes the place of a lower one.
    assert victims([ran(127)], w("normal", tokens=400), free=0, **sliced) == ["r"]


def test_past_its_slice_is_one_rule_whether_asked_of_a_row_or_of_its_numbers() -> None:
    # The worker asks it of every running request several times a turn, from the numbers
    # alone (no Running built): it must say what past_slice says of the row.
    for started, pauses, now, base in [
        (0, 0, 1999, 2000),
        (0, 0, 2000, 2000),
        (0, 1, 3999, 2000),
        (0, 1, 4000, 2000),
        (100, 40, 10**12, 2000),
        (0, 0, 10**9, 0),
    ]:
        row = Running("k", "normal", started, pauses)
        assert ran_past_slice(started, pauses, now, base) == past_slice(row, now, base)
        assert past_slice(row, now, base) == (base > 0 and now - started >= slice_ms(row, base))
    assert not ran_past_slice(0, 0, 1999, 2000) and ran_past_slice(0, 1, 4000, 2000)


def test_a_paused_request_runs_again_before_what_arrived_after_its_pause() -> None:
    paused = [Running("a", "low", 10), Running("b", "normal", 20), Running("c", "low", 30)]
    assert to_resume(paused, [], free=2) == ["b", "a"]  # highest first, then paused first
    assert to_resume(paused, w("normal", since=25), free=1) == ["b"]  # it came after b paused
    assert to_resume(paused, w("normal", since=15), free=1) == []  # it waited since before
    assert to_resume(paused, w("high", since=99), free=1) == []  # the high one takes the place
    assert to_resume(paused, w("high"), free=3) == ["b", "a"]  # room for it and two more
    assert to_resume(paused, [], free=0) == []


def _worker(start: Callable[..., WorkerProcess], queue: str, *args: str) -> WorkerProcess:
    return start(queue, "--engine", "continuous", "--model", "tiny", "--max-batch-size", "2", *args)


def _lows_then_a_high(client: Client, *, stream: bool = False) -> tuple[list[str], str]:
    """Two low requests of 400 tokens fill both places; once they run, a high one of 8."""
    client.generate("warm up", max_new_tokens=2, timeout=120)
    lows = [
        client.submit(p, max_new_tokens=400, priority="low", stream=stream) for p in LOW_PROMPTS
    ]
    wait_until(lambda: all(client.status(i).status == "running" for i in lows), timeout_s=60)
    return lows, client.submit("a high one", max_new_tokens=8, priority="high")


def test_a_high_request_does_not_wait_for_running_low_ones_and_they_end_as_they_would_have(
    redis_url: str, queue: str, start_worker: Callable[..., WorkerProcess]
) -> None:
    """With both places taken by long low requests, a high one starts at once (a pause, not a
    low request's whole generation); the low ones, paused and run again, end with the texts
    and usage they have with preemption off, and a streamed one's pieces add up to its text
    with nothing sent twice."""
    texts: dict[str, list[str]] = {}
    for mode in ("--no-preempt", "--preempt"):
        worker = _worker(start_worker, f"{queue}{mode}", mode)
        with Client.from_url(redis_url, f"{queue}{mode}") as client:
            lows, high = _lows_then_a_high(client, stream=True)
            pieces = [p for p in client.stream(lows[1], timeout=120) if isinstance(p, str)]
            done = client.results([high, *lows], timeout=120)
        assert [d.status for d in done] == ["succeeded"] * 3, worker.log()[-2000:]
        high_wait = done[0].timings.queue_wait_ms
        low_ends = [d.timings.finished_unix_ms for d in done[1:]]
        texts[mode] = [d.text for d in done[1:]] + [str(d.usage) for d in done[1:]]
        assert "".join(pieces) == done[2].text  # in order, nothing twice
        if mode == "--preempt":
            assert high_wait is not None and high_wait < 300, done[0].timings
            assert done[0].timings.finished_unix_ms < min(low_ends)  # ahead of both
        else:
            assert done[0].timings.finished_unix_ms > min(low_ends)  # behind one of them
        worker.stop()
    assert texts["--preempt"] == texts["--no-preempt"]


def test_a_paused_request_can_be_cancelled_and_the_one_that_took_its_place_finishes(
    redis_url: str, queue: str, start_worker: Callable[..., WorkerProcess]
) -> None:
    _worker(start_worker, queue, "--max-batch-size", "1")
    with Client.from_url(redis_url, queue) as client:
        client.generate("warm up", max_new_tokens=2, timeout=120)
        low = client.submit("a low one", max_new_tokens=400, priority="low")
        wait_until(lambda: client.status(low).status == "running", timeout_s=60)
        high = client.submit("a long high one", max_new_tokens=300, priority="high")
        wait_until(lambda: client.status(high).status == "running", timeout_s=60)
        assert client.cancel(low)  # paused: it ends cancelled, and stays so
        assert client.result(high, timeout=120).status == "succeeded"
        time.sleep(0.5)
        assert client.status(low).status == "cancelled"
        assert client.generate("after", max_new_tokens=4, timeout=60).status == "succeeded"


def test_a_long_request_past_its_time_slice_lets_short_ones_of_its_priority_through(
    redis_url: str, queue: str, start_worker: Callable[..., WorkerProcess]
) -> None:
    """One place (smollm2-135m: a step takes tens of ms here), a long request running: with a
    time slice of 200 ms, four short ones of the same priority wait about a slice, not the
    long one's whole generation, and the long one, paused and run again, ends with the text
    and usage it has without a slice. (A short slice: the long one yields only while it has
    generated less than half its 100 tokens, ``worth_pausing``, on a machine of any speed.)"""
    ends: dict[str, list[object]] = {}
    for base in ("0", "200"):
        q = f"{queue}-{base}"
        worker = start_worker(
            q,
            *("--engine", "continuous", "--model", "smollm2-135m", "--max-batch-size", "1"),
            *("--time-slice-ms", base),
        )
        with Client.from_url(redis_url, q) as client:
            client.generate("warm up", max_new_tokens=2, timeout=120)
            long = client.submit(COUNTING, max_new_tokens=100)
            wait_until(lambda c=client, i=long: c.status(i).status == "running", timeout_s=60)
            shorts = client.submit_many(["The capital of France is"] * 4, max_new_tokens=4)
            done = client.results([long, *shorts], timeout=180)
        assert [d.status for d in done] == ["succeeded"] * 5, worker.log()[-2000:]
        waits = [d.timings.queue_wait_ms or 0 for d in done[1:]]
        last_short = max(d.timings.finished_unix_ms or 0 for d in done[1:])
        long_ms = done[0].timings.generation_ms or 0
        if base == "0":
            assert min(waits) > 2000, waits  # behind the long one's whole generation
        else:
            # The last short one waits for the slice, the read a full worker makes once a
            # second (FULL_READ_PACE_S) and the short ones ahead of it: 1.0-1.7 s here (the
            # long one took 6.4-7.4 s), against the whole long generation without a slice.
            shorts_ms = sum(d.timings.generation_ms or 0 for d in done[1:])
            bound = 200 + 1000 + shorts_ms + 1000
            assert max(waits) < min(bound, long_ms / 2), (waits, shorts_ms, long_ms)
            assert last_short < (done[0].timings.finished_unix_ms or 0)
        ends[base] = [done[0].text, done[0].usage]
        worker.stop()
    assert ends["200"] == ends["0"]


@pytest.mark.parametrize("engine", ["static", "continuous"])
def test_a_high_request_stops_a_static_batch_of_low_sampled_ones_which_end_as_they_would_have(
    redis_url: str, queue: str, start_worker: Callable[..., WorkerProcess], engine: str
) -> None:
    """Low requests that run as one static batch (the static engine; the continuous engine's
    static group: sampled and ignore_eos), both places taken: with --preempt a high request
    stops the batch at a decode step and runs first; the low ones run again from their prompts
    and end with the texts and usage they have without preemption (the sampled one seeded), and
    the streamed one's pieces add up to its text, nothing sent twice."""
    texts: dict[str, list[str]] = {}
    for mode in ("--no-preempt", "--preempt"):
        q = f"{queue}{mode}"
        args = ("--engine", engine, "--model", "tiny", "--max-batch-size", "2", "--max-wait-ms")
        worker = start_worker(q, *args, "0", mode)
        with Client.from_url(redis_url, q) as client:
            client.generate("warm up", max_new_tokens=2, timeout=120)
            low = {"max_new_tokens": 400, "priority": "low", "ignore_eos": True}
            sampled = {"temperature": 0.7, "seed": 3, "stream": True}
            lows = client.submit_many(  # (together: one batch)
                [{"prompt": LOW_PROMPTS[0], **sampled, **low}, {"prompt": LOW_PROMPTS[1], **low}]
            )
            wait_until(
                lambda c=client, ids=lows: all(c.status(i).status == "running" for i in ids), 60
            )
            high = client.submit("a high one", max_new_tokens=8, priority="high")
            pieces = [p for p in client.stream(lows[0], timeout=120) if isinstance(p, str)]
            done = client.results([high, *lows], timeout=120)
        assert [d.status for d in done] == ["succeeded"] * 3, worker.log()[-2000:]
        low_ends = [d.timings.finished_unix_ms or 0 for d in done[1:]]
        texts[mode] = [d.text for d in done[1:]] + [str(d.usage) for d in done[1:]]
        assert "".join(pieces) == done[1].text  # in order, nothing twice
        assert done[1].usage.completion_tokens == 400
        if mode == "--preempt":
            assert (done[0].timings.finished_unix_ms or 0) < min(low_ends)  # ahead of both
        else:
            assert (done[0].timings.finished_unix_ms or 0) > min(low_ends)  # behind the batch
        worker.stop()
    assert texts["--preempt"] == texts["--no-preempt"]


def test_a_static_batch_that_stopped_and_waits_can_be_cancelled_in_part(
    redis_url: str, queue: str, start_worker: Callable[..., WorkerProcess]
) -> None:
    """Echo, static, --preempt: two low requests run as one batch, a long high one stops it;
    one low request cancelled while its batch waits ends cancelled (and stays so), the other
    runs again after the high one and succeeds with its whole text."""
    args = ("--engine", "echo", "--echo-step-ms", "10", "--max-batch-size", "2")
    start_worker(queue, *args, "--max-wait-ms", "0")
    with Client.from_url(redis_url, queue) as client:
        lows = client.submit_many(["a" * 400, "b" * 400], max_new_tokens=400, priority="low")
        running = lambda: all(client.status(i).status == "running" for i in lows)  # noqa: E731
        wait_until(running, timeout_s=30)
        high = client.submit("c" * 300, max_new_tokens=300, priority="high")  # 3 s of steps
        wait_until(lambda: client.status(high).status == "running", timeout_s=30)
        assert client.cancel(lows[0])
        done = client.results([high, lows[1]], timeout=60)
        assert [d.status for d in done] == ["succeeded", "succeeded"]
        assert done[1].text == "b" * 400
        assert (done[0].timings.finished_unix_ms or 0) < (done[1].timings.finished_unix_ms or 0)
        time.sleep(0.5)
        assert client.status(lows[0]).status == "cancelled"
