"""The wire format: how requests become stream entries and results become events.

A work entry has exactly two fields, both UTF-8 text:

- ``id``: the request id (``[A-Za-z0-9_.:-]{1,128}``);
- ``body``: a JSON object with the request's other fields (see ``RequestBody``).

Its priority is the stream it is in. An event entry has ``type`` (``delta``: a piece of
streamed text; ``final``: last) and ``data`` (JSON: ``{"text": ...}`` for ``delta``, the Result
for ``final``). Only JSON is ever decoded.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import orjson
from genq.common.errors import MalformedEntry
from genq.common.models import REQUEST_ID_CHARS, Priority, Request, Result
from pydantic import ValidationError

ID_FIELD = "id"
BODY_FIELD = "body"
EVENT_TYPE_FIELD = "type"
EVENT_DATA_FIELD = "data"
FINAL_EVENT = "final"
DELTA_EVENT = "delta"


def encode_request(request: Request) -> dict[str, str]:
    """The fields of the stream entry for ``request``."""
    # The body's fields straight from the validated request (no second validation).
    body = request.model_dump_json(exclude={"id", "priority"}, exclude_defaults=True)
    return {ID_FIELD: request.id, BODY_FIELD: body}


@dataclass(frozen=True)
class UndecodableEntry:
    """An entry that is not a valid request. ``request_id`` is set when the entry had a usable id,
    so the failure can be reported to whoever waits on it."""

    request_id: str | None
    error: MalformedEntry


def describe_validation_error(err: ValidationError) -> str:
    """One line naming each bad field and what is wrong with it."""
    parts = []
    for e in err.errors():
        loc = ".".join(str(x) for x in e["loc"]) or "body"
        parts.append(f"{loc}: {e['msg']}")
    return "; ".join(parts)


def as_text(value: object, errors: str = "strict") -> str:
    """A Redis reply's value as text (clients may decode replies or not). Bytes that are not
    UTF-8 raise UnicodeDecodeError (``errors="replace"``: replacement characters, for showing
    what an entry held)."""
    return value.decode("utf-8", errors) if isinstance(value, bytes) else str(value)


_REQUEST_ID = re.compile(REQUEST_ID_CHARS)


_ID_KEY, _BODY_KEY = ID_FIELD.encode(), BODY_FIELD.encode()
_MISPLACED = frozenset({"id", "priority"})  # the entry's and the stream's, not the body's
_REQUEST_VALIDATOR = Request.__pydantic_validator__
_RESULT_VALIDATOR = Result.__pydantic_validator__


def as_dict(fields: Any) -> dict[Any, Any]:
    """An entry's fields as a dict, from a flat list or a dict (or None: deleted)."""
    if not fields:
        return {}
    if isinstance(fields, dict):
        return fields
    return dict(zip(fields[::2], fields[1::2], strict=True))


def decode_request(
    priority: Priority, fields: dict[bytes, bytes] | dict[str, str] | list[bytes]
) -> Request | UndecodableEntry:
    """Decode a work entry's fields (a dict, or the flat ``[field, value, ...]`` list Redis
    sends). Never raises: what cannot be decoded comes back as UndecodableEntry."""
    # The common case, checked without building anything: exactly the two fields, a valid id,
    # a body that is a JSON object. Everything else takes the full path, which says what is
    # wrong.
    if isinstance(fields, list):
        if len(fields) == 4 and fields[0] == _ID_KEY and fields[2] == _BODY_KEY:
            fast = _decode_quickly(priority, fields[1], fields[3])
            if fast is not None:
                return fast
        if len(set(fields[::2])) < len(fields) // 2:
            return _repeated_fields(fields)
        return _decode_slowly(priority, dict(zip(fields[::2], fields[1::2], strict=False)))
    if len(fields) == 2:
        got: dict[Any, Any] = fields
        fast = _decode_quickly(priority, got.get(_ID_KEY), got.get(_BODY_KEY))
        if fast is not None:
            return fast
    return _decode_slowly(priority, fields)


def _decode_quickly(
    priority: Priority, raw_id: object, raw_body: object
) -> Request | UndecodableEntry | None:
    """The common case, or None when anything about the entry needs the full path."""
    if not isinstance(raw_id, bytes) or not isinstance(raw_body, bytes):
        return None
    try:
        request_id, body = raw_id.decode(), orjson.loads(raw_body)
    except (UnicodeDecodeError, orjson.JSONDecodeError):
        return None
    if (
        _REQUEST_ID.fullmatch(request_id)
        and isinstance(body, dict)
        and not _MISPLACED.intersection(body)
    ):
        return _validated(body, request_id, priority)
    return None


