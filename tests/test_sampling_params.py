"""The sampling parameters clients send: OpenAI's frequency_penalty,
presence_penalty and logit_bias, and vLLM's min_p, repetition_penalty, min_tokens and ignore_eos.
Checked before anything is queued, honoured per row on the tiny model (batched equals alone),
and through genq serve with the unmodified openai SDK."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import openai
import pytest
from genq.common.errors import InvalidRequest
from genq.producer.building import build_request
from genq.producer.gateway.batch_lines import CHAT, COMPLETIONS, request_args
from genq.worker.engines.base import GenerationInput, LogitAdjust, logit_adjust
from genq.worker.engines.static import StaticEngine

from tests.conftest import varied_prompts


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"frequency_penalty": 2.5}, "frequency_penalty"),
        ({"presence_penalty": -3}, "presence_penalty"),
        ({"repetition_penalty": 0}, "repetition_penalty"),
        ({"min_p": 1.5}, "min_p"),
        ({"min_tokens": -1}, "min_tokens"),
        ({"logit_bias": {"x": 1}}, "logit_bias"),
        ({"logit_bias": {5: 101}}, "logit_bias"),
        ({"logit_bias": {i: 1 for i in range(301)}}, "logit_bias"),
        ({"ignore_eos": "yes"}, "ignore_eos"),
    ],
)
def test_a_value_out_of_range_is_refused_before_queuing_naming_it(
    options: dict[str, Any], named: str
) -> None:
    with pytest.raises(InvalidRequest, match=named):
        build_request("hi", **options)


def test_values_in_range_reach_the_wire_and_neutral_ones_ask_nothing_of_the_engine() -> None:
    r = build_request("hi", logit_bias={5: -100, "7": 2}, frequency_penalty=1, min_tokens=3)
    assert r.logit_bias == {"5": -100.0, "7": 2.0} and r.frequency_penalty == 1.0
    adjust = logit_adjust(r)
    assert adjust == LogitAdjust(
        frequency_penalty=1.0, logit_bias=((5, -100.0), (7, 2.0)), min_tokens=3
    )
    plain = build_request("hi", repetition_penalty=1.0, logit_bias={5: 0}, presence_penalty=0)
    assert logit_adjust(plain) is None  # the engines' fast path


def test_the_gateway_takes_them_and_vllm_clients_neutral_extras_but_names_the_rest() -> None:
    body = {
        "model": "m",
        "prompt": "hi",
        "max_tokens": 4,
        "repetition_penalty": 1.0,  # what `vllm bench serve` sends with every request
        "frequency_penalty": 0.5,
        "presence_penalty": 0.0,
        "logit_bias": {"5": -100},
        "min_p": 0.1,
        "min_tokens": 2,
        "ignore_eos": True,
        "use_beam_search": False,
        "skip_special_tokens": True,
        "include_stop_str_in_output": False,
    }
    args = request_args(COMPLETIONS, body)
    assert build_request(**args).logit_bias == {"5": -100.0} and args["ignore_eos"] is True
    chat = {"messages": [{"role": "user", "content": "hi"}], "min_tokens": 1, "top_k": 5}
    assert request_args(CHAT, chat)["min_tokens"] == 1
    for field, value in [("use_beam_search", True), ("best_of", 2), ("length_penalty", 0.5)]:
        with pytest.raises(InvalidRequest, match=field):
            request_args(COMPLETIONS, {"prompt": "hi", field: value})


@pytest.fixture(scope="module")
def engine() -> StaticEngine:
    return StaticEngine.load("tiny")


def token(engine: StaticEngine, char: str) -> int:
    """The tiny model's byte token for one character."""
    with_bos, bare = engine.tokenize([char])[0], engine.tokenize([""])[0]
    return with_bos[len(bare)]


def rows(engine: StaticEngine, n: int, **options: Any) -> list[GenerationInput]:
    ids = engine.tokenize(varied_prompts(n, seed=3))
    return [GenerationInput(prompt_ids=p, max_new_tokens=24, **options) for p in ids]


def test_logit_bias_forces_or_bans_a_token(engine: StaticEngine) -> None:
    a = token(engine, "a")
    (forced,) = engine.generate(
        rows(engine, 1, adjust=LogitAdjust(logit_bias=((a, 100.0),)))
    ).outputs
    assert forced.text == "a" * 24
    plain = [o.text for o in engine.generate(rows(engine, 6)).outputs]
    first = {t[0] for t in plain if t}
    banned = tuple((token(engine, c), -100.0) for c in first)
    outs = engine.generate(rows(engine, 6, adjust=LogitAdjust(logit_bias=banned))).outputs
    assert all(not (set(o.text) & first) for o in outs), (first, outs)


