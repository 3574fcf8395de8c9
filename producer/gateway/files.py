"""``/v1/files``: batch input files, their bytes in the file store (``file_store.py``: a local
directory, or an object store) and their records in Redis (``Keys.file``, with the queue's
result TTL); and batch output and error files, rendered from the batch's results when read
(their ids are ``BATCH-output`` and ``BATCH-errors``; nothing is stored twice).

An upload is checked as it passes to the store (UTF-8, no line over ``--max-body-bytes``, the
whole under ``--max-file-bytes``) and is stored whole or not at all. Expired files' bytes are
removed from the store by the gateways (``Keys.files``), a few at each upload.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse
from genq.common.errors import InvalidRequest, RequestNotFound
from genq.common.keys import Keys
from genq.common.wire import as_text
from genq.producer.gateway import batch_views, batches, wave_files
from genq.producer.gateway.context import Caller, Gateway, caller, gateway
from genq.producer.gateway.file_store import (
    FileTooLarge,
    LineCheck,
    StoredFileMissing,
    StoreError,
    UploadRefused,
    repeats_of,
)
from genq.producer.gateway.openai_errors import ApiError, invalid, not_found
from genq.producer.gateway.repeated_ids import CustomIds
from genq.producer.gateway.upload_stream import UploadStream
from starlette.concurrency import iterate_in_threadpool, run_in_threadpool

router = APIRouter()
OUTPUT_SUFFIXES = {"-output": "output", "-errors": "errors"}
MAX_FIELD_BYTES = 65_536
"""Largest multipart field of an upload other than its file."""
SWEEP_BATCH = 50
"""Expired files whose bytes one upload removes from the store, at most."""
FIELDS = ["bytes", "lines", "created_at", "expires_at", "filename", "purpose", "tenant", "queue"]
FIELDS += ["store", "path", "repeats"]


def upload_path(file_id: str) -> str:
    """Where an uploaded file's bytes are in the file store."""
    return f"uploads/{file_id}.jsonl"


def _file_object(file_id: str, info: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": file_id,
        "object": "file",
        "bytes": int(info["bytes"]),
        "created_at": int(info["created_at"]),
        "filename": info["filename"],
        "purpose": info["purpose"],
        "status": "processed",
        "expires_at": info.get("expires_at"),
        "status_details": None,
    }


def store_failed(err: StoreError) -> ApiError:
    """What a file store's failure answers: 507 if it is full, else 503 (try again)."""
    text = str(err)
    if any(s in text.lower() for s in ("no space", "too large", "quota", "full")):
        return ApiError(507, text, type_="insufficient_storage", code="file_store_full")
    return ApiError(503, text, type_="server_error", code="file_store_unavailable")


