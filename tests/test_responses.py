"""``/v1/responses``: the unmodified openai SDK against ``genq serve``,
background and foreground, streamed, continued with ``previous_response_id``, cancelled,
deleted, across gateway replicas (one killed with -9), per tenant; every Response object the
gateway sends validated with ``openai.types.responses.Response``. The wire shapes alone are
unit-tested without Redis (``producer/gateway/responses.py`` is pure)."""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import openai
import pytest
from genq.common.errors import InvalidRequest
from genq.common.models import Result
from genq.producer.gateway.responses import items_page, parse_create, status_of
from genq.worker.devtools.gateway_process import GatewayProcess
from openai.types.responses import Response
from pydantic import BaseModel

from tests.conftest import WorkerProcess, wait_until

KEY = "sk-genq-test"


def valid(client: openai.OpenAI, response_id: str) -> Response:
    """The response as the gateway sends it, validated field by field by the SDK's model (the
    SDK's own calls build objects without validating)."""
    raw = client.responses.with_raw_response.retrieve(response_id)
    return Response.model_validate(raw.http_response.json())


def final(client: openai.OpenAI, response_id: str, timeout_s: float = 60) -> Response:
    wait_until(
        lambda: valid(client, response_id).status not in ("queued", "in_progress"),
        timeout_s=timeout_s,
    )
    return valid(client, response_id)


# -- the wire shapes, without Redis ----------------------------------------------------------


def test_a_create_body_becomes_messages_options_and_a_format() -> None:
    args = parse_create(
        {
            "model": "m",
            "input": [
                {"role": "developer", "content": "Be brief."},
                {"role": "user", "content": [{"type": "input_text", "text": "Hi"}]},
            ],
            "instructions": "You are genq.",
            "max_output_tokens": 7,
            "temperature": 0.5,
            "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}}},
            "truncation": "disabled",
            "store": True,
            "priority": "high",
        }
    )
    assert [i["role"] for i in args.input_items] == ["developer", "user"]
    assert args.options == {
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "x", "schema": {"type": "object"}},
        },
        "max_new_tokens": 7,
        "temperature": 0.5,
        "priority": "high",
    }
    assert parse_create({"input": "Hello"}).input_items[0]["content"][0]["text"] == "Hello"


@pytest.mark.parametrize(
    ("body", "named"),
    [
        ({"input": "x", "reasoning": {"effort": "high"}}, "reasoning"),
        ({"input": "x", "background": True, "store": False}, "store"),
        ({"input": [{"type": "function_call_output", "output": "1"}]}, "function_call_output"),
        ({"input": "x", "text": {"format": {"type": "grammar"}}}, "grammar"),
        ({"input": "x", "previous_response_id": "chatcmpl-1"}, "previous_response_id"),
        ({"input": []}, "input"),
        ({"input": "x", "tools": [{"type": "web_search"}]}, "tools"),
    ],
)
def test_what_genq_cannot_do_is_a_clear_error_naming_it(body: dict[str, Any], named: str) -> None:
    with pytest.raises(InvalidRequest, match=named):
        parse_create(body)


def test_a_status_is_read_from_the_requests_state() -> None:
    def state(status: str, finish: str | None = None) -> Result:
        return Result(id="r", status=status, finish_reason=finish)  # type: ignore[arg-type]

    assert status_of(None) == "queued"
    assert status_of(state("running")) == "in_progress"
    assert status_of(state("succeeded", "stop")) == "completed"
    assert status_of(state("succeeded", "length")) == "incomplete"
    assert status_of(state("expired")) == "failed"
    assert status_of(state("cancelled")) == "cancelled"


def test_input_items_page_in_either_order() -> None:
    items = [{"id": f"i{n}"} for n in range(5)]
    page = items_page(items, order="desc", limit=2, after=None)
    assert [i["id"] for i in page["data"]] == ["i4", "i3"] and page["has_more"]
    page = items_page(items, order="asc", limit=10, after="i2")
    assert [i["id"] for i in page["data"]] == ["i3", "i4"] and not page["has_more"]


# -- through genq serve ----------------------------------------------------------------------


def test_a_background_response_is_queued_at_once_and_completes(
    sdk_serving: Callable[[str], Any],
) -> None:
    client = sdk_serving("echo")
    created = client.responses.create(
        model="echo", input="Say hi", instructions="Be brief.", background=True, metadata={"a": "b"}
    )
    assert created.status == "queued" and created.background
    done = final(client, created.id)
    assert done.status == "completed" and done.metadata == {"a": "b"}
    assert done.output_text == "system: Be brief.\nuser: Say hi\nassistant:"  # echo: the prompt
    assert done.usage is not None and done.usage.output_tokens == len(done.output_text)
    items = client.responses.input_items.list(created.id, order="asc")
    assert [(i.role, i.content[0].text) for i in items.data] == [("user", "Say hi")]  # type: ignore[union-attr]


