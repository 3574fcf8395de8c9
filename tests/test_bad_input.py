"""Bad input, property-based: the entry decoder never raises and never accepts nonsense, the
client's validation raises only InvalidRequest; and through a real worker, every listed way an
entry can be wrong ends with a clear failure (or the dead-letter stream) and harms nothing."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

import redis
from genq.common.errors import InvalidRequest
from genq.common.keys import Keys
from genq.common.models import Request
from genq.common.wire import UndecodableEntry, decode_request
from genq.producer import Client
from genq.producer.building import build_request
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import WorkerProcess, wait_until

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=10,
)
body_dicts = st.dictionaries(
    st.sampled_from(
        [
            "prompt",
            "max_new_tokens",
            "temperature",
            "top_p",
            "top_k",
            "seed",
            "stop",
            "stream",
            "deadline_unix_ms",
            "metadata",
            "extra",
        ]
    )
    | st.text(),
    json_values,
    max_size=8,
)
raw = st.binary(max_size=200) | st.text(max_size=200).map(str.encode)


@settings(max_examples=300, deadline=None)
@given(
    fields=st.dictionaries(
        st.sampled_from([b"id", b"body", b"other"]) | st.binary(max_size=8), raw, max_size=4
    )
)
def test_the_decoder_never_raises_on_arbitrary_fields(fields: dict[bytes, bytes]) -> None:
    out = decode_request("normal", fields)
    assert isinstance(out, Request | UndecodableEntry)
    if isinstance(out, UndecodableEntry):
        assert str(out.error)  # a message a person can read


@settings(max_examples=300, deadline=None)
@given(request_id=st.text(max_size=140), body=body_dicts)
def test_the_decoder_accepts_only_valid_bodies(request_id: str, body: dict[str, Any]) -> None:
    fields = {b"id": request_id.encode(), b"body": json.dumps(body).encode()}
    out = decode_request("high", fields)
    if isinstance(out, Request):
        assert out.prompt == body["prompt"] and isinstance(out.prompt, str)
        assert 1 <= out.max_new_tokens <= 16384
        assert math.isfinite(out.temperature) and out.temperature >= 0
        assert 0 < out.top_p <= 1 and out.top_k >= 0
        assert set(body) <= set(Request.model_fields)
    else:
        assert str(out.error)


@settings(max_examples=300, deadline=None)
@given(
    prompt=st.text(max_size=50) | st.integers() | st.none(),
    max_new_tokens=st.integers(-5, 20000) | st.floats(allow_nan=True) | st.text(max_size=3),
    temperature=st.floats(allow_nan=True, allow_infinity=True) | st.integers(-3, 200),
    top_p=st.floats(allow_nan=True, allow_infinity=True),
    top_k=st.integers(-3, 10**6),
    priority=st.sampled_from(["high", "normal", "low", "urgent", "", "HIGH"]),
    stop=st.lists(st.text(max_size=5), max_size=20) | st.text(max_size=5),
    request_id=st.none() | st.text(max_size=200),
)
def test_client_validation_raises_only_invalid_request(**kwargs: Any) -> None:
    prompt = kwargs.pop("prompt")
    try:
        req = build_request(prompt, **kwargs)  # type: ignore[arg-type]
    except InvalidRequest as err:
        assert str(err).startswith("invalid request")
        return
    assert isinstance(req.prompt, str) and 1 <= req.max_new_tokens <= 16384
    assert math.isfinite(req.temperature) and math.isfinite(req.top_p)
    assert req.priority in ("high", "normal", "low")


def test_every_kind_of_bad_entry_fails_clearly_and_harms_nothing_else(
    redis_url: str, queue: str, r: redis.Redis, start_worker: Callable[..., WorkerProcess]
) -> None:
    keys = Keys(queue)
    stream = keys.stream("normal")
    client = Client.from_url(redis_url, queue)
    good = client.submit_many([f"good {i}" for i in range(5)], max_new_tokens=8)
    bad_bodies: dict[str, Any] = {
        "b-missing-prompt": {"max_new_tokens": 4},
        "b-extra-field": {"prompt": "x", "colour": "blue"},
        "b-wrong-type": {"prompt": 42},
        "b-empty-prompt": {"prompt": ""},
        "b-negative": {"prompt": "x", "max_new_tokens": -3},
        "b-beyond-limit": {"prompt": "x", "max_new_tokens": 5000},
        "b-nan": {"prompt": "x", "temperature": float("nan")},
        "b-top-p": {"prompt": "x", "top_p": 7},
        "b-huge-prompt": {"prompt": "y" * 200_000},
        "b-not-object": ["prompt", "x"],
    }
    for request_id, body in bad_bodies.items():
        r.xadd(stream, {"id": request_id, "body": json.dumps(body)})
    r.xadd(stream, {"id": "b-not-utf8", "body": b'{"prompt": "\xff\xfe"}'})
    r.xadd(stream, {"id": "b-no-body"})
    r.xadd(stream, {"id": "b-extra-entry-field", "body": '{"prompt": "x"}', "more": "1"})
    r.xadd(keys.stream("high"), {"id": "bad id with spaces", "body": '{"prompt": "x"}'})
    r.xadd(keys.stream("low"), {"whatever": "not the format"})
    start_worker(
        queue, "--engine", "echo", "--max-new-tokens-limit", "1024", "--max-prompt-tokens", "100000"
    )
    failed_ids = [*bad_bodies, "b-not-utf8", "b-no-body", "b-extra-entry-field"]
    results = {x.id: x for x in client.results([*good, *failed_ids], timeout=60)}
    assert all(results[i].status == "succeeded" for i in good)
    for request_id in failed_ids:
        res = results[request_id]
        assert res.status == "failed", request_id
        assert res.error is not None and len(res.error.message) > 10, request_id
    assert "max_new_tokens" in str(results["b-beyond-limit"].error)
    assert "1024" in str(results["b-beyond-limit"].error)
    assert "prompt" in str(results["b-huge-prompt"].error)
    wait_until(lambda: r.xlen(keys.dead_letter) == 2)  # the two entries with no usable id
    wait_until(lambda: sum(r.xlen(s) for s in keys.streams()) == 0)
