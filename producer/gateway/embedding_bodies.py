"""OpenAI's embeddings body into a genq embedding request, and a result back into OpenAI's
response body. Pure (no Redis, no HTTP): ``POST /v1/embeddings`` and batch lines with ``url:
/v1/embeddings`` share it.

A body: ``input`` (a string, strings, token ids or lists of them; at most 2,048), ``model``,
``encoding_format`` (``float`` or ``base64``: the result key's packed string handed on as it
is), ``user`` (accepted, not used), ``metadata``, and genq's own ``priority``,
``deadline_in_s``, ``truncate``, ``normalize`` and ``dimensions``. Anything else is refused,
naming the field.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from genq.common.embeddings import unpack
from genq.common.errors import InvalidRequest
from genq.common.models import Result

EMBEDDINGS = "/v1/embeddings"
ENCODINGS = ("float", "base64")
OPTIONS = ("priority", "deadline_in_s", "truncate", "normalize", "dimensions")
"""Body fields passed to ``build_embedding`` as they are."""
ENCODING_KEY = "encoding_format"
"""The metadata key a batch line's asked encoding rides in to its output line (only where it
is not the batch's default, ``base64``)."""


@dataclass(frozen=True, kw_only=True)
class EmbeddingBody:
    """A checked body: ``build_embedding``'s arguments and the vectors' encoding."""

    inputs: Any
    model: str | None
    encoding: str
    options: dict[str, Any]
    metadata: Any = None


def read_body(body: Mapping[str, Any], *, default_encoding: str = "float") -> EmbeddingBody:
    """The parts of an OpenAI embeddings ``body``; InvalidRequest naming what is wrong."""
    encoding = body.get("encoding_format") or default_encoding
    if encoding not in ENCODINGS:
        raise InvalidRequest(f"encoding_format must be 'float' or 'base64', not {encoding!r}")
    known = {"model", "input", "user", "metadata", "encoding_format", *OPTIONS}
    unknown = sorted(set(body) - known)
    if unknown:
        raise InvalidRequest(f"unknown field(s) for /v1/embeddings: {', '.join(unknown)}")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise InvalidRequest("'model' must be a string")
    return EmbeddingBody(
        inputs=inputs_of(body.get("input")),
        model=model,
        encoding=encoding,
        options={k: body[k] for k in OPTIONS if body.get(k) is not None},
        metadata=body.get("metadata"),
    )


def inputs_of(value: Any) -> Any:
    """OpenAI's ``input`` as genq's list of inputs: a string or one list of token ids is one
    input; a list of strings or of token id lists is many. Anything else is passed on for the
    request's validation to name."""
    if value is None:
        raise InvalidRequest("input is required: a string, strings or token ids")
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and value and all(isinstance(t, int) for t in value):
        return [value]
    return value


def response_body(res: Result, encoding: str, model: str | None = None) -> dict[str, Any]:
    """OpenAI's embeddings response of a succeeded result: one vector per input, in order,
    as floats or as the stored base64 string."""
    data = [
        {"object": "embedding", "index": i, "embedding": v if encoding == "base64" else unpack(v)}
        for i, v in enumerate(res.embeddings or ())
    ]
    tokens = res.usage.prompt_tokens
    usage = {
        "prompt_tokens": tokens,
        "total_tokens": tokens,
        "prompt_tokens_details": {"cached_tokens": res.usage.cached_tokens},
    }
    return {
        "object": "list",
        "data": data,
        "model": res.model or model or "unknown",
        "usage": usage,
    }
