"""What the gateway refuses before any route runs (``Guards``, a pure ASGI middleware), against
browsers used as a weapon:

- **Cross-site writes.** A request that changes anything (any method but GET, HEAD, OPTIONS)
  sent by a page of another site: ``Sec-Fetch-Site: cross-site``, or an ``Origin`` whose host
  is not the ``Host`` it was sent to. (A browser lets any page POST ``text/plain`` anywhere
  without asking; with no keys configured, that would be a stranger's chat on your fleet.)
- **Bodies that are not JSON** on the JSON routes (every ``/v1/`` write but the upload): 415.
  Browsers cannot send ``application/json`` across sites without a preflight genq never
  answers.
- **Foreign host names on an open gateway** (no keys, ``--insecure-open`` not given): only
  loopback names (``localhost``, ``127.0.0.1``, ``[::1]``), so a DNS-rebinding page whose
  name resolves to 127.0.0.1 reaches nothing.
"""

from __future__ import annotations

import ipaddress
from typing import Any
from urllib.parse import urlsplit

from genq.producer.gateway.body_limit import send_refusal

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
UPLOAD_PATH = "/v1/files"
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1", "[::1]"})


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or address, as ``--host`` takes it) is this machine only."""
    if host.strip("[]") in LOOPBACK_NAMES or host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _host_name(host: str) -> str:
    """A ``Host`` header's name, without its port."""
    if host.startswith("["):
        return host[: host.find("]") + 1]
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def problem(
    method: str, path: str, headers: dict[bytes, bytes], *, open_gateway: bool
) -> tuple[int, str] | None:
    """Why the request is refused (status, message), or None (a pure function)."""
    host = headers.get(b"host", b"").decode("latin-1")
    if open_gateway and not is_loopback(_host_name(host)):
        return 403, (
            f"this gateway has no keys, so it answers only to loopback host names, not {host!r} "
            "(give genq serve --api-key, or --insecure-open behind your own authentication)"
        )
    if method in SAFE_METHODS:
        return None
    if headers.get(b"sec-fetch-site", b"").decode("latin-1") == "cross-site":
        return 403, "a cross-site request may not change anything here"
    origin = headers.get(b"origin")
    if origin is not None and origin != b"null":
        if urlsplit(origin.decode("latin-1")).netloc != host:
            return 403, "a request from another origin may not change anything here"
    elif origin == b"null":
        return 403, "a request from an opaque origin may not change anything here"
    if path.startswith("/v1/") and path.rstrip("/") != UPLOAD_PATH and _has_body(headers):
        kind = headers.get(b"content-type", b"").split(b";")[0].strip().lower()
        if kind != b"application/json":
            return 415, (
                f"send the body as JSON with 'Content-Type: application/json' (got "
                f"{kind.decode('latin-1') or 'none'!r})"
            )
    return None


def _has_body(headers: dict[bytes, bytes]) -> bool:
    length = headers.get(b"content-length")
    return b"transfer-encoding" in headers or (length is not None and length.strip() != b"0")


class Guards:
    """Answers what ``problem`` refuses with OpenAI's error JSON; the rest goes on."""

    def __init__(self, app: Any, open_gateway: bool) -> None:
        self.app = app
        self.open_gateway = open_gateway

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.lower(): v for k, v in scope.get("headers") or ()}
        found = problem(scope["method"], scope["path"], headers, open_gateway=self.open_gateway)
        if found is None:
            await self.app(scope, receive, send)
            return
        await send_refusal(send, *found, "refused")
