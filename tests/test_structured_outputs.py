"""Structured outputs: ``response_format`` (json_schema, json_object, regex,
choice) through every door, enforced by constrained decoding on the transformers engines,
compiled once per worker, batched equal to alone; bad formats refused before queuing, and one
the grammar library cannot compile failing its request alone."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from typing import Any

import jsonschema
import openai
import pytest
from genq.common.errors import InvalidRequest
from genq.common.formats import ResponseFormat
from genq.producer import Client
from genq.producer.building import build_request
from genq.producer.gateway.batch_lines import CHAT, COMPLETIONS, request_args
from genq.producer.gateway.batches import output_files, submit_batch, wait_for_batch
from genq.worker.engines.base import GenerationInput
from genq.worker.engines.continuous import ContinuousEngine
from genq.worker.engines.echo import EchoEngine
from genq.worker.engines.static import StaticEngine
from pydantic import BaseModel, Field

from tests.conftest import varied_prompts, worker_thread

LABEL_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "label": {"enum": ["spam", "ham", "unsure"]},
        "urgent": {"type": "boolean"},
    },
    "required": ["label", "urgent"],
    "additionalProperties": False,
}
"""A schema whose every valid output is short: even a random model ends it."""
FORMATS: list[dict[str, Any]] = [
    {"type": "json_schema", "json_schema": {"name": "label", "schema": LABEL_SCHEMA}},
    {"type": "choice", "choice": ["yes", "no", "it depends"]},
    {"type": "regex", "regex": "[0-9]{3}-[a-z]{2}"},
    {
        "type": "json_schema",
        "json_schema": {
            "name": "pair",
            "schema": {
                "type": "object",
                "properties": {"ok": {"type": "boolean"}, "n": {"enum": [1, 2, 3]}},
                "required": ["ok", "n"],
            },
        },
    },
]


def matches(fmt: dict[str, Any], text: str) -> bool:
    """Whether ``text`` is output of format ``fmt``."""
    if fmt["type"] == "json_schema":
        jsonschema.validate(json.loads(text), fmt["json_schema"]["schema"])
        return True
    if fmt["type"] == "json_object":
        return isinstance(json.loads(text), dict)
    if fmt["type"] == "choice":
        return text in fmt["choice"]
    return re.fullmatch(fmt["regex"], text) is not None


# -- the wire shape, checked on the client side (no torch) ---------------------------------------


def test_bad_formats_are_refused_before_queuing() -> None:
    bad: list[tuple[Any, str]] = [
        (
            {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "bogus"}}},
            "not valid JSON Schema",
        ),
        ({"type": "json_schema", "json_schema": {"name": "x", "schema": []}}, "schema"),
        ({"type": "json_schema"}, "needs 'json_schema'"),
        ({"type": "regex", "regex": "a", "choice": ["a"]}, "belongs to response_format type"),
        ({"type": "choice", "choice": []}, "choice"),
        ({"type": "yaml"}, "type"),
        (
            {
                "type": "json_schema",
                "json_schema": {"name": "big", "schema": {"description": "x" * 100_001}},
            },
            "at most 100000",
        ),
    ]
    for fmt, why in bad:
        with pytest.raises(InvalidRequest, match=why):
            build_request("hi", response_format=fmt)
    with pytest.raises(InvalidRequest, match="'yaml' is not supported"):
        request_args(CHAT, {"messages": [], "response_format": {"type": "yaml"}})
    with pytest.raises(InvalidRequest, match="at most one of"):
        request_args(COMPLETIONS, {"prompt": "x", "guided_regex": "a", "guided_choice": ["a"]})
    with pytest.raises(InvalidRequest, match="grammar"):
        request_args(COMPLETIONS, {"prompt": "x", "structured_outputs": {"grammar": "root ::= x"}})


def test_every_clients_field_becomes_one_response_format() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    as_json_schema = {"type": "json_schema", "json_schema": {"name": "response", "schema": schema}}
    cases: list[tuple[dict[str, Any], Any]] = [
        ({"response_format": {"type": "text"}}, None),
        ({"response_format": {"type": "json_object"}}, {"type": "json_object"}),
        ({"response_format": as_json_schema}, as_json_schema),
        (
            {"response_format": {"type": "choice", "choice": ["a"]}},
            {"type": "choice", "choice": ["a"]},
        ),
        ({"structured_outputs": {"json": schema}}, as_json_schema),
        ({"structured_outputs": {"json": json.dumps(schema)}}, as_json_schema),
        (
            {"structured_outputs": {"regex": "a+", "disable_any_whitespace": True}},
            {"type": "regex", "regex": "a+"},
        ),
        ({"structured_outputs": {"json_object": True}}, {"type": "json_object"}),
        ({"guided_json": schema}, as_json_schema),
        ({"guided_choice": ["x", "y"]}, {"type": "choice", "choice": ["x", "y"]}),
    ]
    for fields, expected in cases:
        args = request_args(COMPLETIONS, {"prompt": "x", **fields})
        assert args.get("response_format") == expected, fields
        if expected is not None:
            assert build_request(**args).response_format == ResponseFormat.model_validate(expected)


def test_a_pydantic_model_is_asked_for_as_its_json_schema() -> None:
    class Person(BaseModel):
        name: str
        age: int

    fmt = build_request("hi", response_format=Person).response_format
    assert fmt is not None and fmt.json_schema is not None
    assert fmt.type == "json_schema" and fmt.json_schema.name == "Person"
    assert fmt.json_schema.schema_ == Person.model_json_schema()
    reordered = {"required": ["age", "name"], **Person.model_json_schema()}
    again = build_request(
        "hi", response_format={"type": "json_schema", "json_schema": {"schema": reordered}}
    )
    assert again.response_format is not None
    same = ResponseFormat.model_validate(
        {"type": "json_schema", "json_schema": {"schema": dict(reversed(list(reordered.items())))}}
    )
    assert again.response_format.cache_key() == same.cache_key()


# -- the engines -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def static() -> StaticEngine:
    return StaticEngine.load("tiny")


def constrained_rows(engine: Any, n: int = 8) -> tuple[list[GenerationInput], list[Any]]:
    """``n`` rows cycling through FORMATS, every fourth one free."""
    ids = engine.tokenize(varied_prompts(n, seed=5))
    rows, fmts = [], []
    for i, p in enumerate(ids):
        fmt = None if i % 4 == 3 else FORMATS[i % len(FORMATS)]
        constraint = None if fmt is None else engine.constrain(ResponseFormat.model_validate(fmt))
        rows.append(GenerationInput(prompt_ids=p, max_new_tokens=40, constraint=constraint))
        fmts.append(fmt)
    return rows, fmts


def test_each_row_matches_its_own_format_and_batched_equals_alone(static: StaticEngine) -> None:
    rows, fmts = constrained_rows(static)
    together = static.generate(rows).outputs
    assert [o.text for o in together] == [static.generate([r]).outputs[0].text for r in rows]
    for out, fmt in zip(together, fmts, strict=True):
        if fmt is not None:
            assert out.finish_reason == "stop" and matches(fmt, out.text), (fmt, out)


def test_the_continuous_engine_runs_constrained_rows_with_free_ones(static: StaticEngine) -> None:
    engine = ContinuousEngine(
        static.model, static.tokenizer, max_batch_tokens=4096, max_batch_size=16
    )
    try:
        rows, fmts = constrained_rows(engine)
        outputs = engine.generate(rows).outputs
    finally:
        engine.close()
    assert [o.text for o in outputs] == [o.text for o in static.generate(rows).outputs]
    assert all(matches(f, o.text) for f, o in zip(fmts, outputs, strict=True) if f)


def test_a_format_is_compiled_once_and_an_uncompilable_one_says_why() -> None:
    engine = StaticEngine.load("tiny")
    cache = engine.grammars
    fmt = ResponseFormat.model_validate(FORMATS[0])
    first = engine.constrain(fmt)
    for _ in range(50):
        assert engine.constrain(ResponseFormat.model_validate(FORMATS[0])) is first
    assert (cache.misses, cache.hits, len(cache)) == (1, 50, 1) and cache.bytes > 0
    with pytest.raises(InvalidRequest, match=r"response_format \(regex\) cannot be compiled"):
        engine.constrain(ResponseFormat(type="regex", regex="(unclosed"))
    with pytest.raises(InvalidRequest, match="cannot be compiled"):
        engine.constrain(
            ResponseFormat.model_validate(
                {"type": "json_schema", "json_schema": {"schema": {"$ref": "#/$defs/missing"}}}
            )
        )
    with pytest.raises(InvalidRequest, match="--engine echo only echoes"):
        EchoEngine().constrain(fmt)


# -- through the queue -----------------------------------------------------------------------


@pytest.fixture()
def static_worker(redis_url: str, queue: str, static: StaticEngine) -> Iterator[Client]:
    with (
        worker_thread(redis_url, queue, static),
        Client.from_url(redis_url, queue) as client,
    ):
        yield client


def test_an_uncompilable_format_fails_its_request_alone(static_worker: Client) -> None:
    client = static_worker
    good = [
        client.submit(p, response_format=FORMATS[0], max_new_tokens=48) for p in varied_prompts(3)
    ]
    bad = client.submit("x", response_format={"type": "regex", "regex": "[a-"})
    missing = client.submit(
        "y",
        response_format={"type": "json_schema", "json_schema": {"schema": {"$ref": "#/$defs/no"}}},
    )
    *ok, refused, unresolved = client.results([*good, bad, missing], timeout=120)
    for result in ok:
        assert result.status == "succeeded" and matches(FORMATS[0], result.text or "")
    for result in (refused, unresolved):
        assert result.status == "failed" and result.error is not None
        assert result.error.code == "invalid_request"
        assert "cannot be compiled to a grammar" in result.error.message


def test_a_500_line_batch_file_with_one_schema_all_parse_on_the_continuous_engine(
    redis_url: str, queue: str, static: StaticEngine
) -> None:
    engine = ContinuousEngine(
        static.model, static.tokenizer, max_batch_tokens=8192, max_batch_size=32
    )
    fmt = FORMATS[0]
    lines = [
        json.dumps(
            {
                "custom_id": f"doc-{i}",
                "method": "POST",
                "url": CHAT,
                "body": {
                    "messages": [{"role": "user", "content": f"Classify message {i}: {p}"}],
                    "max_tokens": 48,
                    "response_format": fmt,
                },
            }
        )
        for i, p in enumerate(varied_prompts(500, seed=11))
    ]
    with (
        worker_thread(redis_url, queue, engine, max_batch_size=32),
        Client.from_url(redis_url, queue) as client,
    ):
        batch = submit_batch(client, lines, source="labels.jsonl")
        assert batch.submitted == 500 and not batch.rejected
        view = wait_for_batch(client, batch.id, timeout_s=600)
        ok, errors, waiting = output_files(view)
        assert (len(ok), errors, waiting) == (500, [], 0)
        for line in ok:
            content = line["response"]["body"]["choices"][0]["message"]["content"]
            jsonschema.validate(json.loads(content), LABEL_SCHEMA)
    assert len(engine.grammars) == 1 and engine.grammars.misses == 1  # compiled once


# -- the openai SDK, unmodified, through genq serve ------------------------------------------


class Person(BaseModel):
    """What chat.completions.parse asks the model for."""

    name: str = Field(max_length=24)
    age: int = Field(ge=0, le=130)


def test_chat_completions_parse_returns_a_parsed_object_streaming_too(
    sdk_serving: Callable[[str], openai.OpenAI],
) -> None:
    client = sdk_serving("smollm2-135m")
    messages: Any = [
        {"role": "user", "content": "Ann is 31 years old. Give her name and age as JSON."}
    ]
    done = client.chat.completions.parse(
        model="smollm2-135m", messages=messages, response_format=Person, max_tokens=40
    )
    person = done.choices[0].message.parsed
    assert isinstance(person, Person) and done.choices[0].finish_reason == "stop"
    assert Person.model_validate_json(done.choices[0].message.content or "") == person
    with client.chat.completions.stream(
        model="smollm2-135m", messages=messages, response_format=Person, max_tokens=40
    ) as stream:
        pieces = [e.delta for e in stream if e.type == "content.delta"]
        final = stream.get_final_completion()
    assert "".join(pieces) == final.choices[0].message.content
    assert final.choices[0].message.parsed == person  # greedy: the same answer
    label = client.completions.create(
        model="smollm2-135m",
        prompt="The film was wonderful, I loved it. Sentiment (positive or negative):",
        max_tokens=5,
        extra_body={"structured_outputs": {"choice": ["positive", "negative"]}},
    )
    assert label.choices[0].text in ("positive", "negative")
    with pytest.raises(openai.BadRequestError, match="not valid JSON Schema"):
        client.chat.completions.create(
            model="smollm2-135m",
            messages=messages,
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": "object", "required": "name"}},
            },
        )


def test_the_echo_engine_refuses_a_format_clearly(
    sdk_serving: Callable[[str], openai.OpenAI],
) -> None:
    with pytest.raises(openai.BadRequestError, match="--engine echo only echoes"):
        sdk_serving("echo").chat.completions.create(
            model="echo",
            messages=[{"role": "user", "content": "hi"}],
            response_format={"type": "json_object"},
        )