@router.post("/v1/files")
async def upload(request: Request) -> dict[str, Any]:
    """Upload a batch input file (multipart: ``file``, ``purpose`` = ``batch``) to the file
    store, streamed: checked and written as it arrives (``upload_stream.py``)."""
    gw, s = gateway(request), gateway(request).settings
    try:
        form = UploadStream(
            request.stream(),
            request.headers.get("content-type", ""),
            max_field_bytes=MAX_FIELD_BYTES,
        )
        if not await form.until_file():
            raise invalid("a multipart field 'file' is required", param="file")
    except InvalidRequest as err:
        raise invalid(str(err), param="file") from None
    if form.fields.get("purpose", "batch") != "batch":  # known before the file: refused first
        raise invalid(f"purpose must be 'batch', got {form.fields['purpose']!r}", param="purpose")
    declared = int(request.headers.get("content-length") or 0)  # the quota's first guess
    file_id = "file-" + uuid.uuid4().hex[:24]
    now, path, tenant = int(time.time()), upload_path(file_id), caller(request).tenant
    await gw.quotas.claim(tenant, "files", file_id, min(declared, s.max_file_bytes))
    ids = CustomIds()
    check = LineCheck(max_bytes=s.max_file_bytes, max_line_bytes=s.max_body_bytes, ids=ids)
    try:
        await gw.files.upload(path, form.file_chunks(), check)
        twice = await run_in_threadpool(repeats_of, gw.files, path, ids)
        if form.fields.get("purpose") != "batch":
            purpose = form.fields.get("purpose")
            raise InvalidRequest(f"purpose must be 'batch', got {purpose!r}")
    except BaseException as err:
        await gw.quotas.give_back(tenant, "files", file_id, min(declared, s.max_file_bytes))
        if isinstance(err, InvalidRequest) and form.fields.get("purpose") != "batch":
            await run_in_threadpool(gw.files.delete, path)
            raise invalid(str(err), param="purpose") from None
        if isinstance(err, StoreError):
            raise store_failed(err) from None
        if isinstance(err, FileTooLarge):
            raise ApiError(413, str(err), type_="invalid_request_error", code=err.code) from None
        if isinstance(err, (UploadRefused, InvalidRequest)):
            raise invalid(str(err), param="file") from None
        raise
    if check.bytes != min(declared, s.max_file_bytes):  # the quota counts what was stored
        await gw.quotas.give_back(tenant, "files", file_id, min(declared, s.max_file_bytes))
        await gw.quotas.claim(tenant, "files", file_id, check.bytes)
    info: dict[str, Any] = {
        "bytes": check.bytes,
        "lines": check.lines,
        "created_at": now,
        "expires_at": now + s.result_ttl_s,
        "filename": form.filename or "upload.jsonl",
        "purpose": "batch",
    }
    pipe = gw.client.redis.pipeline(transaction=True)
    where: dict[str, Any] = {"store": gw.files.where, "path": path}
    stored: Any = {**info, "tenant": tenant, "queue": s.queue, **where}
    if twice:  # the lines that repeat an earlier one's custom_id: error lines of its batch
        stored["repeats"] = json.dumps(twice)
    pipe.hset(Keys.file(file_id), mapping=stored)
    pipe.expire(Keys.file(file_id), s.result_ttl_s)
    pipe.zadd(gw.client.keys.files, {file_id: now + s.result_ttl_s})
    try:
        await pipe.execute()
    except Exception:
        await gw.quotas.give_back(tenant, "files", file_id, check.bytes)
        await run_in_threadpool(gw.files.delete, path)
        raise
    await _sweep(gw, now)
    return _file_object(file_id, info)


async def _sweep(gw: Gateway, now: int) -> None:
    """Remove a few expired files' bytes from the store (their records expired in Redis)."""
    r, key = gw.client.redis, gw.client.keys.files
    expired: Any = await r.zrange(key, "-inf", now, byscore=True, offset=0, num=SWEEP_BATCH)
    for raw in expired:
        file_id = as_text(raw)
        try:
            await run_in_threadpool(gw.files.delete, upload_path(file_id))
        except StoreError:
            return  # the store is away: the next upload tries again
        await r.zrem(key, file_id)


def _output_of(file_id: str) -> tuple[str, str] | None:
    """(batch id, 'output' or 'errors') for a batch output file's id."""
    for suffix, kind in OUTPUT_SUFFIXES.items():
        if file_id.endswith(suffix):
            return file_id[: -len(suffix)], kind
    return None


def _missing(file_id: str) -> ApiError:
    """What a file that is not there answers; and one of another tenant (no hint it exists)."""
    return not_found(f"no file {file_id!r} (never uploaded, or expired)")


def _render(gw: Gateway, who: Caller, file_id: str) -> tuple[dict[str, Any], Any]:
    """A batch output or error file: its details and content (a wave batch's: the names of its
    parts in the store, written so far; another's: rendered from its results now)."""
    found = _output_of(file_id)
    if found is None:
        raise _missing(file_id)
    batch_id, kind = found
    try:
        view = batch_views.read_batch(
            gw.sync_client, batch_id, tenant=None if who.admin else who.tenant, states=False
        )
        if view.waves:
            names = wave_files.parts(gw.files, batch_id, kind)
            return _output_info(view, batch_id, kind, sum(n for _, n in names)), names
        view = batch_views.read_batch(
            gw.sync_client, batch_id, tenant=None if who.admin else who.tenant
        )
    except RequestNotFound:
        raise _missing(file_id) from None
    ok, failed, _ = batches.output_files(view)
    lines = ok if kind == "output" else failed
    content = "".join(json.dumps(line) + "\n" for line in lines).encode()
    return _output_info(view, batch_id, kind, len(content)), content