def test_ignore_eos_runs_to_the_limit_and_min_tokens_holds_eos_off(engine: StaticEngine) -> None:
    ids = engine.tokenize(varied_prompts(12, seed=1))

    def batch(adjust: LogitAdjust | None = None) -> list[GenerationInput]:
        return [GenerationInput(prompt_ids=p, max_new_tokens=100, adjust=adjust) for p in ids]

    plain = engine.generate(batch()).outputs
    ended = [i for i, o in enumerate(plain) if o.finish_reason == "stop"]
    assert ended, "some rows of the tiny model end on eos"
    ignoring = engine.generate(batch(LogitAdjust(ignore_eos=True))).outputs
    assert all(o.finish_reason == "length" and o.completion_tokens == 100 for o in ignoring)
    i = ended[0]
    at_least = min(100, plain[i].completion_tokens + 3)
    held = engine.generate([batch(LogitAdjust(min_tokens=at_least))[i]]).outputs[0]
    assert held.completion_tokens >= at_least


def test_min_p_of_one_leaves_only_the_likeliest_token(engine: StaticEngine) -> None:
    greedy = engine.generate(rows(engine, 4)).outputs
    sampled = engine.generate(rows(engine, 4, temperature=1.5, seed=9, min_p=1.0)).outputs
    assert sampled == greedy


def test_each_row_gets_its_own_adjustments_and_batched_equals_alone(engine: StaticEngine) -> None:
    settings = [
        None,
        LogitAdjust(frequency_penalty=2.0),
        LogitAdjust(presence_penalty=2.0),
        LogitAdjust(repetition_penalty=3.0),
        LogitAdjust(frequency_penalty=-1.0, presence_penalty=1.0, min_tokens=20),
        None,
    ]
    ids = engine.tokenize(varied_prompts(6, seed=4))
    batch = [
        GenerationInput(prompt_ids=p, max_new_tokens=20 + i, adjust=a)
        for i, (p, a) in enumerate(zip(ids, settings, strict=True))
    ]
    together = engine.generate(batch).outputs
    assert together == [engine.generate([row]).outputs[0] for row in batch]
    plain = [
        engine.generate(
            [GenerationInput(prompt_ids=r.prompt_ids, max_new_tokens=r.max_new_tokens)]
        ).outputs[0]
        for r in batch
    ]
    assert together[0] == plain[0] and together[5] == plain[5]
    assert all(together[i] != plain[i] for i in (1, 2, 3)), (together, plain)


def test_the_continuous_engine_runs_adjusted_rows_as_static_would() -> None:
    from genq.worker.engines.continuous import ContinuousEngine

    engine = ContinuousEngine.load("tiny", max_batch_tokens=4096, max_batch_size=8)
    try:
        ids = engine.tokenize(varied_prompts(4, seed=5))
        adjust = LogitAdjust(repetition_penalty=2.0, min_tokens=10)
        batch = [
            GenerationInput(prompt_ids=p, max_new_tokens=16, adjust=adjust if i % 2 else None)
            for i, p in enumerate(ids)
        ]
        assert engine.generate(batch).outputs == engine._static.generate(batch).outputs
    finally:
        engine.close()


def test_through_genq_serve_with_the_openai_sdk(
    sdk_serving: Callable[[str], openai.OpenAI],
) -> None:
    client = sdk_serving("tiny")
    a = str(StaticEngine.load("tiny").tokenize(["a"])[0][-1])
    forced = client.completions.create(
        model="tiny", prompt="The queue", max_tokens=8, logit_bias={a: 100}
    )
    assert forced.choices[0].text == "a" * 8
    long = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "hello"}],
        max_tokens=12,
        frequency_penalty=0.5,
        presence_penalty=0.5,
        extra_body={"ignore_eos": True, "repetition_penalty": 1.2, "min_p": 0.0},
    )
    assert long.choices[0].finish_reason == "length" and long.usage is not None
    assert long.usage.completion_tokens == 12
    with pytest.raises(openai.BadRequestError, match="use_beam_search"):
        client.completions.create(
            model="tiny", prompt="x", max_tokens=2, extra_body={"use_beam_search": True}
        )
    with pytest.raises(openai.BadRequestError, match="logit_bias names token 999"):
        client.completions.create(model="tiny", prompt="x", max_tokens=2, logit_bias={"999": 5})


def test_genq_submit_takes_any_request_option_and_names_a_wrong_one(
    redis_url: str, queue: str
) -> None:
    import json

    import redis
    from click.testing import CliRunner
    from genq.common.keys import Keys
    from genq.producer.commands.submit import submit

    base = ["--redis-url", redis_url, "--queue", queue, "--no-wait", "hello"]
    options = ["--option", 'logit_bias={"5": -100}', "--option", "ignore_eos=true"]
    sent = CliRunner().invoke(submit, [*base, *options, "--option", "min_p=0.25"])
    assert sent.exit_code == 0, sent.output
    r = redis.Redis.from_url(redis_url)
    ((_, fields),) = r.xrange(Keys(queue).stream("normal"))
    body = json.loads(fields[b"body"])
    assert (body["logit_bias"], body["ignore_eos"], body["min_p"]) == ({"5": -100.0}, True, 0.25)
    wrong = CliRunner().invoke(submit, [*base, "--option", "frequency_penalty=9"])
    assert wrong.exit_code != 0 and "frequency_penalty" in wrong.output
    unknown = CliRunner().invoke(submit, [*base, "--option", "beams=2"])
    assert unknown.exit_code == 2 and "NAME one of" in unknown.output
