"""``POST /v1/rerank`` (also ``/rerank``, ``/v2/rerank``) and ``POST /v1/score`` (also
``/score``) in the shapes vLLM serves, on an embedding model: a text's score against another is
the cosine of their two vectors. The texts go to the queue as one embedding request (each
distinct text once: ``embedded``), so a rerank has the queue's priorities, tenants and limits.

Rerank (the Jina / Cohere shape): ``query``, ``documents`` (strings, or objects with ``text``),
``top_n`` (0 or absent: all), ``return_documents`` (true by default); the results sorted by
``relevance_score``, highest first, each with the document's ``index``. Score: ``text_1`` and
``text_2``, each a string or strings: one to one, one to many (``text_1`` one string) or pairwise
(two lists of one length); ``data`` in the pairs' order.

On a cross-encoder (a ``*ForSequenceClassification`` model, ``kind: score``: it reads the two
texts together) a pair's score is the model's: the pairs go to the queue as one score request
per distinct first text (``query``: the rerank's query, one request), each of its second texts
once.
"""

from __future__ import annotations

import asyncio
import math
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from genq.common.embeddings import MAX_EMBED_INPUTS, unpack
from genq.common.errors import InvalidRequest
from genq.producer.gateway.completions import json_object, served_model
from genq.producer.gateway.context import gateway
from genq.producer.gateway.embeddings import embedded

router = APIRouter()

OPTIONS = ("priority", "deadline_in_s", "truncate")
"""genq's own fields a rerank or score body may carry (passed to the embedding request)."""


@dataclass(frozen=True, kw_only=True)
class Pairs:
    """What to score: the distinct texts and each pair's two indexes into them."""

    texts: list[str]
    pairs: list[tuple[int, int]]


def _distinct(texts: Sequence[str]) -> tuple[list[str], list[int]]:
    index: dict[str, int] = {}
    at = [index.setdefault(t, len(index)) for t in texts]
    return list(index), at


def _texts(value: Any, name: str) -> list[str]:
    """A string or a non-empty list of strings as a list; InvalidRequest naming ``name``."""
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not items or not all(isinstance(t, str) for t in items):
        raise InvalidRequest(f"'{name}' must be a string or a non-empty list of strings")
    return items


def _check_fields(body: Mapping[str, Any], known: Sequence[str], endpoint: str) -> None:
    unknown = sorted(set(body) - {"model", "user", *known, *OPTIONS})
    if unknown:
        raise InvalidRequest(f"unknown field(s) for {endpoint}: {', '.join(unknown)}")


def rerank_pairs(body: Mapping[str, Any]) -> Pairs:
    """A rerank body's query against each document; InvalidRequest naming what is wrong."""
    _check_fields(body, ("query", "documents", "top_n", "return_documents"), "rerank")
    query = body.get("query")
    if not isinstance(query, str) or not query:
        raise InvalidRequest("'query' must be a non-empty string")
    documents = documents_of(body.get("documents"))
    texts, at = _distinct([query, *documents])
    return Pairs(texts=texts, pairs=[(at[0], i) for i in at[1:]])


def documents_of(value: Any) -> list[str]:
    """Rerank's ``documents``: strings, or objects with a ``text`` string."""
    if not isinstance(value, list) or not value:
        raise InvalidRequest("'documents' must be a non-empty list")
    out = [d.get("text") if isinstance(d, dict) else d for d in value]
    texts = [d for d in out if isinstance(d, str) and d]
    if len(texts) != len(out):
        raise InvalidRequest("each document must be a text or an object with a 'text' string")
    return texts


def score_pairs(body: Mapping[str, Any]) -> Pairs:
    """A score body's pairs: one to one, one to many, or pairwise."""
    _check_fields(body, ("text_1", "text_2"), "score")
    first, second = _texts(body.get("text_1"), "text_1"), _texts(body.get("text_2"), "text_2")
    if len(first) == 1:
        first = first * len(second)
    if len(first) != len(second):
        raise InvalidRequest(
            f"'text_1' has {len(first)} texts and 'text_2' {len(second)}: give one text_1, or "
            "as many as text_2 (pairwise)"
        )
    texts, at = _distinct([*first, *second])
    n = len(first)
    return Pairs(texts=texts, pairs=[(at[i], at[n + i]) for i in range(n)])