def _output_info(
    view: batch_views.BatchView, batch_id: str, kind: str, size: int
) -> dict[str, Any]:
    return {
        "bytes": size,
        "created_at": int(view.record.get("created_at", 0)),
        "expires_at": int(view.record.get("expires_at", 0)) or None,
        "filename": f"{batch_id}_{kind}.jsonl",
        "purpose": "batch_output",
    }


async def stored_file(gw: Gateway, who: Caller, file_id: str) -> dict[str, Any]:
    """An uploaded file's record, or a rendered batch output's details (``rendered``: its
    content); 404 if there is none that ``who`` may see."""
    values: Any = await gw.client.redis.hmget(Keys.file(file_id), FIELDS)
    if values[0] is None:
        rendered, content = await run_in_threadpool(_render, gw, who, file_id)
        return {**rendered, "rendered": content}
    info: dict[str, Any] = {
        f: (None if v is None else as_text(v)) for f, v in zip(FIELDS, values, strict=True)
    }
    queue = info.pop("queue")  # a file of another queue's gateway is not this one's
    if not who.sees(info.pop("tenant")) or queue not in (None, gw.settings.queue):
        raise _missing(file_id)
    if info.get("path") is None:
        raise not_found(f"file {file_id!r} was kept in Redis by an older genq: upload it again")
    if info["store"] != gw.files.where:
        raise ApiError(
            409,
            f"file {file_id!r} is in the file store {info['store']!r}, and this gateway's is "
            f"{gw.files.where!r} (genq serve --files-dir): the gateways of a queue share one",
            type_="invalid_request_error",
            code="file_store_mismatch",
        )
    info["expires_at"] = int(info["expires_at"]) if info.get("expires_at") else None
    return info


@router.get("/v1/files/{file_id}")
async def retrieve(file_id: str, request: Request) -> dict[str, Any]:
    info = await stored_file(gateway(request), caller(request), file_id)
    return _file_object(file_id, info)


@router.get("/v1/files/{file_id}/content")
async def file_content(file_id: str, request: Request) -> Response:
    gw = gateway(request)
    info = await stored_file(gw, caller(request), file_id)
    if isinstance(info.get("rendered"), list):  # a wave batch's parts in the store
        parts = wave_files.read_parts(gw.files, info["rendered"])
        headers = {"content-length": str(info["bytes"])}
        return StreamingResponse(
            iterate_in_threadpool(parts), media_type="application/jsonl", headers=headers
        )
    if "rendered" in info:
        return Response(info["rendered"], media_type="application/jsonl")
    chunks = gw.files.chunks(info["path"])
    try:  # the store's errors before the answer starts: a clear status, not a cut stream
        first = await anext(chunks, b"")
    except StoredFileMissing as err:
        raise not_found(f"file {file_id!r}: {err}", "file_missing") from None
    except StoreError as err:
        raise store_failed(err) from None

    async def content() -> AsyncIterator[bytes]:
        yield first
        async for chunk in chunks:
            yield chunk

    headers = {"content-length": str(info["bytes"])}
    return StreamingResponse(content(), media_type="application/jsonl", headers=headers)


@router.delete("/v1/files/{file_id}")
async def delete(file_id: str, request: Request) -> dict[str, Any]:
    """Delete an uploaded file (a batch that used it keeps its requests)."""
    gw = gateway(request)
    info = await stored_file(gw, caller(request), file_id)  # 404 if not theirs
    if "rendered" in info:
        raise invalid(f"file {file_id!r} is a batch's output: delete the batch's files with it")
    owner: Any = await gw.client.redis.hget(Keys.file(file_id), "tenant")
    try:
        await run_in_threadpool(gw.files.delete, info["path"])
    except StoreError as err:
        raise store_failed(err) from None
    if not await gw.client.redis.delete(Keys.file(file_id)):
        raise _missing(file_id)
    await gw.client.redis.zrem(gw.client.keys.files, file_id)
    if owner is not None:
        await gw.quotas.give_back(as_text(owner), "files", file_id, int(info["bytes"]))
    return {"id": file_id, "object": "file", "deleted": True}
