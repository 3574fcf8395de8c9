"""Webhooks, the pure part: endpoints, OpenAI's event payload, Standard Webhooks signatures, the
retry schedule, and the owner of a final state's event (the Lua that adds it where a state
becomes final is ``genq.common.lua.hook``, run by APPLY and ``genq_cancel``). No Redis calls,
no HTTP (the gateway's ``webhook_delivery.py`` delivers).

An event is an entry of the queue's outbox (``Keys.webhook_events``), added where the state is
decided: APPLY (and ``genq_cancel``) when a ``/v1/responses`` response becomes final, or the
last open request of a batch does (the batch's ``open`` count reaches zero). Its
payload is OpenAI's: ``{"object": "event", "id": "evt_...", "type": "response.completed",
"created_at": ..., "data": {"id": "resp_..."}}`` (ids, never the generated text). Each delivery
is signed as Standard Webhooks says: headers ``webhook-id`` (the same on every retry),
``webhook-timestamp`` (Unix seconds of this attempt) and ``webhook-signature: v1,<base64 of
HMAC-SHA256(secret, "ID.TIMESTAMP.BODY")>``, where the secret is ``whsec_`` + base64.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import hmac
import json
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

import orjson
from genq.common.errors import ConfigError
from genq.common.keys import Keys

SECRET_PREFIX = "whsec_"
EVENT_PREFIX = "evt_"
RESPONSE_EVENTS = (
    "response.completed",
    "response.failed",
    "response.cancelled",
    "response.incomplete",
)
BATCH_EVENTS = ("batch.completed", "batch.failed", "batch.cancelled")
"""Batch events genq sends (OpenAI's ``batch.expired`` never: a genq batch runs as long as its
queue takes, and is kept for the result TTL)."""
GLOBAL_ENDPOINT = "*"
"""The name of the endpoint every event goes to (``genq serve --webhook-url``)."""


@dataclass(frozen=True)
class Endpoint:
    """Where events go: ``name`` is ``*`` (the gateway's own) or ``tenant:NAME``."""

    name: str
    url: str
    secret: str

    def __repr__(self) -> str:  # never the secret, in a log or a traceback
        return f"Endpoint({self.name!r}, {self.url!r})"


def check_url(url: str) -> str:
    """``url`` if it is an http(s) URL with a host, else ConfigError."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"a webhook URL must be http(s)://HOST/..., got {url!r}")
    return url


def secret_key(secret: str) -> bytes:
    """The HMAC key of a ``whsec_...`` secret; ConfigError (without the secret) if it is not
    ``whsec_`` + base64 of at least 16 bytes."""
    if not secret.startswith(SECRET_PREFIX):
        raise ConfigError("a webhook secret starts with 'whsec_' (then base64)")
    try:
        key = base64.b64decode(secret[len(SECRET_PREFIX) :], validate=True)
    except (binascii.Error, ValueError):
        raise ConfigError(
            "a webhook secret is 'whsec_' + base64: this one does not decode"
        ) from None
    if len(key) < 16:
        raise ConfigError("a webhook secret needs at least 16 bytes after 'whsec_'")
    return key


def endpoint(name: str, url: str, secret: str) -> Endpoint:
    """A checked endpoint (ConfigError naming what is wrong, never the secret)."""
    secret_key(secret)
    return Endpoint(name, check_url(url), secret)


def event_id(entry_id: str) -> str:
    """The event's id (``webhook-id``) of an outbox entry."""
    return EVENT_PREFIX + entry_id


def payload(webhook_id: str, kind: str, object_id: str, created_at_s: int) -> str:
    """The body of a delivery: OpenAI's event object, as compact JSON."""
    doc = {
        "object": "event",
        "id": webhook_id,
        "type": kind,
        "created_at": created_at_s,
        "data": {"id": object_id},
    }
    return json.dumps(doc, separators=(",", ":"))


def signed_headers(secret: str, webhook_id: str, timestamp_s: int, body: str) -> dict[str, str]:
    """The headers of one delivery attempt, signed with ``secret``."""
    signed = f"{webhook_id}.{timestamp_s}.{body}".encode()
    digest = hmac.new(secret_key(secret), signed, hashlib.sha256).digest()
    return {
        "content-type": "application/json",
        "user-agent": "genq-webhooks",
        "webhook-id": webhook_id,
        "webhook-timestamp": str(timestamp_s),
        "webhook-signature": "v1," + base64.b64encode(digest).decode(),
    }


def retry_after_s(deliveries: int, *, first_s: float, most_s: float) -> float:
    """How long after its ``deliveries``-th attempt an event is tried again: ``first_s``,
    doubling, at most ``most_s``."""
    return float(min(most_s, first_s * 2 ** max(0, deliveries - 1)))


def targets(tenant: str, own: Endpoint | None, tenants: Mapping[str, Endpoint]) -> list[Endpoint]:
    """Where an event of ``tenant`` goes: the gateway's endpoint and the tenant's own."""
    found = [own] if own is not None else []
    if tenant in tenants:
        found.append(tenants[tenant])
    return found


def batch_owner_key(keys: Keys, request_id: str, state: str) -> str | None:
    """The record a request's final state tells of (the scripts' ``hook``) when it is one of a
    batch's lines (id ``BATCH-LINE``, metadata ``batch``): its batch's; None for any other
    request, whose record is its response's (which exists only for a ``/v1/responses``
    response)."""
    with contextlib.suppress(ValueError, AttributeError, TypeError):
        batch = orjson.loads(state).get("metadata", {}).get("batch")
        if isinstance(batch, str) and request_id.startswith(batch + "-"):
            return keys.batch(batch)
    return None
