"""``POST /v1/embeddings``: one genq embedding request (``genq.common.embeddings``) in
OpenAI's shape, answered when it is final. ``input``: a string, strings, token ids or lists of
them (at most 2,048); ``encoding_format``: ``float`` (the default) or ``base64``, the one the
official SDKs ask for, which is the result key's packed string handed on as it is (no float is
decoded). genq's own options ride as extra body fields: ``priority``, ``deadline_in_s``,
``truncate`` and ``normalize``."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from genq.common.embeddings import unpack
from genq.common.errors import InvalidRequest
from genq.producer.building import build_embedding
from genq.producer.gateway.completions import (
    json_object,
    result_error,
    served_model,
    wait_or_cancel,
)
from genq.producer.gateway.context import caller, gateway
from genq.producer.gateway.openai_errors import invalid

router = APIRouter()

ENCODINGS = ("float", "base64")
OPTIONS = ("priority", "deadline_in_s", "truncate", "normalize", "dimensions")
"""Body fields passed to ``build_embedding`` as they are; ``user`` (OpenAI's end-user id) is
accepted and not used."""


@router.post("/v1/embeddings")
async def embeddings(request: Request) -> Response:
    gw, who = gateway(request), caller(request)
    gw.enter(who)
    try:
        body = await json_object(request)
        encoding = body.pop("encoding_format", None) or "float"
        if encoding not in ENCODINGS:
            raise invalid(
                f"encoding_format must be 'float' or 'base64', not {encoding!r}",
                param="encoding_format",
            )
        unknown = sorted(set(body) - {"model", "input", "user", "metadata", *OPTIONS})
        if unknown:
            raise invalid(f"unknown field(s) for /v1/embeddings: {', '.join(unknown)}")
        model = await served_model(gw, body.get("model"))
        if gw.fleet.kind(model) != "embedding":
            raise invalid(
                f"model {model!r} generates text and makes no embeddings: name an embedding "
                "model (GET /v1/models: kind embedding)",
                param="model",
            )
        options = {k: body[k] for k in OPTIONS if body.get(k) is not None}
        req = build_embedding(
            inputs_of(body.get("input")),
            model=model,
            tenant=who.tenant,
            metadata=body.get("metadata"),
            **options,
        )
        request_id = await gw.submitter.submit(req)
        result = await wait_or_cancel(gw, request, request_id)
    finally:
        gw.leave(who)
    if result.status != "succeeded" or result.embeddings is None:
        raise result_error(result)
    packed = result.embeddings
    data = [
        {"object": "embedding", "index": i, "embedding": v if encoding == "base64" else unpack(v)}
        for i, v in enumerate(packed)
    ]
    tokens = result.usage.prompt_tokens
    return JSONResponse(
        {
            "object": "list",
            "data": data,
            "model": result.model or model,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }
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
