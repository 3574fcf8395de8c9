"""Tool calls on chats (OpenAI's ``tools`` and ``tool_choice``): the wire shapes, the response
format that forces a call, and reading calls out of generated text. Pure (no torch).

================================  ===========================================================
``tool_choice``                   what the model does
================================  ===========================================================
``"none"``                        answers in text; the tools are not shown to it
``"auto"`` (the default)          answers in text or calls tools, as its chat template teaches
                                  it; calls are read from ``<tool_call>{"name": ...,
                                  "arguments": {...}}</tool_call>`` blocks, the format of the
                                  templates of Hermes, Qwen 2.5 / Qwen 3 and SmolLM3 (a worker
                                  whose template has no such format reads none: use
                                  ``required`` or a named function there)
``"required"``                    calls one of the tools: constrained decoding of ``{"name":
                                  ..., "arguments": ...}`` with each tool's parameter schema,
                                  so it works on any model
``{"type": "function",``          calls that function: constrained decoding of its
``"function": {"name": ...}}``    parameter schema (any model)
================================  ===========================================================

A forced call's arguments are valid under the function's ``parameters`` schema by
construction. The result carries ``tool_calls`` in OpenAI's shape (``id``, ``type``,
``function.name``, ``function.arguments`` as a JSON string) and ``finish_reason:
"tool_calls"``; a call cut short by ``max_new_tokens`` is no call: the result keeps its text and
``finish_reason: "length"``.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Annotated, Any, Literal

from genq.common.formats import JsonSchemaFormat, ResponseFormat, schema_problem
from pydantic import BaseModel, ConfigDict, StringConstraints, model_validator

MAX_TOOLS = 128
MAX_TOOLS_CHARS = 65_536
"""Most characters a request's tools may take as JSON, all together: their schemas are checked
as they are validated (once per distinct schema in a process: ``formats.schema_problem``
caches), at ~0.8 s of CPU per 100 KB."""
FunctionName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_\-.]{1,64}$")]
CALL_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
"""A Hermes-format call (Hermes, Qwen 2.5 / 3, SmolLM3 templates)."""
CALL_FORMAT_MARK = "<tool_call>"
"""A chat template that contains this teaches the Hermes call format."""


class _Frozen(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False, frozen=True)


class FunctionSpec(_Frozen):
    """A function the model may call."""

    name: FunctionName
    description: Annotated[str, StringConstraints(max_length=4_096)] | None = None
    parameters: dict[str, Any] | None = None
    """The JSON Schema of its arguments (an object); none: it takes any object."""
    strict: bool | None = None
    """Accepted for OpenAI's clients; forced calls always follow the schema."""

    @model_validator(mode="after")
    def _valid_parameters(self) -> FunctionSpec:
        if self.parameters is not None:
            problem = schema_problem(self.parameters)
            if problem is not None:
                raise ValueError(problem.replace("json_schema.schema", "function.parameters"))
        return self


class Tool(_Frozen):
    """One entry of ``tools``."""

    type: Literal["function"] = "function"
    function: FunctionSpec


class FunctionRef(_Frozen):
    name: FunctionName


class NamedToolChoice(_Frozen):
    """``tool_choice`` naming the function to call."""

    type: Literal["function"] = "function"
    function: FunctionRef


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


class CalledFunction(_Frozen):
    name: Annotated[str, StringConstraints(max_length=64)]
    arguments: Annotated[str, StringConstraints(max_length=200_000)]
    """The arguments as a JSON string (OpenAI's shape)."""


class ToolCall(_Frozen):
    """A call the model made (OpenAI's ``tool_calls[]`` item)."""

    id: Annotated[str, StringConstraints(min_length=1, max_length=128)]
    type: Literal["function"] = "function"
    function: CalledFunction


def tools_size_problem(tools: list[Any]) -> str | None:
    """What is wrong with the size of ``tools`` as sent (over ``MAX_TOOLS_CHARS`` as JSON),
    or None; what is not JSON is left for validation to name."""
    try:
        size = len(json.dumps(tools, separators=(",", ":")))
    except (TypeError, ValueError):
        return None
    if size > MAX_TOOLS_CHARS:
        return f"tools take {size} characters as JSON; at most {MAX_TOOLS_CHARS} in all"
    return None


def check_tools(tools: list[Tool] | None, choice: ToolChoice | None) -> str | None:
    """What is wrong with a request's ``tools`` and ``tool_choice`` together, or None."""
    if tools is not None and len({t.function.name for t in tools}) != len(tools):
        return "tools: two tools have the same name"
    if choice is None or choice in ("none", "auto"):
        return None
    if not tools:
        return f"tool_choice {_label(choice)} needs tools"
    if isinstance(choice, NamedToolChoice) and choice.function.name not in {
        t.function.name for t in tools
    }:
        return f"tool_choice names {choice.function.name!r}, which is not in tools"
    return None


def _label(choice: ToolChoice) -> str:
    return repr(choice) if isinstance(choice, str) else f"function {choice.function.name!r}"


def _parameters(tool: Tool) -> dict[str, Any]:
    return tool.function.parameters or {"type": "object"}


def forced_format(tools: list[Tool] | None, choice: ToolChoice | None) -> ResponseFormat | None:
    """The response format that makes the model call a tool (``required`` or a named
    function), or None (no call is forced)."""
    if not tools or choice is None or choice in ("none", "auto"):
        return None
    if isinstance(choice, NamedToolChoice):
        tool = next(t for t in tools if t.function.name == choice.function.name)
        schema = _parameters(tool)
    else:
        schema = {
            "anyOf": [
                {
                    "type": "object",
                    "properties": {
                        "name": {"const": t.function.name},
                        "arguments": _parameters(t),
                    },
                    "required": ["name", "arguments"],
                }
                for t in tools
            ]
        }
    # Built without validating again (it runs for each such request a worker admits, and a
    # JSON Schema check costs ~3 ms): every parameter schema was checked with the request.
    return ResponseFormat.model_construct(
        type="json_schema",
        json_schema=JsonSchemaFormat.model_construct(name="tool_call", schema_=schema),
    )


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


def _call(name: str, arguments: Any) -> dict[str, Any]:
    return {
        "id": new_call_id(),
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)},
    }


def forced_calls(text: str, choice: ToolChoice) -> list[dict[str, Any]] | None:
    """The call in the text a forced choice generated (None: it is not one, e.g. cut short)."""
    try:
        value = json.loads(text)
    except ValueError:
        return None
    if isinstance(choice, NamedToolChoice):
        return [_call(choice.function.name, value)]
    if isinstance(value, dict) and isinstance(value.get("name"), str) and "arguments" in value:
        return [_call(value["name"], value["arguments"])]
    return None


def calls_in_text(text: str, names: set[str]) -> tuple[str, list[dict[str, Any]]]:
    """The Hermes-format calls in ``text`` to functions in ``names``, and the text without
    them (stripped). Blocks that are not a call (bad JSON, another name) stay in the text."""
    calls: list[dict[str, Any]] = []

    def take(match: re.Match[str]) -> str:
        try:
            value = json.loads(match.group(1))
        except ValueError:
            return match.group(0)
        if not isinstance(value, dict) or value.get("name") not in names:
            return match.group(0)
        calls.append(_call(value["name"], value.get("arguments", value.get("parameters", {}))))
        return ""

    rest = CALL_BLOCK.sub(take, text)
    return rest.strip(), calls
