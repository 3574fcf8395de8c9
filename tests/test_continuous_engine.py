"""The continuous engine on the real tiny model: same outputs as each prompt alone."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
from genq.worker.engines.base import GenerationInput, LogitAdjust
from genq.worker.engines.continuous import ContinuousEngine

from tests.conftest import varied_prompts


@pytest.fixture(scope="module")
def engine() -> Iterator[ContinuousEngine]:
    e = ContinuousEngine.load("tiny", max_batch_tokens=4096, max_batch_size=16)
    yield e
    e.close()


def test_continuous_greedy_equals_each_prompt_alone(engine: ContinuousEngine) -> None:
    ids = engine.tokenize(varied_prompts(12, seed=1))
    rows = [GenerationInput(prompt_ids=p, max_new_tokens=4 + 9 * i) for i, p in enumerate(ids)]
    outs = engine.generate(rows).outputs
    alone = [engine._static.generate([r]).outputs[0] for r in rows]
    assert outs == alone
    assert any(o.finish_reason == "stop" for o in outs)  # some rows ended on eos


def test_stop_strings_are_applied_and_counted_like_static(engine: ContinuousEngine) -> None:
    (p,) = engine.tokenize(varied_prompts(1, seed=11))
    free = engine.generate([GenerationInput(prompt_ids=p, max_new_tokens=40)]).outputs[0].text
    stop = free[len(free) // 2]
    row = GenerationInput(prompt_ids=p, max_new_tokens=40, stop=(stop,))
    assert engine.generate([row]).outputs == engine._static.generate([row]).outputs


def test_sampled_requests_run_beside_greedy_ones_as_static_would(engine: ContinuousEngine) -> None:
    a, b, c = engine.tokenize(varied_prompts(3, seed=5))
    greedy = GenerationInput(prompt_ids=a, max_new_tokens=30)
    hot = GenerationInput(prompt_ids=b, max_new_tokens=20, temperature=1.5, top_k=50, seed=7)
    nucleus = GenerationInput(prompt_ids=c, max_new_tokens=20, temperature=0.8, top_p=0.9, seed=8)
    outs = engine.generate([greedy, hot, nucleus]).outputs
    assert outs[0] == engine._static.generate([greedy]).outputs[0]
    assert outs[1:] == engine._static.generate([hot, nucleus]).outputs  # same seed, same text
    hot_greedy = GenerationInput(prompt_ids=b, max_new_tokens=20)
    assert outs[1] != engine._static.generate([hot_greedy]).outputs[0]  # it did sample


def test_requests_finish_one_by_one(engine: ContinuousEngine) -> None:
    short, long = engine.tokenize(["a", "b"])
    engine.submit("long", GenerationInput(prompt_ids=long, max_new_tokens=120))
    engine.submit("short", GenerationInput(prompt_ids=short, max_new_tokens=2))
    first: list[str] = []
    while not first:
        first = [k for k, _ in engine.poll(5.0)]
    assert first[0] == "short"
    while engine.in_flight:
        engine.poll(5.0)


def _until(engine: ContinuousEngine, key: str, done: dict[str, Any]) -> None:
    while key not in done:
        done.update(engine.poll(5.0))


def test_a_paused_request_gives_its_place_and_ends_as_it_would_have_streaming_nothing_twice(
    engine: ContinuousEngine,
) -> None:
    """Preemption's engine half: a running greedy request paused mid-generation frees its
    place for another, and resumed it ends with the text it would have had alone; its stream's
    pieces add up to that text, none sent twice."""
    a, b, c = engine.tokenize(varied_prompts(3, seed=21))
    pieces: list[str] = []
    long = GenerationInput(prompt_ids=a, max_new_tokens=80, on_text=pieces.append)
    quiet = GenerationInput(prompt_ids=c, max_new_tokens=80)
    other = GenerationInput(prompt_ids=b, max_new_tokens=12)
    engine.submit("long", long)
    engine.submit("quiet", quiet)
    done: dict[str, Any] = {}
    while not pieces:  # it has streamed some text
        done.update(engine.poll(0.05))
    assert engine.pause("long") and engine.pause("quiet") and not engine.pause("gone")
    assert engine.paused == ["long", "quiet"] and engine.in_flight == 2
    sent = "".join(pieces)
    engine.submit("other", other)
    _until(engine, "other", done)
    assert "".join(pieces) == sent  # nothing while paused
    engine.resume("long")
    engine.resume("quiet")
    _until(engine, "long", done)
    _until(engine, "quiet", done)
    for key, row in (("long", long), ("quiet", quiet), ("other", other)):
        alone = engine._static.generate([replace(row, on_text=None)]).outputs[0]
        got = done[key]
        assert (got.text, got.completion_tokens, got.finish_reason) == (
            alone.text,
            alone.completion_tokens,
            alone.finish_reason,
        ), key
    # Sent once each: the pieces are the final text's beginning (the engine streams up to the
    # last token; the worker's final event carries the rest), as far as they went before.
    streamed = "".join(pieces)
    assert done["long"].text.startswith(streamed) and len(streamed) > len(sent)
    assert engine.in_flight == 0


def test_a_paused_request_can_be_cancelled(engine: ContinuousEngine) -> None:
    (a,) = engine.tokenize(varied_prompts(1, seed=22))
    engine.submit("p", GenerationInput(prompt_ids=a, max_new_tokens=60))
    assert engine.pause("p")
    engine.cancel("p")
    assert engine.paused == [] and engine.in_flight == 0
    engine.resume("p")  # nothing to resume: no error, nothing runs
    assert engine.poll(0.2) == [] and engine.in_flight == 0


def test_a_transformers_whose_continuous_batching_differs_fails_at_load_in_one_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import transformers
    from genq.common.errors import ConfigError

    class Older:  # transformers 5.17's signature: no page_size
        def __init__(self, *, num_blocks: int = 0, max_batch_tokens: int = 0) -> None:
            pass

    monkeypatch.setattr(transformers, "ContinuousBatchingConfig", Older)
    with pytest.raises(ConfigError) as err:
        ContinuousEngine.load("tiny", max_batch_tokens=1024, max_batch_size=4)
    message = str(err.value)
    assert "\n" not in message
    assert f"this worker has transformers {transformers.__version__}" in message
    assert "page_size" in message and "--engine static" in message


def test_the_transformers_the_engine_names_is_the_one_genq_pins() -> None:
    import tomllib
    from genq.worker.engines.continuous import TESTED_TRANSFORMERS

    from tests.conftest import ROOT

    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert (
        f"transformers=={TESTED_TRANSFORMERS}"
        in pyproject["project"]["optional-dependencies"]["worker"]
    )


def _lows(engine: ContinuousEngine, pieces: list[str]) -> dict[str, GenerationInput]:
    """Low rows that run apart (a static group), long enough to be running when a high one
    comes: seeded sampled, unseeded sampled and streaming, and greedy with ignore_eos."""
    a, b, c = engine.tokenize(varied_prompts(3, seed=31))
    return {
        "seeded": GenerationInput(
            prompt_ids=a, max_new_tokens=300, temperature=0.7, seed=5, priority="low"
        ),
        "unseeded": GenerationInput(
            prompt_ids=b,
            max_new_tokens=300,
            temperature=0.7,
            priority="low",
            on_text=pieces.append,
        ),
        "counting": GenerationInput(
            prompt_ids=c, max_new_tokens=300, adjust=LogitAdjust(ignore_eos=True), priority="low"
        ),
    }


def _order(engine: ContinuousEngine, lows: dict[str, GenerationInput], pieces: list[str]):
    """Submit the low rows, wait until the group streams, then a high greedy row: the order
    the rows end in, and their outputs."""
    for key, row in lows.items():
        engine.submit(key, row)
    done: dict[str, Any] = {}
    order: list[str] = []
    while not pieces:
        for key, out in engine.poll(0.02):
            done[key] = out
            order.append(key)
    (h,) = engine.tokenize(varied_prompts(1, seed=32))
    engine.submit("high", GenerationInput(prompt_ids=h, max_new_tokens=4, priority="high"))
    while engine.in_flight:
        for key, out in engine.poll(0.05):
            done[key] = out
            order.append(key)
    return order, done


def test_a_high_request_stops_a_lower_static_group_which_then_ends_as_it_would_have(
    engine: ContinuousEngine,
) -> None:
    """With preemption, a high greedy request does not wait for a running static group of low
    sampled and ignore_eos rows: the group stops at a step boundary, the high one runs, and the
    group runs again from its prompts to the same texts (a seed fixed at submit for the unseeded
    one: its stream's pieces stay the beginning of its text, none sent twice)."""
    pieces: list[str] = []
    lows = _lows(engine, pieces)
    engine.preempt = True
    try:
        order, done = _order(engine, lows, pieces)
    finally:
        engine.preempt = False
    assert order[0] == "high", order
    for key in ("seeded", "counting"):
        alone = engine._static.generate([lows[key]]).outputs[0]
        assert done[key] == alone, key
    assert done["counting"].completion_tokens == 300
    assert done["unseeded"].text.startswith("".join(pieces)) and len(pieces) > 1


def test_without_preemption_a_high_request_waits_for_the_running_group(
    engine: ContinuousEngine,
) -> None:
    pieces: list[str] = []
    order, done = _order(engine, _lows(engine, pieces), pieces)
    assert order[-1] == "high", order
    assert all(not isinstance(out, str) for out in done.values())


def test_a_paused_row_of_a_static_group_stops_it_and_runs_again_to_the_same_text(
    engine: ContinuousEngine,
) -> None:
    pieces: list[str] = []
    lows = _lows(engine, pieces)
    for key, row in lows.items():
        engine.submit(key, row)
    done: dict[str, Any] = {}
    while not pieces:
        done.update(engine.poll(0.02))
    assert engine.pause("seeded") and engine.paused == ["seeded"]
    _until(engine, "counting", done)
    assert "seeded" not in done
    engine.resume("seeded")
    _until(engine, "seeded", done)
    _until(engine, "unseeded", done)
    for key in ("seeded", "counting"):
        assert done[key] == engine._static.generate([lows[key]]).outputs[0], key
    assert engine.in_flight == 0
