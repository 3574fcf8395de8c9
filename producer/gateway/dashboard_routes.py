"""The dashboard: ``/dashboard`` (a page, its script and styles, all shipped in the wheel: no
request leaves the page's origin) and the JSON it polls, ``/dashboard/api/...``.

Who sees it: a caller with an admin key (``--admin-key``), sent as ``Authorization: Bearer`` or
as the cookie the login form sets (HttpOnly, SameSite=Strict); with no keys configured at all,
only callers on this machine (loopback). Tenant keys never. Actions (cancel, retry, purge) are
POSTs that must carry the header ``X-Genq-Dashboard`` (a cross-site form cannot), and purging
asks for ``{"confirm": "purge"}``.

What a refresh costs Redis: the overview, workers and tenants pages read one snapshot (one
script call, ``genq.common.snapshot``: the same numbers ``genq stats --json`` prints, and the
history charts); batches three round trips however many rows; dead letters one.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import ipaddress
import time
from importlib import resources
from typing import Any

import orjson
from fastapi import APIRouter, Depends, Form, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from genq.common import history, snapshot
from genq.common.errors import RequestNotFound
from genq.common.models import host_now_ms
from genq.common.wire import as_text
from genq.producer.gateway import batch_views, batches, dead_letters, webhook_letters
from genq.producer.gateway.completions import json_object
from genq.producer.gateway.context import gateway
from genq.producer.gateway.openai_errors import ApiError, invalid, not_found
from starlette.concurrency import run_in_threadpool

PREFIX = "/dashboard"
COOKIE = "genq_dashboard"
SESSION_S = 12 * 3600
"""How long a dashboard sign-in lasts. The cookie holds a session, not the key: its expiry and
an HMAC of it under a key derived from the admin keys (so every replica with those keys
accepts it, and changing the admin keys ends every session)."""
ACTION_HEADER = "x-genq-dashboard"
SILENT_MS = 25_000
"""A worker whose heartbeat is older than this is flagged silent (it beats every second while
anything changes, every 10 s while idle)."""
BATCHES_SHOWN = 50
DEAD_SHOWN = 100
ASSETS = {
    "dashboard.js": "text/javascript",
    "dashboard.css": "text/css",
    "uPlot.iife.min.js": "text/javascript",
    "uPlot.min.css": "text/css",
    "uPlot.LICENSE": "text/plain",
}
"""The files the page loads, from ``genq/producer/gateway/dashboard/`` in the wheel."""
SECURITY_HEADERS = {
    # Nothing but this origin: no CDN, no beacon, no inline script.
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-store",
}

router = APIRouter()


def _asset(name: str) -> bytes:
    return resources.files("genq.producer.gateway").joinpath("dashboard", name).read_bytes()


def _is_local(request: Request) -> bool:
    host = request.client.host if request.client else ""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def allowed(request: Request) -> bool:
    """Whether this request may see the dashboard (see the module's docstring)."""
    gw = gateway(request)
    if not gw.keys:
        return _is_local(request)
    header = request.headers.get("authorization", "")
    given = header[7:].strip() if header.lower().startswith("bearer ") else ""
    if not given:
        return _valid_session(gw.keys, request.cookies.get(COOKIE, ""))
    found = [c for k, c in gw.keys.items() if hmac.compare_digest(given.encode(), k.encode())]
    return bool(found) and found[0].admin


def _signer(keys: dict[str, Any]) -> bytes:
    """The sessions' HMAC key, derived from the admin keys."""
    admin = sorted(k for k, c in keys.items() if c.admin)
    return hashlib.sha256("\0".join(["genq-dashboard-session", *admin]).encode()).digest()


def session_token(keys: dict[str, Any], now: float) -> str:
    """A session that ends ``SESSION_S`` after ``now``: ``EXPIRES.HMAC``."""
    expires = str(int(now) + SESSION_S)
    return f"{expires}.{hmac.new(_signer(keys), expires.encode(), 'sha256').hexdigest()}"


def _valid_session(keys: dict[str, Any], token: str) -> bool:
    expires, _, mac = token.partition(".")
    if not expires.isdigit() or int(expires) < time.time():
        return False
    want = hmac.new(_signer(keys), expires.encode(), "sha256").hexdigest()
    return hmac.compare_digest(mac.encode(), want.encode())


def admin_only(request: Request) -> None:
    """The API's guard: 403 unless ``allowed``; an action also needs ``ACTION_HEADER``."""
    if not allowed(request):
        raise ApiError(
            403,
            "the dashboard needs an admin key (genq serve --admin-key; no keys configured: "
            "only from this machine)",
            type_="invalid_request_error",
            code="admin_key_required",
        )
    if request.method == "POST" and not request.headers.get(ACTION_HEADER):
        raise ApiError(
            403,
            f"dashboard actions need the {ACTION_HEADER} header",
            type_="invalid_request_error",
            code="csrf",
        )


api = APIRouter(prefix=f"{PREFIX}/api", dependencies=[Depends(admin_only)])


def _page(name: str, status: int = 200) -> HTMLResponse:
    return HTMLResponse(_asset(name), status_code=status, headers=SECURITY_HEADERS)


@router.get(PREFIX, include_in_schema=False)
async def page(request: Request) -> Response:
    if allowed(request):
        return _page("index.html")
    if not gateway(request).keys:
        return _page("local_only.html", 403)
    return _page("login.html", 401)


@router.post(f"{PREFIX}/login", include_in_schema=False)
async def login(request: Request, key: str = Form("")) -> Response:
    """The login form: an admin key becomes a session (``SESSION_S``, signed, not the key) in
    an HttpOnly cookie for ``/dashboard``."""
    gw = gateway(request)
    ok = any(hmac.compare_digest(key.encode(), k.encode()) and c.admin for k, c in gw.keys.items())
    out = RedirectResponse(PREFIX, status_code=303)  # back to the form, or to the pages
    if not ok:
        return out
    secure = request.url.scheme == "https"
    token = session_token(gw.keys, time.time())
    out.set_cookie(
        COOKIE,
        token,
        max_age=SESSION_S,
        path=PREFIX,
        httponly=True,
        samesite="strict",
        secure=secure,
    )
    return out


@router.post(f"{PREFIX}/logout", include_in_schema=False)
async def logout() -> Response:
    """Sign out: the session's cookie is dropped (back to the sign-in form)."""
    out = RedirectResponse(PREFIX, status_code=303)
    out.delete_cookie(COOKIE, path=PREFIX)
    return out


@router.get(PREFIX + "/static/{name}", include_in_schema=False)
async def asset(name: str) -> Response:
    if name not in ASSETS:
        return Response(status_code=404)
    return Response(_asset(name), media_type=ASSETS[name], headers=SECURITY_HEADERS)


def _worker_rows(stats: dict[str, Any], now_ms: int) -> None:
    """Mark each worker's state: ``dead`` (its heartbeat hash expired), ``silent`` (older
    than ``SILENT_MS``) or ``live``; and its generated tokens/s and embedded inputs/s."""
    for w in stats["workers"]:
        seen = int(w.get("last_seen_unix_ms") or 0)
        w["seen_ago_ms"] = max(0, now_ms - seen) if seen else None
        if not w["alive"]:
            w["state"] = "dead"
        elif seen and now_ms - seen > SILENT_MS:
            w["state"] = "silent"
        else:
            w["state"] = "live"
        rates = snapshot.derived(w)
        w["tokens_per_s"], w["inputs_per_s"] = rates["tokens_per_s"], rates["inputs_per_s"]


@api.get("/snapshot")
async def read_snapshot(request: Request) -> dict[str, Any]:
    """The queue now (``genq stats --json``'s snapshot) and its last 15 minutes: one script
    call."""
    gw = gateway(request)

    def read() -> dict[str, Any]:
        r, keys = gw.sync_client.redis, gw.sync_client.keys
        raw = snapshot.read(r, keys, history.BUCKETS)
        stats = snapshot.stats_of(r, raw, keys.queue)
        _worker_rows(stats, int(raw["now_ms"]))
        buckets = [(int(b), _pairs(h)) for b, h in raw["history"]]
        return {"now_ms": raw["now_ms"], "stats": stats, "history": history.series(buckets)}

    return await run_in_threadpool(read)


def _pairs(flat: Any) -> dict[str, str]:
    """A hash as Lua's JSON gives it (a flat list; an empty one as ``{}``)."""
    items = list(flat) if isinstance(flat, list) else []
    return {items[i]: items[i + 1] for i in range(0, len(items), 2)}


@api.get("/batches")
async def list_batches(request: Request) -> dict[str, Any]:
    """The newest batches, each as OpenAI's Batch object (status, counts, times)."""
    gw = gateway(request)

    def read() -> dict[str, Any]:
        c = gw.sync_client
        ids = [as_text(b) for b in c.redis.zrevrange(c.keys.batches, 0, BATCHES_SHOWN)]
        views = batch_views.read_batches(c, ids[:BATCHES_SHOWN], states=False)  # expired: left out
        return {
            "queue": c.keys.queue,
            "data": [batches.status_object(v) for v in views],
            "has_more": len(ids) > BATCHES_SHOWN,
        }

    return await run_in_threadpool(read)


@api.post("/batches/{batch_id}/cancel")
async def cancel_batch(batch_id: str, request: Request) -> dict[str, Any]:
    gw = gateway(request)

    def cancel() -> dict[str, Any]:
        n = batches.cancel_batch(gw.sync_client, batch_id)
        return {"cancelled": n, "batch": batches.batch_status(gw.sync_client, batch_id)}

    return await run_in_threadpool(_or_404, cancel)


def _or_404(work: Any) -> Any:
    try:
        return work()
    except RequestNotFound as err:
        raise not_found(str(err)) from None


@api.get("/dead-letters")
async def list_dead(request: Request) -> dict[str, Any]:
    """The oldest dead letters of the queue, and its webhook deliveries that gave up."""
    gw = gateway(request)

    def read() -> dict[str, Any]:
        r, keys = gw.sync_client.redis, gw.sync_client.keys
        pipe = r.pipeline(transaction=False)  # one round trip: both streams are the queue's
        pipe.xrange(keys.dead_letter, count=DEAD_SHOWN)
        pipe.xrange(keys.webhook_dead, count=DEAD_SHOWN)
        rows, hook_rows = pipe.execute()
        entries, hooks = dead_letters.from_rows(rows), webhook_letters.from_rows(hook_rows)
        return {
            "queue": keys.queue,
            "entries": [dataclasses.asdict(e) for e in entries],
            "webhooks": [dataclasses.asdict(h) for h in hooks],
        }

    return await run_in_threadpool(read)


@api.post("/dead-letters/{dlq_id}/retry")
async def retry_dead(dlq_id: str, request: Request) -> dict[str, Any]:
    gw = gateway(request)

    def retry() -> dict[str, Any]:
        c = gw.sync_client
        entry_ids = dead_letters.retry_dead(c.redis, c.keys, [dlq_id], c.result_ttl_s)
        if not entry_ids:
            raise RequestNotFound(f"no dead letter {dlq_id!r} to retry (retried or purged)")
        return {"retried": entry_ids}

    return await run_in_threadpool(_or_404, retry)


@api.post("/dead-letters/purge")
async def purge_dead(request: Request) -> dict[str, Any]:
    body = await json_object(request)
    if body.get("confirm") != "purge":
        raise invalid('purging deletes every dead letter: send {"confirm": "purge"}')
    gw = gateway(request)
    c = gw.sync_client
    return {"purged": await run_in_threadpool(dead_letters.purge_dead, c.redis, c.keys)}


@api.post("/webhook-letters/{dead_id}/retry")
async def retry_webhook(dead_id: str, request: Request) -> dict[str, Any]:
    gw = gateway(request)
    c = gw.sync_client

    def retry() -> dict[str, Any]:
        done = webhook_letters.retry_dead(c.redis, c.keys, [dead_id])
        if not done:
            raise RequestNotFound(f"no dead webhook delivery {dead_id!r} (retried already?)")
        return {"retried": done}

    return await run_in_threadpool(_or_404, retry)


@api.get("/requests/{request_id}")
async def look_up(request_id: str, request: Request) -> dict[str, Any]:
    """A request's state as stored (status, timings, tenant, worker, text), and its response
    record's id if it was made through ``/v1/responses``."""
    gw = gateway(request)
    r, keys = gw.sync_client.redis, gw.sync_client.keys
    state, response = await run_in_threadpool(
        r.mget, [keys.result(request_id), keys.response(request_id)]
    )
    if state is None:
        raise not_found(f"no request {request_id!r} (never submitted, or expired)")
    try:
        doc = orjson.loads(state)
    except orjson.JSONDecodeError:  # written by hand: show what is there
        doc = {"id": request_id, "status": "unreadable", "text": as_text(state, "replace")}
    return {
        "queue": keys.queue,
        "state": doc,
        "response_id": f"resp_{request_id}" if response is not None else None,
        "read_unix_ms": host_now_ms(),
    }


def install(app: Any) -> None:
    """Add the dashboard's page and API to ``app``."""
    app.include_router(router)
    app.include_router(api)
