"""``/v1/responses``: create, retrieve, cancel, delete, and list a response's input items.

A response is a genq request plus its record in Redis (``Keys.response``, kept for the result
TTL; ``responses.py`` has the shapes), so any gateway replica answers for it and a gateway
killed mid-way loses nothing: the worker writes the request's state, and the response's status
is read from it. ``background: true`` answers ``queued`` at once and the request runs whether
or not anyone waits; otherwise the answer comes when it is final (a client that disconnects
cancels it, as on chat). ``stream: true`` sends OpenAI's response events. A key sees only its
tenant's responses (another's answer 404).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from genq.common.errors import GenqError, InvalidRequest, ResultTimeout
from genq.common.keys import Keys
from genq.common.models import Result
from genq.common.wire import decode_result
from genq.producer.gateway.completions import (
    cancel_quietly,
    checked_request,
    held,
    json_object,
    result_error,
    served_model,
    wait_or_cancel,
)
from genq.producer.gateway.context import Caller, Gateway, caller, gateway
from genq.producer.gateway.openai_errors import invalid, not_found
from genq.producer.gateway.responses import (
    ResponseRecord,
    context_after,
    conversation,
    items_page,
    output_message,
    parse_create,
    request_id_of,
    response_object,
    status_of,
)

router = APIRouter()


@router.post("/v1/responses")
async def create(request: Request) -> Response:
    gw, who = gateway(request), caller(request)
    gw.enter(who)
    response: Response | None = None
    try:
        response = await _create(request, gw, who)
        return response
    finally:
        if not isinstance(response, StreamingResponse):  # a stream leaves when it ends
            gw.leave(who)


async def _create(request: Request, gw: Gateway, who: Caller) -> Response:
    request_id = uuid.uuid4().hex
    args = parse_create(await json_object(request), request_id)
    model = await served_model(gw, args.model)
    context: list[dict[str, Any]] = []
    if args.previous_response_id is not None:
        previous, previous_result = await _load(gw, who, args.previous_response_id)
        if previous_result is None:
            raise InvalidRequest(f"previous response {previous.id} has not run yet")
        context = context_after(previous, previous_result)
        if previous.prompt_cache_key and "prompt_cache_key" not in args.options:
            args.options["prompt_cache_key"] = previous.prompt_cache_key  # inherited
    req = await checked_request(
        args.options,
        messages=conversation(args.instructions, context, args.input_items),
        stream=args.stream,
        metadata=args.metadata,
        tenant=who.tenant,
        request_id=request_id,
        model=model,
    )
    record = ResponseRecord(
        id=f"resp_{request_id}",
        request_id=request_id,
        created_at=int(time.time()),
        model=model,
        tenant=who.tenant,
        queue=gw.settings.queue,
        background=args.background,
        instructions=args.instructions,
        input_items=args.input_items,
        context=context,
        metadata=args.metadata,
        temperature=args.options.get("temperature"),
        top_p=args.options.get("top_p"),
        max_output_tokens=args.options.get("max_new_tokens"),
        text_format=args.text_format,
        previous_response_id=args.previous_response_id,
        prompt_cache_key=args.options.get("prompt_cache_key"),
    )
    key = Keys.response(request_id)
    if args.store:  # first: whoever sees the request's id can read its record
        await gw.quotas.claim(who.tenant, "responses", request_id)
        await gw.client.redis.set(key, record.model_dump_json(), ex=gw.settings.result_ttl_s)
    try:
        await gw.submitter.submit(req)
    except GenqError:
        await gw.client.redis.delete(key)
        raise
    if args.stream:
        events = held(gw, who, _events(gw, record, cancel_on_leave=not args.background))
        return StreamingResponse(events, media_type="text/event-stream")
    if args.background:
        return JSONResponse(response_object(record, None))
    result = await wait_or_cancel(gw, request, request_id)
    if result.status not in ("succeeded",):
        raise result_error(result)
    return JSONResponse(response_object(record, result))


@router.get("/v1/responses/{response_id}")
async def retrieve(response_id: str, request: Request) -> dict[str, Any]:
    record, result = await _load(gateway(request), caller(request), response_id)
    return response_object(record, result)


@router.post("/v1/responses/{response_id}/cancel")
async def cancel(response_id: str, request: Request) -> dict[str, Any]:
    """Cancel a background response (OpenAI: only those can be); a final one is returned as
    it is."""
    gw = gateway(request)
    record, result = await _load(gw, caller(request), response_id)
    if not record.background:
        raise invalid("only a response created with background: true can be cancelled")
    if status_of(result) in ("queued", "in_progress"):
        await gw.client.cancel(record.request_id)
        record, result = await _load(gw, caller(request), response_id)
    return response_object(record, result)


@router.delete("/v1/responses/{response_id}")
async def delete(response_id: str, request: Request) -> dict[str, Any]:
    """Delete the response's record; one still queued or running is cancelled first."""
    gw = gateway(request)
    record, result = await _load(gw, caller(request), response_id)
    if status_of(result) in ("queued", "in_progress"):
        await cancel_quietly(gw, record.request_id)
    await gw.client.redis.delete(Keys.response(record.request_id))
    await gw.quotas.give_back(record.tenant, "responses", record.request_id)
    return {"id": record.id, "object": "response.deleted", "deleted": True}


