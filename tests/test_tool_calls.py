"""Tool calls on chats: tools and tool_choice on every door; a named function
and ``required`` forced by constrained decoding (arguments valid under the schema, any model);
``auto`` read from Hermes-format blocks where the template teaches them; OpenAI's shapes."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import jsonschema
import openai
import pytest
from genq.common.errors import InvalidRequest
from genq.common.keys import Keys
from genq.common.models import Result
from genq.common.tools import calls_in_text, forced_calls, forced_format
from genq.producer.building import build_request
from genq.producer.gateway.batch_lines import CHAT, request_args
from genq.worker.engines.base import GenerationOutput
from genq.worker.engines.chat import TOOLS_NOTE, prompt_text
from genq.worker.policy.lookahead import Held
from genq.worker.runtime.outcomes import Outcomes

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city now.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 40},
                "unit": {"enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {
            "type": "object",
            "properties": {"timezone": {"type": "string", "maxLength": 40}},
            "required": ["timezone"],
        },
    },
}
ASK = [{"role": "user", "content": "What is the weather in Paris, in celsius?"}]


def test_bad_tools_are_refused_before_queuing() -> None:
    cases: list[tuple[dict[str, Any], str]] = [
        ({"tool_choice": "required"}, "needs tools"),
        (
            {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "x"}}},
            "not in tools",
        ),
        ({"tools": [WEATHER, WEATHER]}, "same name"),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": 3}}}]},
            "function.parameters is not valid JSON Schema",
        ),
        (
            {
                "tools": [WEATHER],
                "tool_choice": "required",
                "response_format": {"type": "json_object"},
            },
            "not both",
        ),
        ({"tools": [WEATHER], "stream": True}, "stream with tools"),
    ]
    for fields, why in cases:
        with pytest.raises(InvalidRequest, match=why):
            build_request(messages=ASK, **fields)
    with pytest.raises(InvalidRequest, match="tools are for chats"):
        build_request("a prompt", tools=[WEATHER])
    args = request_args(
        CHAT,
        {"messages": ASK, "tools": [WEATHER], "tool_choice": "auto", "parallel_tool_calls": True},
    )
    assert build_request(**args).tools is not None
    # LangChain's with_structured_output(method="function_calling") sends false: genq makes at
    # most one call per choice anyway, so both are accepted; a non-boolean is refused.
    for value in (False, True):
        args = request_args(
            CHAT, {"messages": ASK, "tools": [WEATHER], "parallel_tool_calls": value}
        )
        assert build_request(**args).tools is not None
    with pytest.raises(InvalidRequest, match="parallel_tool_calls"):
        request_args(CHAT, {"messages": ASK, "parallel_tool_calls": "yes"})


def test_forced_calls_have_schema_valid_arguments_by_construction() -> None:
    request = build_request(messages=ASK, tools=[WEATHER, TIME], tool_choice="required")
    fmt = forced_format(request.tools, request.tool_choice)
    assert fmt is not None and fmt.json_schema is not None
    assert [b["properties"]["name"]["const"] for b in fmt.json_schema.schema_["anyOf"]] == [
        "get_weather",
        "get_time",
    ]
    [call] = (
        forced_calls('{"name": "get_time", "arguments": {"timezone": "CET"}}', "required") or []
    )
    assert call["function"] == {"name": "get_time", "arguments": '{"timezone": "CET"}'}
    assert call["id"].startswith("call_") and call["type"] == "function"
    named = build_request(
        messages=ASK,
        tools=[WEATHER],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )
    assert named.tool_choice is not None and named.tool_choice != "auto"
    [call] = forced_calls('{"city": "Paris", "unit": "celsius"}', named.tool_choice) or []
    assert call["function"]["name"] == "get_weather"
    assert forced_calls('{"city": "Par', "required") is None  # cut short: no call
    weather = '{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "celsius"}}'
    text = f"Let me check.\n<tool_call>\n{weather}\n</tool_call>\n<tool_call>"
    text += '{"name": "rm_rf", "arguments": {}}</tool_call>'
    rest, calls = calls_in_text(text, {"get_weather"})
    assert [c["function"]["name"] for c in calls] == ["get_weather"]
    assert rest.startswith("Let me check.") and "rm_rf" in rest  # an unknown function is not called


def test_tools_reach_the_template_or_a_system_note(tmp_path: Any) -> None:
    from genq.worker.engines.static import load_model

    _, tokenizer = load_model("smollm2-135m")
    request = build_request(messages=ASK, tools=[WEATHER])
    text = prompt_text(request, tokenizer)  # SmolLM2's template takes no tools: a system note
    assert TOOLS_NOTE.splitlines()[0] in text and '"get_weather"' in text
    assert TOOLS_NOTE.splitlines()[0] not in prompt_text(
        build_request(messages=ASK, tools=[WEATHER], tool_choice="none"), tokenizer
    )
    tokenizer.chat_template = (
        "{% if tools %}<tools>{{ tools | tojson }}</tools>{% endif %}"
        "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% if m.tool_calls %}"
        "{% for c in m.tool_calls %}<tool_call>{{ c.function | tojson }}</tool_call>{% endfor %}"
        "{% endif %}</{{ m.role }}>{% endfor %}<assistant>"
    )
    history = [
        *ASK,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {
                        "name": "get_weather",
                        "arguments": '{"city": "Paris", "unit": "celsius"}',
                    },
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "18 degrees"},
    ]
    text = prompt_text(build_request(messages=history, tools=[WEATHER]), tokenizer)
    assert text.startswith("<tools>[") and TOOLS_NOTE.splitlines()[0] not in text
    assert (
        '"arguments": {"city": "Paris", "unit": "celsius"}' in text
        and "<tool>18 degrees</tool>" in text
    )


def test_auto_calls_are_read_where_the_template_teaches_the_format() -> None:
    request = build_request(messages=ASK, tools=[WEATHER], request_id="r1")
    held = Held(stream="s", entry_id="1-0", request=request, prompt_ids=[1, 2], enqueued_ms=1)
    call = '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}'
    text = f"<tool_call>{call}</tool_call>"
    out = GenerationOutput(text=text, completion_tokens=20, finish_reason="stop")
    for reads, calls in ((True, 1), (False, 0)):
        outcomes = Outcomes(worker="w", keys=Keys("q"), model="m", reads_tool_calls=reads)
        state = outcomes.succeeded(
            held, out, started_ms=2, finished_ms=3, generation_ms=1, batch_size=1
        ).state_json
        result = Result.model_validate_json(state)
        assert len(result.tool_calls or []) == calls
        assert result.finish_reason == ("tool_calls" if calls else "stop") and result.text == text


def test_the_sdk_calls_tools_on_a_model_without_a_tool_template(
    sdk_serving: Callable[[str], openai.OpenAI],
) -> None:
    client = sdk_serving("smollm2-135m")
    named = client.chat.completions.create(
        model="smollm2-135m",
        messages=ASK,  # type: ignore[arg-type]
        tools=[WEATHER],  # type: ignore[list-item]
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        max_tokens=40,
    )
    choice = named.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    [call] = choice.message.tool_calls or []
    assert call.type == "function" and call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])
    required = client.chat.completions.create(
        model="smollm2-135m",
        messages=ASK,
        tools=[WEATHER, TIME],
        tool_choice="required",
        max_tokens=60,  # type: ignore[arg-type, list-item]
    )
    [call] = required.choices[0].message.tool_calls or []
    tool = {"get_weather": WEATHER, "get_time": TIME}[call.function.name]
    jsonschema.validate(json.loads(call.function.arguments), tool["function"]["parameters"])
    answer = client.chat.completions.create(
        model="smollm2-135m",
        messages=[
            *ASK,
            {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
            {"role": "tool", "tool_call_id": call.id, "content": "18 degrees and sunny"},
        ],  # type: ignore[list-item]
        tools=[WEATHER],  # type: ignore[list-item]
        max_tokens=20,
    )
    assert answer.choices[0].finish_reason in ("stop", "length")
    assert answer.choices[0].message.content and not answer.choices[0].message.tool_calls


def test_a_chat_the_template_cannot_render_fails_alone(redis_url: str, queue: str) -> None:
    from genq.producer import Client
    from genq.worker.engines.static import StaticEngine

    from tests.conftest import worker_thread

    engine = StaticEngine.load("tiny")
    engine.tokenizer.chat_template = (
        "{% for m in messages %}{% if m.role == 'oops' %}{{ raise_exception('no oops here') }}"
        "{% endif %}{{ m.role }}: {{ m.content }}\n{% endfor %}assistant:"
    )
    with worker_thread(redis_url, queue, engine), Client.from_url(redis_url, queue) as client:
        bad, good = client.results(
            client.submit_many(
                [
                    {"messages": [{"role": "oops", "content": "x"}], "max_new_tokens": 4},
                    {"messages": [{"role": "user", "content": "hi"}], "max_new_tokens": 4},
                ]
            ),
            timeout=60,
        )
    assert bad.status == "failed" and bad.error is not None and bad.error.code == "invalid_request"
    assert (
        "chat template cannot render" in bad.error.message and "no oops here" in bad.error.message
    )
    assert good.status == "succeeded"
