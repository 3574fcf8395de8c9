"""Chat requests: ``messages`` become the model's prompt through its chat template."""

from __future__ import annotations

from typing import Any

from genq.common.models import Request


def prompt_text(request: Request, tokenizer: Any = None) -> str:
    """The text the engine tokenizes for ``request``: its prompt, or its messages rendered
    with the tokenizer's chat template (generation prompt added). Without a template (the tiny
    model, the echo engine) the messages become ``role: content`` lines and ``assistant:``."""
    if request.messages is None:
        return request.prompt or ""
    messages = [{"role": m.role, "content": m.content} for m in request.messages]
    if tokenizer is not None and getattr(tokenizer, "chat_template", None):
        text: str = tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True
        )
        bos = getattr(tokenizer, "bos_token", None)
        if bos and text.startswith(bos) and _adds_bos(tokenizer):
            text = text[len(bos) :]  # the engine's tokenizer adds it again
        return text
    return "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant:"


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
