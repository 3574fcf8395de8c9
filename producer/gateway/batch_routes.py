"""``/v1/batches``: create (from an uploaded file), retrieve, list, cancel; on the same batches
as ``genq batch`` (``gateway.batches``), run in threads with the plain client."""

from __future__ import annotations

import uuid
from typing import Any

from fastapi import APIRouter, Request
from genq.common.connection import is_cluster
from genq.common.errors import InvalidRequest
from genq.common.models import PRIORITIES
from genq.producer.gateway import batch_waves, batches, wave_files
from genq.producer.gateway.batch_lines import ENDPOINTS
from genq.producer.gateway.completions import json_object
from genq.producer.gateway.context import caller, gateway
from genq.producer.gateway.file_store import StoredFileMissing, StoreError
from genq.producer.gateway.files import store_failed, stored_file
from genq.producer.gateway.openai_errors import invalid, not_found
from genq.producer.gateway.repeated_ids import parse_repeats
from starlette.concurrency import run_in_threadpool

router = APIRouter()
CANCEL_WAIT_S = 10.0
"""Longest a cancel waits for a wave batch's cancelled lines to be written out."""


@router.post("/v1/batches")
async def create(request: Request) -> dict[str, Any]:
    gw = gateway(request)
    body = await json_object(request)
    endpoint, window = body.get("endpoint"), body.get("completion_window", "24h")
    file_id, metadata = body.get("input_file_id"), body.get("metadata")
    priority = body.get("priority", "normal")  # genq's own: the batch's priority
    if endpoint not in ENDPOINTS:
        raise invalid(
            f"endpoint must be one of {sorted(ENDPOINTS)}, got {endpoint!r}", param="endpoint"
        )
    try:
        batch_waves.window_seconds(window)
    except InvalidRequest as err:
        raise invalid(str(err), param="completion_window") from None
    if not isinstance(file_id, str):
        raise invalid("input_file_id is required", param="input_file_id")
    if metadata is not None and not (
        isinstance(metadata, dict) and all(isinstance(v, str) for v in metadata.values())
    ):
        raise invalid("metadata must be an object of strings", param="metadata")
    who = caller(request)
    info = await stored_file(gw, who, file_id)
    if info["purpose"] != "batch":
        raise invalid(f"file {file_id!r} is not a batch input file", param="input_file_id")
    if priority not in PRIORITIES:
        raise invalid(f"priority must be one of {list(PRIORITIES)}", param="priority")
    await gw.quotas.claim(who.tenant, "batches", uuid.uuid4().hex)
    if not is_cluster(gw.sync_client.redis):  # in waves, from the file store
        wave = batch_waves.WaveBatch(
            id=batch_waves.new_batch_id(),
            path=info["path"],
            lines=int(info.get("lines") or 0),
            source=file_id,
            endpoint=endpoint,
            priority=priority,
            tenant=who.tenant,
            window=gw.settings.batch_window,
            completion_window=window,
            metadata=metadata or {},
            repeats=parse_repeats(info.get("repeats") or ""),
        )

        def create_wave() -> dict[str, Any]:
            if gw.files.size(wave.path) is None:
                raise StoredFileMissing(f"{wave.path!r} is not in the file store")
            batch_waves.create(gw.sync_client, gw.files, wave)
            return batches.batch_status(gw.sync_client, wave.id)

        try:
            return await run_in_threadpool(create_wave)
        except StoredFileMissing as err:
            raise not_found(f"file {file_id!r}: {err}", "file_missing") from None
    # A Redis Cluster: every line enqueued at once (a batch's keys and its requests' are in
    # different slots, which the wave scripts need together).
    await gw.room.check(int(info["bytes"]), "a batch's requests")

    def submit() -> dict[str, Any]:
        # UTF-8 was checked at upload; the store streams the lines.
        lines = (line.decode("utf-8") for _, line in gw.files.lines(info["path"]))
        done = batches.submit_batch(
            gw.sync_client,
            lines,
            source=file_id,
            priority=priority,
            endpoint=endpoint,
            metadata=metadata,
            tenant=who.tenant,
        )
        return batches.batch_status(gw.sync_client, done.id)

    try:
        return await run_in_threadpool(submit)
    except StoredFileMissing as err:
        raise not_found(f"file {file_id!r}: {err}", "file_missing") from None
    except StoreError as err:
        raise store_failed(err) from None


@router.get("/v1/batches/{batch_id}")
async def retrieve(batch_id: str, request: Request) -> dict[str, Any]:
    gw, tenant = gateway(request), caller(request).scope

    def run() -> dict[str, Any]:
        return batches.batch_status(gw.sync_client, batch_id, tenant=tenant)

    return await run_in_threadpool(run)


@router.post("/v1/batches/{batch_id}/cancel")
async def cancel(batch_id: str, request: Request) -> dict[str, Any]:
    gw, tenant = gateway(request), caller(request).scope

    def run() -> dict[str, Any]:
        batches.cancel_batch(gw.sync_client, batch_id, tenant=tenant)
        # A wave batch's cancelled lines written out (a moment: they are at most its window),
        # so that the answer says "cancelled" with its error file whole; "cancelling" if not.
        wave_files.run_until(
            gw.sync_client,
            gw.files,
            batch_id,
            lambda rec: rec.get("waves") != "1" or bool(rec.get("finished_at_ms")),
            timeout_s=CANCEL_WAIT_S,
            pause_s=0.05,
        )
        return batches.batch_status(gw.sync_client, batch_id)

    return await run_in_threadpool(run)


@router.get("/v1/batches")
async def list_all(request: Request, after: str | None = None, limit: int = 20) -> dict[str, Any]:
    gw, tenant = gateway(request), caller(request).scope
    if not 1 <= limit <= 100:
        raise invalid("limit must be 1-100", param="limit")

    def run() -> dict[str, Any]:
        ids, more = batches.list_batches(gw.sync_client, after=after, limit=limit, tenant=tenant)
        data = [batches.batch_status(gw.sync_client, b) for b in ids]
        first, last = (ids[0], ids[-1]) if ids else (None, None)
        return {
            "object": "list",
            "data": data,
            "first_id": first,
            "last_id": last,
            "has_more": more,
        }

    return await run_in_threadpool(run)
