"""``/v1/files``: batch input files kept in Redis (``Keys.file``, with the queue's result TTL),
and batch output and error files, rendered from the batch's results when read (their ids are
``BATCH-output`` and ``BATCH-errors``; nothing is stored twice)."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response
from genq.common.errors import RequestNotFound
from genq.common.keys import Keys
from genq.common.wire import as_text
from genq.producer.gateway import batch_views, batches
from genq.producer.gateway.context import Caller, Gateway, caller, gateway
from genq.producer.gateway.openai_errors import ApiError, invalid, not_found
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import UploadFile

router = APIRouter()
OUTPUT_SUFFIXES = {"-output": "output", "-errors": "errors"}
MAX_FIELD_BYTES = 65_536
"""Largest multipart field of an upload other than its file."""


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


@router.post("/v1/files")
async def upload(request: Request) -> dict[str, Any]:
    """Upload a batch input file (multipart: ``file``, ``purpose`` = ``batch``)."""
    gw = gateway(request)
    # Fields other than the file are small (purpose); one file. The body's whole size is
    # bounded as it arrives (body_limit).
    form = await request.form(max_files=1, max_fields=8, max_part_size=MAX_FIELD_BYTES)
    purpose, upload = form.get("purpose"), form.get("file")
    if purpose != "batch":
        raise invalid(f"purpose must be 'batch', got {purpose!r}", param="purpose")
    if not isinstance(upload, UploadFile):
        raise invalid("a multipart field 'file' is required", param="file")
    content = await upload.read(gw.settings.max_file_bytes + 1)
    if len(content) > gw.settings.max_file_bytes:
        raise invalid(
            f"the file is over {gw.settings.max_file_bytes} bytes (genq serve --max-file-bytes)",
            param="file",
        )
    file_id = "file-" + uuid.uuid4().hex[:24]
    now = int(time.time())
    info: dict[str, Any] = {
        "bytes": len(content),
        "created_at": now,
        "expires_at": now + gw.settings.result_ttl_s,
        "filename": upload.filename or "upload.jsonl",
        "purpose": "batch",
    }
    key, tenant = Keys.file(file_id), caller(request).tenant
    await gw.room.check(len(content), "an upload")
    await gw.quotas.claim(tenant, "files", file_id, len(content))
    pipe = gw.client.redis.pipeline(transaction=True)
    stored: Any = {**info, "content": content, "tenant": tenant, "queue": gw.settings.queue}
    pipe.hset(key, mapping=stored)
    pipe.expire(key, gw.settings.result_ttl_s)
    try:
        await pipe.execute()
    except Exception:
        await gw.quotas.give_back(tenant, "files", file_id, len(content))
        raise
    return _file_object(file_id, info)


def _output_of(file_id: str) -> tuple[str, str] | None:
    """(batch id, 'output' or 'errors') for a batch output file's id."""
    for suffix, kind in OUTPUT_SUFFIXES.items():
        if file_id.endswith(suffix):
            return file_id[: -len(suffix)], kind
    return None


def _missing(file_id: str) -> ApiError:
    """What a file that is not there answers; and one of another tenant (no hint it exists)."""
    return not_found(f"no file {file_id!r} (never uploaded, or expired)")


def _render(gw: Gateway, who: Caller, file_id: str) -> tuple[dict[str, Any], bytes]:
    """A batch output or error file: its details and content, from the batch's results now."""
    found = _output_of(file_id)
    if found is None:
        raise _missing(file_id)
    batch_id, kind = found
    try:
        view = batch_views.read_batch(
            gw.sync_client, batch_id, tenant=None if who.admin else who.tenant
        )
    except RequestNotFound:
        raise _missing(file_id) from None
    ok, failed, _ = batches.output_files(view)
    lines = ok if kind == "output" else failed
    content = "".join(json.dumps(line) + "\n" for line in lines).encode()
    info = {
        "bytes": len(content),
        "created_at": int(view.record.get("created_at", 0)),
        "expires_at": int(view.record.get("expires_at", 0)) or None,
        "filename": f"{batch_id}_{kind}.jsonl",
        "purpose": "batch_output",
    }
    return info, content


async def stored_file(
    gw: Gateway, who: Caller, file_id: str, *, content: bool
) -> tuple[dict[str, Any], bytes]:
    """An uploaded file's details (and its content if asked), or a rendered batch output; 404
    if there is none that ``who`` may see."""
    key = Keys.file(file_id)
    fields = ["bytes", "created_at", "expires_at", "filename", "purpose", "tenant", "queue"]
    values: Any = await gw.client.redis.hmget(key, [*fields, "content"] if content else fields)
    if values[0] is None:
        return await run_in_threadpool(_render, gw, who, file_id)
    info: dict[str, Any] = {
        f: (None if v is None else as_text(v)) for f, v in zip(fields, values, strict=False)
    }
    queue = info.pop("queue")  # a file of another queue's gateway is not this one's
    if not who.sees(info.pop("tenant")) or queue not in (None, gw.settings.queue):
        raise _missing(file_id)
    info["expires_at"] = int(info["expires_at"]) if info.get("expires_at") else None
    return info, (bytes(values[-1]) if content else b"")


@router.get("/v1/files/{file_id}")
async def retrieve(file_id: str, request: Request) -> dict[str, Any]:
    info, _ = await stored_file(gateway(request), caller(request), file_id, content=False)
    return _file_object(file_id, info)


@router.get("/v1/files/{file_id}/content")
async def file_content(file_id: str, request: Request) -> Response:
    _, content = await stored_file(gateway(request), caller(request), file_id, content=True)
    return Response(content, media_type="application/jsonl")


@router.delete("/v1/files/{file_id}")
async def delete(file_id: str, request: Request) -> dict[str, Any]:
    """Delete an uploaded file (a batch that used it keeps its requests)."""
    gw = gateway(request)
    info, _ = await stored_file(gw, caller(request), file_id, content=False)  # 404 if not theirs
    owner: Any = await gw.client.redis.hget(Keys.file(file_id), "tenant")
    if not await gw.client.redis.delete(Keys.file(file_id)):
        raise _missing(file_id)
    if owner is not None:
        await gw.quotas.give_back(as_text(owner), "files", file_id, int(info["bytes"]))
    return {"id": file_id, "object": "file", "deleted": True}
