"""Prefix caching, counted and shown: the echo engine's simulated cache, ``usage.cached_tokens``
on every door (client, genq stats, the gateway's OpenAI shapes)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import openai
import pytest
from genq.producer import Client
from genq.worker.engines.base import GenerationInput
from genq.worker.engines.echo import EchoEngine
from genq.worker.engines.simulated_cache import BLOCK_TOKENS, SimulatedPrefixCache, block_hashes

from tests.conftest import WorkerProcess, genq_stats, wait_until

SYSTEM = "You are a careful assistant who answers in one short sentence: " * 8 + "........"
assert len(SYSTEM) == 512  # 32 whole blocks of 16 bytes (the echo engine's tokens)


def test_blocks_are_named_by_everything_before_them() -> None:
    a = block_hashes(list(range(64)))
    b = block_hashes([99, *range(1, 64)])
    assert len(a) == 64 // BLOCK_TOKENS
    assert not set(a) & set(b), "one token differing at the start changes every block's name"
    assert block_hashes(list(range(70)))[:4] == a, "a longer prompt shares the leading blocks"
    assert block_hashes(list(range(15))) == [], "no full block: nothing to cache"


def test_the_cache_reports_whole_leading_blocks_and_never_the_last_token() -> None:
    cache = SimulatedPrefixCache(capacity_tokens=1024)
    prompt = list(range(100))
    assert cache.lookup(prompt) == 0
    cache.insert(prompt)
    assert cache.lookup(prompt) == 96, "6 whole blocks of 16; the last token is computed"
    assert cache.lookup(list(range(64))) == 48, "a 64-token prompt: its 4th block holds its last"
    assert cache.lookup([*range(40), 7, 7, 7, *range(43, 100)]) == 32, "cut where it differs"


def test_the_least_recently_used_blocks_go_first() -> None:
    cache = SimulatedPrefixCache(capacity_tokens=4 * BLOCK_TOKENS)
    a, b = [1] * 64 + [0], [2] * 64 + [0]
    cache.insert(a)
    assert cache.lookup(a) == 64
    cache.insert(b)
    assert len(cache) == 4
    assert cache.lookup(a) == 0 and cache.lookup(b) == 64


def test_no_capacity_caches_nothing() -> None:
    cache = SimulatedPrefixCache(capacity_tokens=0)
    cache.insert(list(range(64)))
    assert cache.lookup(list(range(64))) == 0


def _row(prompt: str) -> GenerationInput:
    return GenerationInput(prompt_ids=list(prompt.encode()), max_new_tokens=4)


def test_the_echo_engine_pays_prefill_only_for_what_its_cache_lacks() -> None:
    engine = EchoEngine(prefill_us_per_token=200.0, cache_tokens=4096)
    first = time.perf_counter()
    cold = engine.generate([_row(SYSTEM + "question one")])
    first_s = time.perf_counter() - first
    again = time.perf_counter()
    warm = engine.generate([_row(SYSTEM + "question two"), _row(SYSTEM + "question three")])
    warm_s = time.perf_counter() - again
    assert cold.outputs[0].cached_tokens == 0
    assert [o.cached_tokens for o in warm.outputs] == [512, 512]
    assert warm.cached_tokens == 1024
    assert first_s >= 524 * 200e-6, "every token of the cold prompt was computed"
    assert warm_s < first_s, "two warm prompts cost less than one cold one"


def test_results_say_how_many_prompt_tokens_came_from_the_cache(
    redis_url: str, queue: str, start_worker: Callable[..., WorkerProcess]
) -> None:
    start_worker(queue, "--engine", "echo", "--echo-cache-tokens", "65536", "--max-batch-size", "1")
    client = Client.from_url(redis_url, queue)
    cold = client.generate(SYSTEM + "first question?", max_new_tokens=4, timeout=60)
    warm = client.generate(SYSTEM + "second question?", max_new_tokens=4, timeout=60)
    other = client.generate("unrelated " * 60, max_new_tokens=4, timeout=60)
    assert cold.usage.cached_tokens == 0
    assert warm.usage.cached_tokens == 512
    assert warm.usage.prompt_tokens == len((SYSTEM + "second question?").encode())
    assert other.usage.cached_tokens == 0

    wait_until(lambda: genq_stats(redis_url, queue)["prefix_cache"]["cached_tokens"] == 512)
    stats = genq_stats(redis_url, queue)
    cache = stats["prefix_cache"]
    assert cache["hit_rate"] == pytest.approx(512 / cache["prompt_tokens"], abs=1e-4)
    (worker,) = stats["workers"]
    assert worker["cached_tokens"] == 512 and worker["cache_hit_rate"] == cache["hit_rate"]


def test_the_openai_sdk_sees_cached_tokens_on_chat_completions_and_responses(
    openai_client: Any, queue: str, start_worker: Callable[..., WorkerProcess]
) -> None:
    start_worker(queue, "--engine", "echo", "--echo-cache-tokens", "65536", "--max-batch-size", "1")
    client = openai_client
    wait_until(lambda: [m.id for m in client.models.list()] == ["echo"], timeout_s=60)
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "hello"}]
    client.chat.completions.create(model="echo", messages=messages, max_tokens=4)
    chat = client.chat.completions.create(model="echo", messages=messages, max_tokens=4)
    assert chat.usage.prompt_tokens_details.cached_tokens >= 512
    completion = client.completions.create(model="echo", prompt=SYSTEM + "x", max_tokens=4)
    assert completion.usage.prompt_tokens_details.cached_tokens == 0  # a new prompt's first run
    completion = client.completions.create(model="echo", prompt=SYSTEM + "y", max_tokens=4)
    assert completion.usage.prompt_tokens_details.cached_tokens == 512
    # A response's input is a chat of one user message: its own prompt, warmed by the first.
    client.responses.create(model="echo", input=SYSTEM + "z", max_output_tokens=4)
    response = client.responses.create(model="echo", input=SYSTEM + "w", max_output_tokens=4)
    assert response.usage.input_tokens_details.cached_tokens >= 512


@pytest.mark.parametrize("bad", [7, "", "k" * 257, ["a"]])
def test_a_bad_prompt_cache_key_is_one_clear_400_on_every_route(
    openai_client: Any, queue: str, start_worker: Callable[..., WorkerProcess], bad: Any
) -> None:
    start_worker(queue, "--engine", "echo", "--max-batch-size", "1")
    client = openai_client
    wait_until(lambda: [m.id for m in client.models.list()] == ["echo"], timeout_s=60)
    calls = {
        "chat": lambda: client.chat.completions.create(
            model="echo", messages=[{"role": "user", "content": "hi"}], prompt_cache_key=bad
        ),
        "completions": lambda: client.completions.create(
            model="echo", prompt="hi", extra_body={"prompt_cache_key": bad}
        ),
        "responses": lambda: client.responses.create(
            model="echo", input="hi", prompt_cache_key=bad
        ),
    }
    for route, call in calls.items():
        with pytest.raises(openai.BadRequestError) as refused:
            call()
        assert "prompt_cache_key" in str(refused.value), route
    ok = client.chat.completions.create(
        model="echo", messages=[{"role": "user", "content": "hi"}], prompt_cache_key="app-1"
    )
    assert ok.choices[0].message.content  # a good key, and the worker, are unharmed
