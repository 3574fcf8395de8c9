"""The wire format: encoding requests, and decoding any entry without ever raising."""

from __future__ import annotations

import json

from genq.common.errors import MalformedEntry
from genq.common.keys import Keys
from genq.common.models import Request, Result
from genq.common.wire import UndecodableEntry, _decode_slowly, decode_request, encode_request
from genq.producer.building import build_request
from hypothesis import given
from hypothesis import strategies as st


def test_request_round_trips_through_an_entry() -> None:
    req = build_request("hello", max_new_tokens=5, stop=["\n"], priority="high", seed=3)
    fields = encode_request(req)
    assert set(fields) == {"id", "body"}
    assert json.loads(fields["body"]) == {
        "prompt": "hello",
        "max_new_tokens": 5,
        "stop": ["\n"],
        "seed": 3,
    }
    back = decode_request("high", {k.encode(): v.encode() for k, v in fields.items()})
    assert back == req


def test_entry_without_id_is_undecodable_without_id() -> None:
    out = decode_request("normal", {b"body": b'{"prompt": "x"}'})
    assert isinstance(out, UndecodableEntry) and out.request_id is None
    assert "no valid 'id'" in str(out.error)


def test_entry_with_bad_body_keeps_its_id_and_names_the_field() -> None:
    out = decode_request(
        "normal", {b"id": b"r1", b"body": b'{"prompt": "x", "max_new_tokens": -1}'}
    )
    assert isinstance(out, UndecodableEntry) and out.request_id == "r1"
    assert "max_new_tokens" in str(out.error)


def test_entry_with_non_json_body_is_reported() -> None:
    out = decode_request("low", {b"id": b"r2", b"body": b"not json"})
    assert isinstance(out, UndecodableEntry) and out.request_id == "r2"
    assert isinstance(out.error, MalformedEntry)


def test_entry_with_extra_fields_is_reported() -> None:
    out = decode_request("low", {b"id": b"r3", b"body": b'{"prompt":"x"}', b"pickle": b"..."})
    assert isinstance(out, UndecodableEntry) and "pickle" in str(out.error)


def test_non_utf8_body_is_reported_with_id() -> None:
    out = decode_request("low", {b"id": b"r4", b"body": b"\xff\xfe"})
    assert isinstance(out, UndecodableEntry) and out.request_id == "r4"


def test_unknown_body_field_is_reported() -> None:
    out = decode_request("low", {b"id": b"r5", b"body": b'{"prompt":"x","tempreature":1.0}'})
    assert isinstance(out, UndecodableEntry) and "tempreature" in str(out.error)


@given(st.dictionaries(st.binary(max_size=20), st.binary(max_size=200), max_size=5))
def test_decoder_never_raises_on_arbitrary_entries(fields: dict[bytes, bytes]) -> None:
    out = decode_request("normal", fields)
    assert isinstance(out, Request | UndecodableEntry)


@given(
    st.fixed_dictionaries(
        {"id": st.text(max_size=20)},
        optional={
            "prompt": st.one_of(st.text(max_size=50), st.integers(), st.none()),
            "max_new_tokens": st.one_of(st.integers(-5, 20_000), st.floats(), st.text()),
            "temperature": st.one_of(st.floats(allow_nan=True), st.integers()),
        },
    )
)
def test_decoder_accepts_exactly_what_the_model_accepts(body: dict[str, object]) -> None:
    rid = body.pop("id")
    out = decode_request("normal", {"id": str(rid), "body": json.dumps(body)})
    if isinstance(out, Request):
        assert out.id == rid and out.prompt == body["prompt"]


@given(
    st.one_of(st.from_regex(r"[A-Za-z0-9_.:\-]{1,40}", fullmatch=True), st.text(max_size=10)),
    st.one_of(
        st.fixed_dictionaries(
            {"prompt": st.text(max_size=20)},
            optional={
                "max_new_tokens": st.integers(-2, 20_000),
                "id": st.text(max_size=3),
                "stop": st.lists(st.text(max_size=3), max_size=3),
            },
        ).map(json.dumps),
        st.text(max_size=30),
    ),
    st.booleans(),
)
def test_the_fast_decoding_path_agrees_with_the_full_one(rid: str, body: str, extra: bool) -> None:
    fields = {
        b"id": rid.encode("utf-8", "surrogatepass"),
        b"body": body.encode("utf-8", "surrogatepass"),
    }
    if extra:
        fields[b"x"] = b"y"
    flat = [x for pair in fields.items() for x in pair]  # as Redis sends them
    full = _decode_slowly("high", fields)
    for fast in (decode_request("high", fields), decode_request("high", flat)):
        assert type(fast) is type(full)
        if isinstance(fast, UndecodableEntry) and isinstance(full, UndecodableEntry):
            assert (fast.request_id, str(fast.error)) == (full.request_id, str(full.error))
        else:
            assert fast == full


def test_keys_of_a_queue_share_one_hash_tag() -> None:
    keys = Keys("q1")
    assert all("{q1}" in k for k in keys.streams())
    assert Keys.result("abc") == "genq:res:{abc}" and Keys.events("abc") == "genq:ev:{abc}"


def test_result_final_states() -> None:
    assert Result(id="a", status="succeeded").is_final
    assert not Result(id="a", status="queued").is_final


def test_an_id_refused_for_its_characters_says_why() -> None:
    out = decode_request("normal", {b"id": b"has spaces/and slashes", b"body": b'{"prompt": "x"}'})
    assert isinstance(out, UndecodableEntry) and out.request_id is None
    message = str(out.error)
    assert "'has spaces/and slashes' is not a valid request id" in message
    assert "1-128 characters" in message


def test_queue_full_is_importable_beside_the_other_client_errors() -> None:
    from genq.producer import InvalidRequest, QueueFull

    assert issubclass(QueueFull, Exception) and issubclass(InvalidRequest, ValueError)
