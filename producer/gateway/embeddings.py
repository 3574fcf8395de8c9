"""``POST /v1/embeddings``: one genq embedding request (``genq.common.embeddings``) in
OpenAI's shape (``embedding_bodies.py`` reads the body and writes the answer), answered when it
is final. ``encoding_format`` is ``float`` by default; ``base64``, the one the official SDKs ask
for, hands on the result key's packed string as it is (no float is decoded). ``embedded`` is the
one way the gateway embeds: rerank and score (``scores.py``) use it too."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from genq.common.models import Result
from genq.producer.building import build_embedding
from genq.producer.gateway.completions import (
    json_object,
    result_error,
    served_model,
    wait_or_cancel,
)
from genq.producer.gateway.context import caller, gateway
from genq.producer.gateway.embedding_bodies import read_body, response_body
from genq.producer.gateway.openai_errors import invalid

router = APIRouter()


@router.post("/v1/embeddings")
async def embeddings(request: Request) -> Response:
    body = read_body(await json_object(request))
    result, model = await embedded(
        request, body.model, body.inputs, body.options, metadata=body.metadata
    )
    return JSONResponse(response_body(result, body.encoding, model))


async def embedded(
    request: Request,
    model: Any,
    inputs: Sequence[Any],
    options: Mapping[str, Any],
    *,
    metadata: Any = None,
    query: str | None = None,
) -> tuple[Result, str]:
    """The succeeded result of one embedding request of ``inputs`` for the caller's tenant to
    ``model`` (or the default one: it must embed, else 400), and the model's name; an error
    response for any other end. With ``query``, a score request: the model must be a
    cross-encoder (kind ``score``)."""
    gw, who = gateway(request), caller(request)
    gw.enter(who)
    try:
        name = await served_model(gw, model)
        kind, wanted = gw.fleet.kind(name), "embedding" if query is None else "score"
        if kind != wanted:
            raise invalid(wrong_kind(name, kind, wanted), param="model")
        req = build_embedding(
            inputs, model=name, tenant=who.tenant, metadata=metadata, query=query, **options
        )
        request_id = await gw.submitter.submit(req)
        result = await wait_or_cancel(gw, request, request_id)
    finally:
        gw.leave(who)
    if result.status != "succeeded" or result.embeddings is None:
        raise result_error(result)
    return result, name


def wrong_kind(model: str, kind: str, wanted: str) -> str:
    """Why ``model`` (of ``kind``) cannot answer a request for a ``wanted`` model."""
    if kind == "generation":
        return (
            f"model {model!r} generates text and makes no embeddings: name an embedding model "
            "(GET /v1/models: kind embedding)"
        )
    if kind == "score":
        return (
            f"model {model!r} is a cross-encoder: it scores texts against a query "
            "(POST /v1/rerank or /v1/score) and makes no embeddings"
        )
    return f"model {model!r} makes embeddings and scores no query (wanted: kind {wanted})"
