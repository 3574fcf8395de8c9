"""Prefix keys: which requests share the context an engine caches, known without a tokenizer.

A request's **prefix key** names the part of its prompt that other requests are likely to send
again, so that the read can place it on a worker whose engine still holds that part (issue: a
pull queue's cache-aware placement). It is computed where a request is built (the client, the
gateway), carried in the body as ``prefix_key`` (its first field, so scripts find it without
decoding the body) and never trusted as more than a hint: a wrong key costs a cache miss, not a
wrong answer.

- ``prompt_cache_key`` (OpenAI's name; a client option and a body field) wins: requests that
  give the same one share a key.
- A chat: a hash chained over its messages, all but the last (the newest turn): a chat resent
  with one more turn has the key of the conversation it continues, and requests with one
  system prompt (and few-shot messages) share one. A chat of one message is a prompt.
- A plain prompt: a hash of its first ``PREFIX_BYTES`` bytes, if it is longer than that (a
  shorter one has no key: there is little to gain).

Keys are **per tenant** where they are used: the scripts and the worker scope a key by its
tenant (``scoped``), so a cache hit never tells one tenant what another sent, unless the
tenant's setting ``share_prefixes`` says its prompts may share cache with other sharing tenants.
The scripts' twins are in ``genq.common.lua.prefix_keys`` (a test compares them).

A LoRA adapter's requests without a prefix key carry the adapter's key (``adapter_key``): the
workers that have the adapter loaded hold it, so the read places them as it places prefixes.

The worker also holds the key of what comes next: a chat's conversation with the reply it just
generated appended (``continuation_key``) is the key of the next turn's request.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

PREFIX_BYTES = 1024
"""A plain prompt longer than this is keyed by its first so many bytes (UTF-8)."""
KEY_CHARS = 16
"""A key is this many hex characters of a SHA-1 (64 bits: collisions cost a cache miss)."""
MAX_PROMPT_CACHE_KEY_CHARS = 256
"""The longest ``prompt_cache_key`` accepted."""


def _sha(text: bytes) -> str:
    return hashlib.sha1(text, usedforsecurity=False).hexdigest()[:KEY_CHARS]


def _message_text(message: Any) -> bytes:
    """One message in canonical form: role, content, tool calls, tool call id, name."""

    def get(name: str) -> Any:
        return message.get(name) if isinstance(message, dict) else getattr(message, name, None)

    calls = get("tool_calls")
    if calls:
        calls = [c if isinstance(c, dict) else c.model_dump(mode="json") for c in calls]
    parts = [
        get("role") or "",
        get("content") or "",
        json.dumps(calls, sort_keys=True, separators=(",", ":")) if calls else "",
        get("tool_call_id") or "",
        get("name") or "",
    ]
    return "\x1f".join(parts).encode("utf-8", "surrogatepass")


def chat_chain(messages: Sequence[Any]) -> list[str]:
    """The chained key after each message: ``chain[i]`` names messages ``0..i``."""
    out: list[str] = []
    parent = "c"
    for m in messages:
        parent = _sha(parent.encode() + b"\x1e" + _message_text(m))
        out.append(parent)
    return out


def cache_key_of(prompt_cache_key: str) -> str:
    """The key of requests that give this ``prompt_cache_key``."""
    return _sha(b"k\x1e" + prompt_cache_key.encode("utf-8", "surrogatepass"))


def prompt_key(prompt: str) -> str | None:
    """A plain prompt's key: its first ``PREFIX_BYTES`` bytes, if it is longer than that."""
    data = prompt.encode("utf-8", "surrogatepass")
    if len(data) <= PREFIX_BYTES:
        return None
    return _sha(b"p\x1e" + data[:PREFIX_BYTES])


def prefix_key(
    *,
    prompt: str | None = None,
    messages: Sequence[Any] | None = None,
    prompt_cache_key: str | None = None,
) -> str | None:
    """A request's prefix key (see the module docstring), or None when it has none."""
    if prompt_cache_key:
        return cache_key_of(prompt_cache_key)
    if messages:
        if len(messages) > 1:
            return chat_chain(messages[:-1])[-1]
        only = messages[0]
        content = only.get("content") if isinstance(only, dict) else only.content
        return prompt_key(content) if content else None
    return prompt_key(prompt) if prompt else None


def continuation_key(messages: Sequence[Any], reply: str) -> str:
    """The key of the next turn of a chat: its messages and the assistant's ``reply``."""
    return chat_chain([*messages, {"role": "assistant", "content": reply}])[-1]


def scoped(tenant: str, key: str, shared: bool = False, model: str | None = None) -> str:
    """A key as the read and the fleet's holdings use it: per tenant, unless ``shared`` (the
    tenant's ``share_prefixes``: keys of all sharing tenants meet), and per model (its lane:
    another model's cache holds nothing of it)."""
    scope = "*" if shared else tenant
    if model:
        scope = f"{model}\x1f{scope}"
    return _sha(f"{scope}\x1e{key}".encode())


ADAPTER_RAW = "lora"
"""What an adapter's key is made of beside its name: not hex, so no prefix key meets it."""


def adapter_key(adapter: str) -> str:
    """The key an entry for the LoRA adapter ``adapter`` carries when it has no prefix key:
    the workers holding the adapter hold it, so the read places the entry where the adapter
    is loaded, by the prefixes' rule and bound. One per adapter, whoever sent the request (an
    adapter is a model every tenant may name: ``/v1/models`` lists it). ``adapter_key`` in
    """
    return scoped("", ADAPTER_RAW, True, adapter)


WINDOW = 32
"""How many of a tenant's waiting entries the read looks at for one whose prefix it holds."""
MAX_HOLDERS = 4
"""The most workers a prefix is known to be held by (the most recent first)."""
HOLDINGS_TTL_S = 86_400
"""The holders and load hashes expire a day after their last write (a queue nobody serves)."""