def test_a_foreground_response_answers_when_final_and_a_short_one_is_incomplete(
    sdk_serving: Callable[[str], Any],
) -> None:
    client = sdk_serving("echo")
    done = client.responses.create(model="echo", input="Tell me a long story")
    assert done.status == "completed"
    Response.model_validate(done.model_dump())
    short = client.responses.create(model="echo", input="Tell me a long story", max_output_tokens=5)
    assert short.status == "incomplete" and short.output_text == "user:"
    assert short.incomplete_details is not None
    assert short.incomplete_details.reason == "max_output_tokens"


def test_previous_response_id_makes_the_earlier_turn_the_context(
    sdk_serving: Callable[[str], Any],
) -> None:
    client = sdk_serving("echo")
    first = client.responses.create(model="echo", input="One", instructions="Only here.")
    second = client.responses.create(
        model="echo", input="Two", previous_response_id=first.id, max_output_tokens=200
    )
    # The first's input and output come first; its instructions are its own (as OpenAI's).
    said = f"user: One\nassistant: {first.output_text}\nuser: Two\nassistant:"
    assert second.output_text == said
    assert valid(client, second.id).previous_response_id == first.id
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="echo", input="x", previous_response_id="resp_nothing")


def test_a_streamed_response_sends_openais_events_in_order(
    sdk_serving: Callable[[str], Any],
) -> None:
    client = sdk_serving("echo")
    events = list(client.responses.create(model="echo", input="Stream me", stream=True))
    kinds = [e.type for e in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")  # type: ignore[union-attr]
    last = events[-1].response  # type: ignore[union-attr]
    assert deltas == last.output_text == "user: Stream me\nassistant:"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert valid(client, last.id).status == "completed"  # stored like any other


def test_cancel_and_delete(
    openai_client: openai.OpenAI, queue: str, start_worker: Callable[..., WorkerProcess]
) -> None:
    start_worker(queue, "--engine", "echo", "--echo-step-ms", "100", "--max-batch-size", "1")
    wait_until(lambda: len(openai_client.models.list().data) == 1, timeout_s=60)
    client = openai_client
    busy = client.responses.create(
        model="echo", input="busy", max_output_tokens=30, background=True
    )
    waiting = client.responses.create(model="echo", input="wait", background=True)
    cancelled = client.responses.cancel(waiting.id)
    assert cancelled.status == "cancelled"
    assert final(client, busy.id).status == "completed"
    assert valid(client, waiting.id).status == "cancelled"
    foreground = client.responses.create(model="echo", input="z", max_output_tokens=1)
    with pytest.raises(openai.BadRequestError, match="background"):
        client.responses.cancel(foreground.id)
    deleted = client.responses.delete(busy.id)
    assert deleted is None or getattr(deleted, "deleted", True)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(busy.id)


def test_a_failed_background_response_says_why(sdk_serving: Callable[[str], Any]) -> None:
    client = sdk_serving("echo")
    created = client.responses.create(
        model="echo", input="x", background=True, text={"format": {"type": "json_object"}}
    )
    done = final(client, created.id)
    assert done.status == "failed" and done.error is not None
    assert done.error.code == "invalid_prompt" and "response_format" in done.error.message


class City(BaseModel):
    name: str
    country: str


def test_text_format_parses_into_a_pydantic_model_on_a_real_model(
    sdk_serving: Callable[[str], Any],
) -> None:
    client = sdk_serving("smollm2-135m")
    parsed = client.responses.parse(
        model="smollm2-135m",
        input="Name a city in France and its country.",
        text_format=City,
        max_output_tokens=40,
    )
    assert isinstance(parsed.output_parsed, City)


def test_responses_outlive_a_gateway_killed_with_9_and_stay_within_their_tenant(
    redis_url: str, queue: str, tmp_path: Path, start_worker: Callable[..., WorkerProcess]
) -> None:
    keys = ["--api-key", "key-a=team-a", "--api-key", "key-b=team-b"]
    first = GatewayProcess(redis_url, queue, tmp_path / "g1.log", keys)
    second = GatewayProcess(redis_url, queue, tmp_path / "g2.log", keys)
    try:
        start_worker(queue, "--engine", "echo", "--echo-step-ms", "20")
        a1 = openai.OpenAI(base_url=first.url, api_key="key-a", max_retries=0)
        wait_until(lambda: len(a1.models.list().data) == 1, timeout_s=60)
        ids = [
            a1.responses.create(model="echo", input=f"n{i}", background=True).id for i in range(8)
        ]
        first.proc.send_signal(signal.SIGKILL)
        first.proc.wait()
        a2 = openai.OpenAI(base_url=second.url, api_key="key-a", max_retries=0)
        assert [final(a2, i).status for i in ids] == ["completed"] * 8
        assert final(a2, ids[3]).output_text == "user: n3\nassistant:"
        b = openai.OpenAI(base_url=second.url, api_key="key-b", max_retries=0)
        with pytest.raises(openai.NotFoundError):
            b.responses.retrieve(ids[0])  # another tenant's: as if it did not exist
        with pytest.raises(openai.NotFoundError):
            b.responses.delete(ids[0])
    finally:
        first.stop()
        second.stop()
