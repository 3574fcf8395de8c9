"""``POST /v1/completions`` and ``POST /v1/chat/completions``: one genq request each, answered
when it is final, or streamed as server-sent events in OpenAI's chunk format from the request's
event stream (``stream: true``). A client that disconnects, or a result not final within
``request_timeout_s``, cancels the request. genq's own options ride as extra body fields:
``priority``, ``deadline_in_s``, ``top_k``."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import time
from collections.abc import AsyncIterator
from typing import Any, TypeVar

import anyio
import orjson
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from genq.common.errors import GenqError, InvalidRequest, ResultTimeout
from genq.common.models import Request as GenqRequest
from genq.common.models import Result
from genq.producer.building import build_request
from genq.producer.gateway.batch_lines import request_args
from genq.producer.gateway.completion_bodies import CHAT, COMPLETIONS, response_body, usage_of
from genq.producer.gateway.context import Caller, Gateway, caller, gateway
from genq.producer.gateway.openai_errors import (
    ApiError,
    error_for_result,
    invalid,
    not_found,
    unavailable,
)

router = APIRouter()
Chunk = TypeVar("Chunk", str, bytes)


@router.post("/v1/completions")
async def completions(request: Request) -> Response:
    return await _complete(request, COMPLETIONS)


@router.post("/v1/chat/completions")
async def chat_completions(request: Request) -> Response:
    return await _complete(request, CHAT)


async def json_object(request: Request) -> dict[str, Any]:
    """The request's body as a JSON object, or 400 saying why not."""
    try:
        body = json.loads(await request.body())
    except ValueError as err:
        raise invalid(f"the body is not valid JSON: {err}") from None
    except RecursionError:
        raise invalid("the body's JSON is nested too deeply") from None
    if not isinstance(body, dict):
        raise invalid("the body must be a JSON object")
    return body


async def _complete(request: Request, url: str) -> Response:
    gw, who = gateway(request), caller(request)
    gw.enter(who)
    response: Response | None = None
    try:
        response = await _answer(request, gw, who, url)
        return response
    finally:
        if not isinstance(response, StreamingResponse):  # a stream leaves when it ends
            gw.leave(who)


async def _answer(request: Request, gw: Gateway, who: Caller, url: str) -> Response:
    body = await json_object(request)
    stream = bool(body.pop("stream", False))
    options = body.pop("stream_options", None) or {}
    if not isinstance(options, dict):
        raise invalid("'stream_options' must be an object", param="stream_options")
    metadata = body.pop("metadata", None)
    model = await served_model(gw, body.get("model"))
    if gw.fleet.kind(model) in ("embedding", "score"):
        kind = gw.fleet.kind(model)
        does = "makes embeddings" if kind == "embedding" else "scores texts (a cross-encoder)"
        to = "/v1/embeddings" if kind == "embedding" else "/v1/rerank or /v1/score"
        raise invalid(f"model {model!r} {does} and generates no text: POST {to}", param="model")
    args = {**request_args(url, body), "model": model}
    if stream and args.get("logprobs"):
        raise InvalidRequest("logprobs are returned with the whole answer: ask without stream")
    req = await checked_request(args, stream=stream, metadata=metadata, tenant=who.tenant)
    request_id = await gw.submitter.submit(req)
    if stream:
        include_usage = bool(options.get("include_usage"))
        events = _events(gw, request_id, url, model, include_usage)
        return StreamingResponse(held(gw, who, events), media_type="text/event-stream")
    result = await wait_or_cancel(gw, request, request_id)
    if result.status != "succeeded":
        raise result_error(result)
    return JSONResponse(response_body(url, result))


def held(gw: Gateway, who: Caller, events: AsyncIterator[Chunk]) -> AsyncIterator[Chunk]:
    """``events``, counted in flight for ``who`` until the stream ends (``Gateway.enter``
    counted it in)."""

    async def stream() -> AsyncIterator[Chunk]:
        try:
            async for event in events:
                yield event
        finally:
            gw.leave(who)
            await events.aclose()  # type: ignore[attr-defined]

    return stream()


SCHEMA_CHECK_S = 5.0
"""Longest the gateway spends checking one request's tool and output schemas (in a thread, off
the event loop); past it the request is refused (400)."""


async def checked_request(args: dict[str, Any], **more: Any) -> GenqRequest:
    """``build_request(**args, **more)``, raising InvalidRequest for what is wrong. With tools
    or a response format it runs in a thread, so their schemas' check (~0.8 s of CPU per
    100 KB; cached by hash) leaves the event loop free, within ``SCHEMA_CHECK_S``."""
    build = functools.partial(_build, {**args, **more})
    if not (args.get("tools") or args.get("response_format")):
        return build()
    try:
        return await asyncio.wait_for(
            asyncio.get_running_loop().run_in_executor(None, build), SCHEMA_CHECK_S
        )
    except TimeoutError:
        raise invalid(
            f"the request's tool and output schemas took over {SCHEMA_CHECK_S} s to check: "
            "send fewer or simpler ones"
        ) from None