def _validated(
    body: dict[str, object], request_id: str, priority: Priority
) -> Request | UndecodableEntry:
    # One validation: the body's fields, plus id and priority from the entry, added in place
    # (``body`` is the caller's own, just parsed, and has neither: ``_MISPLACED``).
    body["id"], body["priority"] = request_id, priority
    try:
        request: Request = _REQUEST_VALIDATOR.validate_python(body)
        return request
    except ValidationError as err:
        return UndecodableEntry(
            request_id, MalformedEntry(f"invalid request body: {describe_validation_error(err)}")
        )


def _decode_slowly(
    priority: Priority, fields: dict[bytes, bytes] | dict[str, str]
) -> Request | UndecodableEntry:
    try:
        text = {as_text(k): as_text(v) for k, v in fields.items()}
    except UnicodeDecodeError:
        raw_id = fields.get(ID_FIELD.encode(), fields.get(ID_FIELD))  # type: ignore[call-overload]
        return UndecodableEntry(
            _usable_id(raw_id), MalformedEntry("entry fields must be UTF-8 text")
        )
    request_id = _usable_id(text.get(ID_FIELD))
    if request_id is None:
        if ID_FIELD in text:  # there is one, refused for its characters or length: say why
            why = (
                f"entry's {ID_FIELD!r} field {text[ID_FIELD][:80]!r} is not a valid request id: "
                "use 1-128 characters of A-Z, a-z, 0-9, '_', '.', ':' and '-'"
            )
        else:
            why = (
                f"entry has no valid {ID_FIELD!r} field (it has none; fields: "
                f"{sorted(text)[:10]}); expected fields 'id' and 'body'"
            )
        return UndecodableEntry(None, MalformedEntry(why))
    extra = sorted(set(text) - {ID_FIELD, BODY_FIELD})
    if extra:
        return UndecodableEntry(
            request_id,
            MalformedEntry(f"unexpected entry fields {extra}; expected only 'id' and 'body'"),
        )
    if BODY_FIELD not in text:
        return UndecodableEntry(request_id, MalformedEntry("entry has no 'body' field"))
    try:
        body = orjson.loads(text[BODY_FIELD])
    except orjson.JSONDecodeError as err:
        return UndecodableEntry(
            request_id, MalformedEntry(f"invalid request body: not valid JSON ({err})")
        )
    if not isinstance(body, dict):
        return UndecodableEntry(
            request_id,
            MalformedEntry(
                f"invalid request body: expected a JSON object, got {type(body).__name__}"
            ),
        )
    misplaced = sorted(_MISPLACED & set(body))
    if misplaced:  # they are the entry's and the stream's, not the body's
        return UndecodableEntry(
            request_id, MalformedEntry(f"invalid request body: unexpected fields {misplaced}")
        )
    return _validated(body, request_id, priority)


def _repeated_fields(fields: list[bytes]) -> UndecodableEntry:
    """An entry with a field name twice (``XADD ... id a body {...} id b``): which one was
    meant is anyone's guess, so it never runs. If every ``id`` it has is the same usable id,
    that request fails saying why; otherwise there is no one id to fail (dead-lettered)."""
    names = [k.decode("utf-8", "replace") if isinstance(k, bytes) else str(k) for k in fields[::2]]
    twice = sorted({n for n in names if names.count(n) > 1})
    ids = {_usable_id(v) for k, v in zip(fields[::2], fields[1::2], strict=False) if k == _ID_KEY}
    request_id = ids.pop() if len(ids) == 1 else None
    return UndecodableEntry(
        request_id,
        MalformedEntry(
            f"entry has the field(s) {twice} more than once; a work entry has exactly two "
            "fields, 'id' and 'body'"
        ),
    )


def _usable_id(value: object) -> str | None:
    if isinstance(value, bytes):
        try:
            value = value.decode("utf-8")
        except UnicodeDecodeError:
            return None
    if not isinstance(value, str) or _REQUEST_ID.fullmatch(value) is None:
        return None
    return value


def encode_delta_event(text: str) -> dict[str, str]:
    """An event with the next piece of generated text (``data`` is JSON: ``{"text": ...}``)."""
    return {EVENT_TYPE_FIELD: DELTA_EVENT, EVENT_DATA_FIELD: json.dumps({"text": text})}


def decode_result(data: bytes | str) -> Result:
    """Decode a Result stored as JSON (result key, or a final event's data)."""
    # The model's validator itself: model_validate_json's wrapper costs a fifth more, and a
    # client waiting for many results decodes each.
    result: Result = _RESULT_VALIDATOR.validate_json(data)
    return result
