"""Errors as OpenAI's error JSON, with the status codes the OpenAI SDKs map to their exceptions:
400 BadRequestError, 401 AuthenticationError, 404 NotFoundError, 429 RateLimitError (the queue
is full: the SDKs retry it with backoff), 503 (no live worker, or Redis unreachable: retried
too), 504 (no result in time), 507 (Redis' room for uploads and batches is taken:
``redis_room.py``)."""

from __future__ import annotations

import logging
from typing import Any

import redis
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from genq.common.errors import (
    INPUT_ERRORS,
    InvalidRequest,
    PriorityDenied,
    QueueFull,
    RequestNotFound,
    SubmitFailed,
)
from genq.producer.gateway.body_limit import BodyTooLarge
from starlette.exceptions import HTTPException

log = logging.getLogger(__name__)


class ApiError(Exception):
    """An error to answer with ``status`` and OpenAI's error object."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type_: str,
        code: str | None = None,
        param: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.headers = headers
        self.body = {"error": {"message": message, "type": type_, "param": param, "code": code}}


def invalid(message: str, code: str | None = None, param: str | None = None) -> ApiError:
    """400: the request is wrong; sending it again will not help."""
    return ApiError(400, message, type_="invalid_request_error", code=code, param=param)


def not_found(message: str, code: str = "not_found") -> ApiError:
    return ApiError(404, message, type_="invalid_request_error", code=code)


def unavailable(message: str, code: str) -> ApiError:
    """503: try again later (no worker serves the queue, Redis is away)."""
    return ApiError(503, message, type_="service_unavailable", code=code)


def error_for_result(status: str, code: str, message: str) -> ApiError:
    """The HTTP error of a request that ended without text: a request the worker refused
    (its input) is 400; one that expired or was cancelled, 408 and 409; anything else 500."""
    if status == "expired":
        return ApiError(408, message, type_="timeout", code=code)
    if status == "cancelled":
        return ApiError(409, message, type_="cancelled", code=code)
    if code in INPUT_ERRORS:
        return invalid(message, code=code)
    return ApiError(500, message, type_="server_error", code=code)


def _answer(err: ApiError) -> JSONResponse:
    return JSONResponse(err.body, status_code=err.status, headers=err.headers)


def install(app: FastAPI) -> None:
    """Answer every error as OpenAI's error JSON."""

    @app.exception_handler(ApiError)
    async def api_error(_: Request, err: ApiError) -> JSONResponse:
        return _answer(err)

    @app.exception_handler(PriorityDenied)
    async def priority_denied(_: Request, err: PriorityDenied) -> JSONResponse:
        denied = ApiError(403, str(err), type_="permission_error", code="priority_denied")
        return _answer(denied)

    @app.exception_handler(InvalidRequest)
    async def invalid_request(_: Request, err: InvalidRequest) -> JSONResponse:
        return _answer(invalid(str(err), code="invalid_request"))

    @app.exception_handler(BodyTooLarge)
    async def too_large(_: Request, err: BodyTooLarge) -> JSONResponse:
        return _answer(
            ApiError(413, str(err), type_="invalid_request_error", code="body_too_large")
        )

    @app.exception_handler(QueueFull)
    async def queue_full(_: Request, err: QueueFull) -> JSONResponse:
        return _answer(ApiError(429, str(err), type_="rate_limit_error", code="queue_full"))

    @app.exception_handler(SubmitFailed)
    async def submit_failed(_: Request, err: SubmitFailed) -> JSONResponse:
        return _answer(unavailable(str(err), "submit_failed"))  # e.g. Redis out of memory

    @app.exception_handler(RequestNotFound)
    async def missing(_: Request, err: RequestNotFound) -> JSONResponse:
        return _answer(not_found(str(err).strip("'\"")))

    @app.exception_handler(redis.exceptions.OutOfMemoryError)
    async def redis_full(_: Request, err: Exception) -> JSONResponse:
        log.warning("Redis refused a write: %s", err)
        message = "Redis is full (maxmemory): nothing was stored; retry later"
        return _answer(unavailable(message, "redis_full"))

    @app.exception_handler(redis.ConnectionError)
    @app.exception_handler(redis.TimeoutError)
    async def redis_away(_: Request, err: Exception) -> JSONResponse:
        log.warning("Redis is unreachable: %s", err)  # its address stays in the gateway's log
        return _answer(unavailable("Redis is unreachable: retry later", "redis_unavailable"))

    @app.exception_handler(RequestValidationError)
    async def bad_body(_: Request, err: RequestValidationError) -> JSONResponse:
        first: Any = err.errors()[0] if err.errors() else {}
        where = ".".join(str(x) for x in first.get("loc", ()))
        return _answer(invalid(f"{where}: {first.get('msg', 'invalid request')}"))

    @app.exception_handler(HTTPException)
    async def http_error(_: Request, err: HTTPException) -> JSONResponse:
        type_ = "invalid_request_error" if err.status_code < 500 else "server_error"
        return _answer(ApiError(err.status_code, str(err.detail), type_=type_))