def _build(fields: dict[str, Any]) -> GenqRequest:
    try:
        return build_request(**fields)
    except TypeError as err:
        raise InvalidRequest(f"invalid request: {err}") from None


async def served_model(gw: Gateway, model: Any) -> str:
    """The model to answer with, whose lane the request goes to: the one asked for, if a live
    worker serves it (404 if none does), or without one the queue's default model if a live
    worker serves it, else the first served; 503 if no live worker serves the queue at all
    (the request would wait forever)."""
    if model is not None and not isinstance(model, str):
        raise invalid("'model' must be a string", param="model")
    models = await gw.fleet.models()
    queue = gw.settings.queue
    if not models:
        raise unavailable(
            f"no live worker serves queue {queue!r}: start one with genq worker --queue {queue}",
            "no_worker",
        )
    if model is None:
        default = gw.fleet.default_model
        return default if default in models else next(iter(sorted(models)))
    if model not in models:
        raise not_found(
            f"model {model!r} is not served on queue {queue!r}; live workers serve "
            f"{sorted(models)} (GET /v1/models)",
            "model_not_found",
        )
    return str(model)


def result_error(result: Result) -> ApiError:
    err = result.error
    code = err.code if err else result.status
    return error_for_result(result.status, code, err.message if err else result.status)


async def cancel_quietly(gw: Gateway, request_id: str) -> None:
    """Cancel a request nobody waits for any more (it may have ended meanwhile)."""
    with anyio.CancelScope(shield=True), contextlib.suppress(GenqError, OSError):
        await gw.client.cancel(request_id)


async def _disconnected(request: Request) -> None:
    """Return when the client goes away (the body has been read: only a disconnect is left)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def wait_or_cancel(gw: Gateway, request: Request, request_id: str) -> Result:
    """The request's final result; cancel it if the client disconnects (499) or it is not
    final within ``request_timeout_s`` (504)."""
    wait = asyncio.ensure_future(gw.result(request_id))
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({wait, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not wait.done():
            wait.cancel()
            await cancel_quietly(gw, request_id)
    if wait.cancelled():
        raise ApiError(499, "the client disconnected", type_="cancelled", code="client_closed")
    try:
        return wait.result()
    except ResultTimeout:
        await cancel_quietly(gw, request_id)
        raise ApiError(
            504,
            f"no result within {gw.settings.request_timeout_s} s (genq serve "
            "--request-timeout-s); the request was cancelled",
            type_="timeout",
            code="timeout",
        ) from None


def _sse(doc: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(doc) + b"\n\n"


def _chunk(url: str, request_id: str, model: str, created: int, **choice: Any) -> dict[str, Any]:
    """One streamed chunk in OpenAI's format (``choice``: text/delta and finish_reason)."""
    if url == CHAT:
        obj, fields = "chat.completion.chunk", {"delta": choice.get("delta", {})}
    else:
        obj, fields = "text_completion", {"text": choice.get("text", ""), "logprobs": None}
    one = {"index": 0, **fields, "finish_reason": choice.get("finish_reason")}
    return {"id": request_id, "object": obj, "created": created, "model": model, "choices": [one]}


async def _events(
    gw: Gateway, request_id: str, url: str, model: str, include_usage: bool
) -> AsyncIterator[bytes]:
    """The SSE stream of one request: chunks as text arrives (on chat the first carries the
    assistant role with the first text, as vLLM sends it, so a client timing the first chunk
    measures the first token), the final chunk, usage if asked, ``[DONE]``. An error after the
    stream began is sent as an ``error`` event. If the client goes away (Starlette cancels
    this generator), the request is cancelled."""
    created = int(time.time())
    finished = False
    role: dict[str, str] = {"role": "assistant"} if url == CHAT else {}
    try:
        async for item in gw.follow(request_id):
            if isinstance(item, str):
                piece = {"delta": {**role, "content": item}} if url == CHAT else {"text": item}
                role = {}
                yield _sse(_chunk(url, request_id, model, created, **piece))
                continue
            finished = True
            if role and item.status == "succeeded":  # no text at all: the role alone
                yield _sse(_chunk(url, request_id, model, created, delta=role))
            if item.status != "succeeded":
                yield _sse(result_error(item).body)
                break
            yield _sse(_chunk(url, request_id, model, created, finish_reason=item.finish_reason))
            if include_usage:
                usage = _chunk(url, request_id, model, created)
                usage.update(choices=[], usage=usage_of(item))
                yield _sse(usage)
        yield b"data: [DONE]\n\n"
    except ResultTimeout:
        message = f"no result within {gw.settings.request_timeout_s} s; the request was cancelled"
        yield _sse({"error": {"message": message, "type": "timeout", "code": "timeout"}})
    finally:
        if not finished:
            await cancel_quietly(gw, request_id)
