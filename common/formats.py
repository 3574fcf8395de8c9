"""Response formats: the shapes a request may constrain its output to (``response_format``).

OpenAI's three shapes, and genq's own two (after vLLM's ``structured_outputs`` names):

========================  ======================================================================
``type``                  the output is
========================  ======================================================================
``text``                  free text (the same as giving no format)
``json_object``           one JSON object (any keys)
``json_schema``           JSON valid under ``json_schema.schema`` (a JSON Schema)
``regex``                 a full match of ``regex`` (the grammar library's regex dialect)
``choice``                exactly one of the strings in ``choice``
========================  ======================================================================

The worker enforces a format by constrained decoding (each step may pick only tokens that keep
the output inside the format), never by retrying. Checked here, on both sides: the shape, the
sizes, and that a schema is valid JSON Schema (with the ``jsonschema`` library: no torch). What
only the grammar library can tell (a schema feature or a regex it cannot compile) fails that
request alone, ``invalid_request``, at the worker.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from typing import Annotated, Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

MAX_SCHEMA_CHARS = 100_000
"""Longest ``json_schema.schema``, as compact JSON."""
MAX_REGEX_CHARS = 4_096
MAX_CHOICES = 1_024
MAX_CHOICE_CHARS = 1_024

FormatType = Literal["text", "json_object", "json_schema", "regex", "choice"]
FORMAT_TYPES: tuple[str, ...] = ("text", "json_object", "json_schema", "regex", "choice")


class _Frozen(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False, frozen=True)


class JsonSchemaFormat(_Frozen):
    """OpenAI's ``json_schema`` object: a named JSON Schema."""

    model_config = ConfigDict(
        strict=True,
        extra="forbid",
        frozen=True,
        validate_by_alias=True,
        validate_by_name=True,
        serialize_by_alias=True,
    )

    name: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_\-]{1,64}$")] = "response"
    """What the schema describes (OpenAI requires one; genq only echoes it)."""
    description: Annotated[str, StringConstraints(max_length=4_096)] | None = None
    schema_: dict[str, Any] = Field(alias="schema")
    """The JSON Schema the output must be valid under."""
    strict: bool | None = None
    """Accepted for OpenAI's clients; genq always decodes strictly (properties the schema does
    not name are never generated)."""

    @model_validator(mode="after")
    def _valid_schema(self) -> JsonSchemaFormat:
        problem = schema_problem(self.schema_)
        if problem is not None:
            raise ValueError(problem)
        return self


class ResponseFormat(_Frozen):
    """What a request's output must be (the table above)."""

    type: FormatType
    json_schema: JsonSchemaFormat | None = None
    """With ``type: json_schema``."""
    regex: Annotated[str, StringConstraints(min_length=1, max_length=MAX_REGEX_CHARS)] | None = None
    """With ``type: regex``."""
    choice: (
        Annotated[
            list[Annotated[str, StringConstraints(min_length=1, max_length=MAX_CHOICE_CHARS)]],
            Field(min_length=1, max_length=MAX_CHOICES),
        ]
        | None
    ) = None
    """With ``type: choice``."""

    @model_validator(mode="after")
    def _fields_of_type(self) -> ResponseFormat:
        wanted = {"json_schema": "json_schema", "regex": "regex", "choice": "choice"}
        for field, kind in wanted.items():
            given = getattr(self, field) is not None
            if kind == self.type and not given:
                raise ValueError(f"response_format of type {kind!r} needs {field!r}")
            if kind != self.type and given:
                raise ValueError(f"{field!r} belongs to response_format type {kind!r} only")
        return self

    @property
    def constrains(self) -> bool:
        """Whether it limits the output at all (``text`` does not)."""
        return self.type != "text"

    def cache_key(self) -> str:
        """The same for two formats that constrain alike (a schema's key order does not
        matter): what a worker caches compiled grammars under."""
        if self.type == "json_schema" and self.json_schema is not None:
            spec: Any = self.json_schema.schema_
        elif self.type == "regex":
            spec = self.regex
        elif self.type == "choice":
            spec = self.choice
        else:
            spec = None
        return self.type + ":" + orjson.dumps(spec, option=orjson.OPT_SORT_KEYS).decode()


_CHECKED: OrderedDict[bytes, str | None] = OrderedDict()
"""``schema_problem``'s answers by the schema's hash (most recent last), so a schema sent again
(an agent's tools, resent with every turn) is checked once per process."""
CHECKED_SCHEMAS_KEPT = 1_024
_CHECKED_LOCK = threading.Lock()


def schema_problem(schema: Any) -> str | None:
    """What keeps ``schema`` from being a usable JSON Schema, or None. Answers are cached by
    the schema's hash (``CHECKED_SCHEMAS_KEPT`` of them)."""
    if not isinstance(schema, dict):
        return "json_schema.schema must be a JSON object"
    try:
        text = orjson.dumps(schema, option=orjson.OPT_SORT_KEYS)
    except orjson.JSONEncodeError as err:
        return f"json_schema.schema is not JSON: {err}"
    if len(text) > MAX_SCHEMA_CHARS:
        return f"json_schema.schema is {len(text)} characters as JSON; at most {MAX_SCHEMA_CHARS}"
    digest = hashlib.sha256(text).digest()
    with _CHECKED_LOCK:  # the gateway checks in threads
        if digest in _CHECKED:
            _CHECKED.move_to_end(digest)
            return _CHECKED[digest]
    problem = _check_schema(schema)
    with _CHECKED_LOCK:
        _CHECKED[digest] = problem
        if len(_CHECKED) > CHECKED_SCHEMAS_KEPT:
            _CHECKED.popitem(last=False)
    return problem


def _check_schema(schema: dict[str, Any]) -> str | None:
    from jsonschema import exceptions, validators

    try:
        validators.validator_for(schema).check_schema(schema)
    except exceptions.SchemaError as err:
        where = "/".join(str(p) for p in err.absolute_path) or "(top)"
        return f"json_schema.schema is not valid JSON Schema: {err.message} (at {where})"
    return None


def response_format_from(value: Any) -> Any:
    """What a client passed as ``response_format``, in the wire's shape: a dict or a
    ResponseFormat as it is; a pydantic model class as OpenAI's SDK sends it (``json_schema``
    of ``model_json_schema()``, named after the class). Anything else is left for validation
    to name."""
    if isinstance(value, type) and issubclass(value, BaseModel):
        return {
            "type": "json_schema",
            "json_schema": {
                "name": value.__name__[:64],
                "schema": value.model_json_schema(),
                "strict": True,
            },
        }
    if isinstance(value, ResponseFormat):
        return value.model_dump(exclude_none=True)
    return value