@router.get("/v1/responses/{response_id}/input_items")
async def input_items(
    response_id: str,
    request: Request,
    order: str = "desc",
    limit: int = 20,
    after: str | None = None,
) -> dict[str, Any]:
    record, _ = await _load(gateway(request), caller(request), response_id)
    return items_page(record.input_items, order=order, limit=limit, after=after)


async def _load(gw: Gateway, who: Caller, response_id: str) -> tuple[ResponseRecord, Result | None]:
    """A response's record and its request's state (one round trip); 404 if there is none,
    or it is another tenant's."""
    request_id = request_id_of(response_id)
    if request_id is None:
        raise not_found(f"no response {response_id!r}", "response_not_found")
    raw_record, raw_result = await gw.client.redis.mget(
        [Keys.response(request_id), Keys.result(request_id)]
    )
    if raw_record is None:
        raise not_found(f"no response {response_id!r} (or it expired)", "response_not_found")
    record = ResponseRecord.model_validate_json(raw_record)
    if not who.sees(record.tenant) or record.queue not in (None, gw.settings.queue):
        raise not_found(f"no response {response_id!r} (or it expired)", "response_not_found")
    return record, None if raw_result is None else decode_result(raw_result)


class _Numbered:
    """Server-sent events, numbered in order (``sequence_number``)."""

    def __init__(self) -> None:
        self.n = 0

    def __call__(self, kind: str, **doc: Any) -> str:
        body = json.dumps({"type": kind, "sequence_number": self.n, **doc})
        self.n += 1
        return f"event: {kind}\ndata: {body}\n\n"


_ENDS = {"completed": "response.completed", "incomplete": "response.incomplete"}
"""The last event of a response by its status (any other: ``response.failed``)."""


async def _events(
    gw: Gateway, record: ResponseRecord, *, cancel_on_leave: bool
) -> AsyncIterator[str]:
    """OpenAI's response events: created, in_progress, the message's item and part added,
    each text delta, then the text, part and item done and completed (or incomplete; failed
    and cancelled end with ``response.failed``). A client that leaves a foreground response
    cancels it."""
    sse = _Numbered()
    at = {"output_index": 0, "item_id": f"msg_{record.request_id}", "content_index": 0}
    part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
    finished = False
    try:
        yield sse("response.created", response=response_object(record, None))
        yield sse("response.in_progress", response=response_object(record, None))
        item = output_message(record, "", "in_progress")
        yield sse("response.output_item.added", output_index=0, item=item)
        yield sse("response.content_part.added", **at, part=part)
        async for piece in gw.follow(record.request_id):
            if isinstance(piece, str):
                yield sse("response.output_text.delta", **at, delta=piece, logprobs=[])
                continue
            finished = True
            final = response_object(record, piece)
            if piece.status == "succeeded":
                text = piece.text or ""
                yield sse("response.output_text.done", **at, text=text, logprobs=[])
                yield sse("response.content_part.done", **at, part={**part, "text": text})
                yield sse("response.output_item.done", output_index=0, item=final["output"][0])
            yield sse(_ENDS.get(final["status"], "response.failed"), response=final)
    except ResultTimeout:
        message = f"no result within {gw.settings.request_timeout_s} s"
        yield sse("error", code="timeout", message=message, param=None)
    finally:
        if not finished and cancel_on_leave:
            await cancel_quietly(gw, record.request_id)
