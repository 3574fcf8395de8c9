"""The body fields OpenAI's and vLLM's clients use to constrain output, as genq's
``response_format`` (``genq.common.formats``). Pure: shared by the gateway and Batch lines.

=============================================  ===============================================
the client sends                               genq's ``response_format``
=============================================  ===============================================
``response_format: {"type": "text"}``          none (free text)
``response_format: {"type": "json_object"}``   ``{"type": "json_object"}``
``response_format: {"type": "json_schema",``   the same (what ``chat.completions.parse``
``"json_schema": {"name", "schema", ...}}``    sends for a pydantic model)
``response_format: {"type": "regex",``         genq's own (also ``"choice": [...]``)
``"regex": ...}``
``structured_outputs: {"json": SCHEMA}``       ``json_schema`` (vLLM's field; ``regex``,
                                               ``choice`` and ``json_object`` likewise)
``guided_json``, ``guided_regex``,             the same (vLLM's older names)
``guided_choice``
=============================================  ===============================================

Only one of them per request. vLLM's ``grammar`` and ``structural_tag`` are refused (400,
naming them): genq has no EBNF grammar option.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from genq.common.errors import InvalidRequest
from genq.common.formats import FORMAT_TYPES

FIELDS = ("response_format", "structured_outputs", "guided_json", "guided_regex", "guided_choice")
"""The body fields this module reads."""
_VLLM_KEYS = {"json": "json_schema", "regex": "regex", "choice": "choice", "json_object": None}
_VLLM_NEUTRAL = {"disable_any_whitespace", "disable_additional_properties", "whitespace_pattern"}
"""vLLM options about whitespace and extra properties: genq's JSON is compact and strict."""


def response_format_arg(body: Mapping[str, Any]) -> dict[str, Any] | None:
    """The ``response_format`` that ``body``'s fields ask for (None: free text); raise
    InvalidRequest saying what is wrong."""
    given = {k: body[k] for k in FIELDS if body.get(k) is not None}
    if len(given) > 1:
        raise InvalidRequest(f"give at most one of {sorted(given)}")
    if not given:
        return None
    (field, value), *_ = given.items()
    if field == "response_format":
        return _openai(value)
    if field == "structured_outputs":
        return _vllm(value)
    kind = field.removeprefix("guided_")
    return _vllm({kind: value})


def _openai(value: Any) -> dict[str, Any] | None:
    if not isinstance(value, dict) or not isinstance(value.get("type"), str):
        raise InvalidRequest("response_format must be an object with a 'type'")
    if value["type"] not in FORMAT_TYPES:
        raise InvalidRequest(
            f"response_format type {value['type']!r} is not supported: use one of "
            f"{', '.join(FORMAT_TYPES)}"
        )
    if value["type"] == "text" and len(value) == 1:
        return None
    return dict(value)


def _vllm(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise InvalidRequest("structured_outputs must be an object")
    value = {
        k: v
        for k, v in value.items()
        if v is not None and v is not False and k not in _VLLM_NEUTRAL
    }
    unknown = sorted(set(value) - set(_VLLM_KEYS))
    if unknown:
        raise InvalidRequest(
            f"structured_outputs {unknown} not supported: use one of json, regex, choice, "
            "json_object"
        )
    if len(value) != 1:
        raise InvalidRequest("structured_outputs needs exactly one of json, regex, choice")
    (key, spec), *_ = value.items()
    if key == "json_object":
        return {"type": "json_object"}
    if key == "json":
        if isinstance(spec, str):
            try:
                spec = json.loads(spec)
            except ValueError as err:
                raise InvalidRequest(f"structured_outputs.json is not JSON: {err}") from None
        return {"type": "json_schema", "json_schema": {"name": "response", "schema": spec}}
    return {"type": key, key: spec}
