"""logprobs and top_logprobs: on the Result, in OpenAI's chat and legacy
completions shapes, batched equal to alone (float32, greedy, within 1e-4), on every engine."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import openai
import pytest
from genq.common.errors import InvalidRequest
from genq.producer import Client
from genq.producer.building import build_request
from genq.producer.gateway.batch_lines import CHAT, COMPLETIONS, request_args
from genq.worker.engines.base import GenerationInput, GenerationOutput
from genq.worker.engines.continuous import ContinuousEngine
from genq.worker.engines.echo import EchoEngine
from genq.worker.engines.static import StaticEngine

from tests.conftest import WorkerProcess, varied_prompts, wait_until


def test_bad_logprobs_options_are_refused_before_queuing() -> None:
    with pytest.raises(InvalidRequest, match="top_logprobs"):
        build_request("hi", logprobs=True, top_logprobs=21)
    with pytest.raises(InvalidRequest, match="top_logprobs needs logprobs"):
        build_request("hi", top_logprobs=3)
    with pytest.raises(InvalidRequest, match="integer 0-5"):
        request_args(COMPLETIONS, {"prompt": "x", "logprobs": 6})
    with pytest.raises(InvalidRequest, match="true or false"):
        request_args(CHAT, {"messages": [{"role": "user", "content": "x"}], "logprobs": 3})
    assert request_args(COMPLETIONS, {"prompt": "x", "logprobs": 0})["top_logprobs"] == 0
    assert "logprobs" not in request_args(CHAT, {"messages": [], "logprobs": False})


@pytest.fixture(scope="module")
def static() -> StaticEngine:
    return StaticEngine.load("tiny")


def rows(engine: Any, top: int | None, n: int = 8) -> list[GenerationInput]:
    ids = engine.tokenize(varied_prompts(n, seed=2))
    return [
        GenerationInput(prompt_ids=p, max_new_tokens=6 + 7 * i, logprobs=top)
        for i, p in enumerate(ids)
    ]


def close(a: list[GenerationOutput], b: list[GenerationOutput]) -> None:
    """Same texts and tokens; every log-probability within 1e-4."""
    assert [(o.text, o.completion_tokens) for o in a] == [(o.text, o.completion_tokens) for o in b]
    for x, y in zip(a, b, strict=True):
        assert x.logprobs is not None and y.logprobs is not None
        assert [e["token"] for e in x.logprobs] == [e["token"] for e in y.logprobs]
        for e, f in zip(x.logprobs, y.logprobs, strict=True):
            assert abs(e["logprob"] - f["logprob"]) < 1e-4
            assert [t["token"] for t in e["top_logprobs"]] == [
                t["token"] for t in f["top_logprobs"]
            ]
            for t, u in zip(e["top_logprobs"], f["top_logprobs"], strict=True):
                assert abs(t["logprob"] - u["logprob"]) < 1e-4


def test_greedy_tokens_are_the_likeliest_and_batched_equals_alone(static: StaticEngine) -> None:
    batch = rows(static, 3)
    together = static.generate(batch).outputs
    close(together, [static.generate([r]).outputs[0] for r in batch])
    for out in together:
        assert out.logprobs is not None
        eos = out.finish_reason == "stop"
        assert len(out.logprobs) == out.completion_tokens - eos  # eos has no entry
        assert "".join(e["token"] for e in out.logprobs) == out.text
        for e in out.logprobs:
            top = e["top_logprobs"]
            assert len(top) == 3 and top[0]["token"] == e["token"]
            assert top[0]["logprob"] == pytest.approx(e["logprob"], abs=1e-6)
            assert e["logprob"] <= 0 and sum(math.exp(t["logprob"]) for t in top) <= 1 + 1e-5
            assert e["bytes"] == list(e["token"].encode())


def test_only_the_rows_that_ask_get_logprobs_and_the_others_are_unchanged(
    static: StaticEngine,
) -> None:
    plain, asking = rows(static, None), rows(static, 0)
    mixed = [a if i % 2 else p for i, (p, a) in enumerate(zip(plain, asking, strict=True))]
    outs = static.generate(mixed).outputs
    assert [o.logprobs is None for o in outs] == [i % 2 == 0 for i in range(len(outs))]
    assert all(o.logprobs is None or all(not e["top_logprobs"] for e in o.logprobs) for o in outs)
    assert [o.text for o in outs] == [o.text for o in static.generate(plain).outputs]


def test_the_continuous_engine_gives_the_same_logprobs() -> None:
    engine = ContinuousEngine.load("tiny", max_batch_tokens=4096, max_batch_size=8)
    try:
        batch = rows(engine, 2, n=4)
        close(engine.generate(batch).outputs, engine._static.generate(batch).outputs)
    finally:
        engine.close()


def test_echo_says_each_byte_is_certain() -> None:
    echo = EchoEngine()
    (out,) = echo.generate(
        [GenerationInput(prompt_ids=list(b"hey"), max_new_tokens=8, logprobs=1)]
    ).outputs
    assert out.logprobs is not None and [e["token"] for e in out.logprobs] == ["h", "e", "y"]
    assert all(e["logprob"] == 0.0 and len(e["top_logprobs"]) == 1 for e in out.logprobs)


def test_through_the_client_and_genq_serve_in_openais_shapes(
    openai_client: openai.OpenAI,
    redis_url: str,
    queue: str,
    start_worker: Callable[..., WorkerProcess],
) -> None:
    start_worker(queue, "--model", "tiny", "--engine", "static")
    with Client.from_url(redis_url, queue) as client:
        result = client.generate("The queue", max_new_tokens=5, logprobs=True, top_logprobs=2)
        assert result.logprobs is not None and len(result.logprobs[0].top_logprobs) == 2
        plain = client.generate("The queue", max_new_tokens=5)
        assert plain.logprobs is None and plain.text == result.text
    sdk = openai_client
    wait_until(lambda: [m.id for m in sdk.models.list()] == ["tiny"], timeout_s=60)
    chat = sdk.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "hello"}],
        max_tokens=6,
        logprobs=True,
        top_logprobs=4,
    )
    content = chat.choices[0].logprobs.content  # type: ignore[union-attr]
    assert content is not None and len(content) >= 1
    assert all(len(c.top_logprobs) == 4 and c.logprob <= 0 for c in content)
    assert "".join(c.token for c in content) == chat.choices[0].message.content
    legacy = sdk.completions.create(model="tiny", prompt="The queue", max_tokens=5, logprobs=2)
    lp = legacy.choices[0].logprobs
    assert lp is not None and lp.tokens is not None and lp.text_offset is not None
    assert len(lp.tokens) == len(lp.token_logprobs or []) == len(lp.top_logprobs or [])
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(len(lp.tokens))]
    assert all(len(top) <= 2 for top in lp.top_logprobs or [])
    plain_chat = sdk.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hello"}], max_tokens=3
    )
    assert plain_chat.choices[0].logprobs is None
    with pytest.raises(openai.BadRequestError, match="without stream"):
        sdk.completions.create(model="tiny", prompt="x", max_tokens=2, logprobs=1, stream=True)