def cosines(vectors: Sequence[Sequence[float]], pairs: Sequence[tuple[int, int]]) -> list[float]:
    """Each pair's cosine similarity."""
    norms = [math.sqrt(sum(x * x for x in v)) or 1.0 for v in vectors]
    return [
        sum(x * y for x, y in zip(vectors[a], vectors[b], strict=True)) / (norms[a] * norms[b])
        for a, b in pairs
    ]


def top_n(body: Mapping[str, Any], count: int) -> int:
    """How many rerank results to give: ``top_n`` (0 or absent: all of ``count``)."""
    n = body.get("top_n") or 0
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise InvalidRequest("'top_n' must be a whole number >= 0")
    return min(n, count) if n else count


async def _scored(request: Request, body: Mapping[str, Any], pairs: Pairs) -> tuple[Any, ...]:
    """Each pair's score, the model's name and the input tokens it took."""
    if len(pairs.texts) > MAX_EMBED_INPUTS:
        raise InvalidRequest(f"at most {MAX_EMBED_INPUTS} distinct texts in one request")
    options = {k: body[k] for k in OPTIONS if body.get(k) is not None}
    gw = gateway(request)
    model = await served_model(gw, body.get("model"))
    if gw.fleet.kind(model) == "score":
        return await _cross_encoded(request, model, pairs, options)
    result, model = await embedded(request, model, pairs.texts, options)
    vectors = [unpack(v) for v in result.embeddings or ()]
    return cosines(vectors, pairs.pairs), model, result.usage.prompt_tokens


async def _cross_encoded(
    request: Request, model: str, pairs: Pairs, options: Mapping[str, Any]
) -> tuple[Any, ...]:
    """The pairs scored by a cross-encoder: a score request per distinct first text (its
    second texts once each), sent together."""
    seconds: dict[int, list[int]] = {}
    for a, b in pairs.pairs:
        if b not in seconds.setdefault(a, []):
            seconds[a].append(b)
    answers = await asyncio.gather(
        *(
            embedded(request, model, [pairs.texts[b] for b in bs], options, query=pairs.texts[a])
            for a, bs in seconds.items()
        )
    )
    score: dict[tuple[int, int], float] = {}
    for (a, bs), (result, _) in zip(seconds.items(), answers, strict=True):
        for b, packed in zip(bs, result.embeddings or (), strict=True):
            score[(a, b)] = unpack(packed)[0]
    tokens = sum(result.usage.prompt_tokens for result, _ in answers)
    return [score[p] for p in pairs.pairs], model, tokens


@router.post("/v1/rerank")
@router.post("/v2/rerank")
@router.post("/rerank")
async def rerank(request: Request) -> Response:
    body = await json_object(request)
    pairs = rerank_pairs(body)
    keep = top_n(body, len(pairs.pairs))
    documents = body.get("documents") or []
    return_documents = body.get("return_documents", True) is not False
    scores, model, tokens = await _scored(request, body, pairs)
    order = sorted(range(len(scores)), key=lambda i: -scores[i])[:keep]
    results = []
    for i in order:
        item: dict[str, Any] = {"index": i, "relevance_score": scores[i]}
        if return_documents:
            doc = documents[i]
            item["document"] = doc if isinstance(doc, dict) else {"text": doc}
        results.append(item)
    return JSONResponse(
        {
            "id": f"rerank-{uuid.uuid4().hex}",
            "model": model,
            "usage": {"total_tokens": tokens},
            "results": results,
        }
    )


@router.post("/v1/score")
@router.post("/score")
async def score(request: Request) -> Response:
    body = await json_object(request)
    scores, model, tokens = await _scored(request, body, score_pairs(body))
    return JSONResponse(
        {
            "id": f"score-{uuid.uuid4().hex}",
            "object": "list",
            "created": int(time.time()),
            "model": model,
            "data": [{"index": i, "object": "score", "score": s} for i, s in enumerate(scores)],
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }
    )
