"""The gateway's bound on request bodies (``BodyLimit``), counted as the bytes arrive: a body
that says it is too big (``Content-Length``) is refused before any of it is read, and one that
turns out too big (chunked, or lying) is refused as soon as it passes the limit, so no body
over it is ever held whole in the gateway's memory. A pure ASGI middleware."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

UPLOAD_PATH = "/v1/files"
MULTIPART_SLACK_BYTES = 1 << 20
"""What an upload may carry beyond its file (the multipart framing and its small fields)."""


class BodyTooLarge(Exception):
    """A request's body passed its limit (answered 413)."""

    def __init__(self, limit: int, setting: str) -> None:
        super().__init__(
            f"the request body is over {limit} bytes (genq serve {setting}): send less"
        )
        self.limit = limit


def limit_for(max_body_bytes: int, max_file_bytes: int) -> Callable[[str], tuple[int, str]]:
    """The body limit of a path and the setting that sets it: uploads are files (plus their
    multipart framing); every other route is JSON."""

    def limit(path: str) -> tuple[int, str]:
        if path.rstrip("/") == UPLOAD_PATH:
            return max_file_bytes + MULTIPART_SLACK_BYTES, "--max-file-bytes"
        return max_body_bytes, "--max-body-bytes"

    return limit


class BodyLimit:
    """Refuses a body over ``limit(path)`` bytes: at once if its ``Content-Length`` says so,
    else with ``BodyTooLarge`` raised from ``receive`` when the bytes read pass it (the route
    that reads it answers 413 through the app's error handler)."""

    def __init__(self, app: Any, limit: Callable[[str], tuple[int, str]]) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit, setting = self.limit(scope["path"])
        declared = dict(scope.get("headers") or ()).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            await send_refusal(send, 413, str(BodyTooLarge(limit, setting)), "body_too_large")
            return
        seen = 0

        async def counted() -> dict[str, Any]:
            nonlocal seen
            message: dict[str, Any] = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise BodyTooLarge(limit, setting)
            return message

        await self.app(scope, counted, send)


async def send_refusal(send: Any, status: int, message: str, code: str) -> None:
    """Answer an HTTP request with OpenAI's error JSON before the app sees it (the ASGI
    middlewares' refusals)."""
    error = {"message": message, "type": "invalid_request_error", "param": None, "code": code}
    body = json.dumps({"error": error}).encode()
    head = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": status, "headers": head})
    await send({"type": "http.response.body", "body": body})
