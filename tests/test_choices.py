"""``n`` choices per request: each choice its own text, finish reason and
logprobs; reproducible with a seed; n times the cost in the batch budget; on every door."""

from __future__ import annotations

from collections.abc import Callable

import openai
import pytest
from genq.common.errors import InvalidRequest
from genq.producer import Client
from genq.producer.building import build_request
from genq.producer.gateway.batch_lines import CHAT, request_args
from genq.worker.engines.base import GenerationInput
from genq.worker.engines.static import StaticEngine
from genq.worker.policy.admission import Limits, check_limits
from genq.worker.policy.batching import Candidate
from genq.worker.policy.fair_share import charge

from tests.conftest import worker_thread


def test_n_is_checked_before_queuing_and_costs_n_times() -> None:
    with pytest.raises(InvalidRequest, match="n: Input should be less than or equal to 16"):
        build_request("hi", n=17)
    with pytest.raises(InvalidRequest, match="stream with n > 1"):
        build_request("hi", n=2, stream=True)
    assert request_args(CHAT, {"messages": [], "n": 4})["n"] == 4
    assert "n" not in request_args(CHAT, {"messages": [], "n": 1})
    one = Candidate(key="a", prompt_tokens=10, max_new_tokens=20, enqueued_ms=0)
    four = Candidate(key="b", prompt_tokens=10, max_new_tokens=20, enqueued_ms=0, choices=4)
    assert (one.cost_tokens, four.cost_tokens) == (30, 120)
    limits = Limits(
        max_new_tokens=100, max_prompt_tokens=None, max_context_tokens=None, max_batch_tokens=100
    )
    problem = check_limits(build_request("x", max_new_tokens=20, n=4), 10, limits)
    assert problem is not None and "x n 4" in str(problem)
    assert check_limits(build_request("x", max_new_tokens=20, n=3), 10, limits) is None
    body = build_request("x", max_new_tokens=20, n=4).model_dump_json(exclude_defaults=True)
    assert charge(body.encode())[1] == 80


@pytest.fixture(scope="module")
def static() -> StaticEngine:
    return StaticEngine.load("tiny")


def test_each_choice_is_a_seeded_sample_of_its_own(static: StaticEngine) -> None:
    [prompt, other] = static.tokenize(["The queue was", "Another prompt"])
    row = GenerationInput(
        prompt_ids=prompt, max_new_tokens=12, temperature=1.0, seed=9, n=4, logprobs=0
    )
    mate = GenerationInput(prompt_ids=other, max_new_tokens=5)
    first = static.generate([row, mate]).outputs[0]
    again = static.generate([row]).outputs[0]
    assert first.choices is not None and again.choices is not None and len(first.choices) == 4
    assert [c.text for c in first.choices] == [c.text for c in again.choices]
    assert len({c.text for c in first.choices}) > 1  # four samples, not one four times
    for j, choice in enumerate(first.choices):  # choice j is the sample of seed 9 + j
        single = GenerationInput(
            prompt_ids=prompt, max_new_tokens=12, temperature=1.0, seed=9 + j, logprobs=0
        )
        alone = static.generate([single]).outputs[0]
        assert (choice.text, choice.finish_reason) == (alone.text, alone.finish_reason)
        assert choice.logprobs is not None and len(choice.logprobs) == len(alone.logprobs or [])
    assert first.text == first.choices[0].text
    assert first.completion_tokens == sum(c.completion_tokens for c in first.choices)


def test_results_carry_every_choice(redis_url: str, queue: str, static: StaticEngine) -> None:
    with (
        worker_thread(redis_url, queue, static, max_batch_tokens=4096),
        Client.from_url(redis_url, queue) as client,
    ):
        seeded = {"prompt": "Once", "max_new_tokens": 10, "temperature": 0.8, "seed": 3, "n": 3}
        a, b, greedy, big = client.results(
            client.submit_many(
                [
                    seeded,
                    seeded,
                    {"prompt": "Once", "max_new_tokens": 6, "n": 2},
                    {"prompt": "x", "max_new_tokens": 300, "n": 16},
                ]
            ),
            timeout=120,
        )
    assert a.status == "succeeded" and a.choices is not None and len(a.choices) == 3
    assert b.choices == a.choices and [c.index for c in a.choices] == [0, 1, 2]
    assert a.text == a.choices[0].text
    assert a.usage.completion_tokens > 10  # all three choices counted (10 at most each)
    assert greedy.choices is not None and greedy.choices[0].text == greedy.choices[1].text
    assert (
        big.status == "failed" and big.error is not None and big.error.code == "request_too_large"
    )


def test_the_sdk_gets_n_choices(sdk_serving: Callable[[str], openai.OpenAI]) -> None:
    client = sdk_serving("tiny")
    ask = {"model": "tiny", "max_tokens": 8, "temperature": 0.9, "seed": 11, "n": 3}
    chat = client.chat.completions.create(
        messages=[{"role": "user", "content": "hi"}], logprobs=True, **ask
    )
    same = client.chat.completions.create(
        messages=[{"role": "user", "content": "hi"}], logprobs=True, **ask
    )
    assert [c.index for c in chat.choices] == [0, 1, 2]
    assert [c.message.content for c in chat.choices] == [c.message.content for c in same.choices]
    assert all(c.logprobs is not None and c.logprobs.content is not None for c in chat.choices)
    text = client.completions.create(prompt="The", **ask)
    assert len(text.choices) == 3 and text.usage is not None
    with pytest.raises(openai.BadRequestError, match="less than or equal to 16"):
        client.completions.create(model="tiny", prompt="x", n=17)
    with pytest.raises(openai.BadRequestError, match="stream with n > 1"):
        client.completions.create(model="tiny", prompt="x", n=2, stream=True)
