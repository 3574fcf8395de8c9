"""Chat requests: ``messages`` become the model's prompt through its chat template.

A chat with ``tools`` (and ``tool_choice`` other than ``none``) passes them to the template,
which shows them to the model where it takes them (``tools`` in the template); a template that
does not, and a model without a template, get them as a system message listing each function's
name, description and parameter schema instead (a forced call works either way: its output is
constrained). Earlier assistant ``tool_calls`` and ``tool`` messages go to the template as
OpenAI's shapes, arguments parsed to objects (what templates expect).
"""

from __future__ import annotations

import json
from typing import Any

from genq.common.models import ChatMessage, Request

TOOLS_NOTE = (
    "You can call these functions. To call one, answer with a JSON object "
    '{"name": FUNCTION NAME, "arguments": ARGUMENTS OBJECT}.\nFunctions: '
)
"""The system message that shows tools to a model whose template does not take them."""


def prompt_text(request: Request, tokenizer: Any = None) -> str:
    """The text the engine tokenizes for ``request``: its prompt, or its messages rendered
    with the tokenizer's chat template (generation prompt added). Without a template (the tiny
    model, the echo engine) the messages become ``role: content`` lines and ``assistant:``."""
    if request.messages is None:
        return request.prompt or ""
    messages = [_message(m) for m in request.messages]
    tools = None
    if request.tools and request.tool_choice != "none":
        tools = [t.model_dump(exclude_none=True) for t in request.tools]
    template = getattr(tokenizer, "chat_template", None) if tokenizer is not None else None
    if tools is not None and not (isinstance(template, str) and "tools" in template):
        note = TOOLS_NOTE + json.dumps([t["function"] for t in tools], ensure_ascii=False)
        messages.insert(0, {"role": "system", "content": note})
        tools = None
    if template:
        extra = {} if tools is None else {"tools": tools}
        text: str = tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True, **extra
        )
        bos = getattr(tokenizer, "bos_token", None)
        if bos and text.startswith(bos) and _adds_bos(tokenizer):
            text = text[len(bos) :]  # the engine's tokenizer adds it again
        return text
    return "".join(f"{m['role']}: {_plain(m)}\n" for m in messages) + "assistant:"


def _message(m: ChatMessage) -> dict[str, Any]:
    # "" for no content: templates that concatenate content (SmolLM2's) fail on None.
    out: dict[str, Any] = {"role": m.role, "content": m.content or ""}
    if m.tool_calls:
        out["tool_calls"] = [
            {
                "id": c.id,
                "type": "function",
                "function": {
                    "name": c.function.name,
                    "arguments": _arguments(c.function.arguments),
                },
            }
            for c in m.tool_calls
        ]
    if m.tool_call_id is not None:
        out["tool_call_id"] = m.tool_call_id
    if m.name is not None:
        out["name"] = m.name
    return out


def _arguments(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def _plain(m: dict[str, Any]) -> str:
    """A message as one transcript line's text (calls as their JSON)."""
    if m.get("tool_calls"):
        calls = [c["function"] for c in m["tool_calls"]]
        return (m.get("content") or "") + json.dumps(calls, ensure_ascii=False)
    return str(m.get("content") or "")


def _adds_bos(tokenizer: Any) -> bool:
    """Whether tokenizing adds the bos token itself. (SmolLM2's tokenizer names
    ``<|im_start|>`` its bos but never adds it; its template starts with that token, which must
    then stay.)"""
    known = getattr(tokenizer, "_genq_adds_bos", None)
    if known is None:
        with_special = tokenizer("a", add_special_tokens=True)["input_ids"]
        plain = tokenizer("a", add_special_tokens=False)["input_ids"]
        known = len(with_special) > len(plain) and with_special[0] == tokenizer.bos_token_id
        tokenizer._genq_adds_bos = known
    return bool(known)
