"""Chat requests: validated on both sides, rendered with the model's chat template."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from genq.common.errors import InvalidRequest
from genq.producer import Client
from genq.producer.building import build_request
from genq.worker.engines.chat import prompt_text
from genq.worker.engines.static import StaticEngine

from tests.conftest import WorkerProcess

CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]


def test_a_request_has_a_prompt_or_messages_never_both_nor_neither() -> None:
    assert build_request(messages=CHAT).messages is not None
    with pytest.raises(InvalidRequest, match="exactly one of 'prompt', 'messages' and 'input'"):
        build_request("text", messages=CHAT)
    with pytest.raises(InvalidRequest, match="exactly one"):
        build_request()
    with pytest.raises(InvalidRequest, match="messages"):
        build_request(messages=[{"role": "user"}])  # no content
    with pytest.raises(InvalidRequest, match="messages"):
        build_request(messages=[])


def test_messages_use_the_models_chat_template_or_role_lines_without_one() -> None:
    engine = StaticEngine.load("tiny")
    request = build_request(messages=CHAT)
    assert prompt_text(request, engine.tokenizer) == (
        "system: Be brief.\nuser: Hi there\nassistant:"
    )  # the tiny tokenizer has no template
    engine.tokenizer.chat_template = (
        "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}"
    )
    try:
        assert prompt_text(request, engine.tokenizer) == (
            "<|system|>Be brief.<|user|>Hi there<|assistant|>"
        )
    finally:
        engine.tokenizer.chat_template = None
    assert prompt_text(build_request("plain"), engine.tokenizer) == "plain"


def test_a_chat_request_runs_end_to_end(
    redis_url: str, queue: str, start_worker: Callable[..., WorkerProcess]
) -> None:
    start_worker(queue, "--engine", "echo")
    client = Client.from_url(redis_url, queue)
    res = client.generate(messages=CHAT, max_new_tokens=200, timeout=30)
    assert res.status == "succeeded"
    assert res.text == "system: Be brief.\nuser: Hi there\nassistant:"  # echo shows the prompt
