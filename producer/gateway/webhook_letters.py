"""Webhook deliveries that gave up (``Keys.webhook_dead``): list them, send them again.

A dead letter holds its event (``type``, ``id``, ``tenant``, ``webhook_id``, ``created_at``),
the endpoint that never took it, the last error and how many tries it had. Sending it again
adds the event back to the outbox for that one endpoint, with the same ``webhook-id`` (a
receiver that took it after all sees a duplicate it can recognise); the retry window starts
again from now.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from genq.common.keys import Keys
from genq.common.wire import as_text

_EVENT_FIELDS = ("type", "id", "tenant", "webhook_id", "endpoint")


@dataclass(frozen=True)
class DeadWebhook:
    """One delivery that gave up."""

    dead_id: str
    webhook_id: str
    type: str
    object_id: str
    tenant: str
    endpoint: str
    error: str
    deliveries: int


def list_dead(r: Any, keys: Keys, count: int = 100) -> list[DeadWebhook]:
    """The oldest ``count`` dead letters."""
    return from_rows(r.xrange(keys.webhook_dead, count=count))


def from_rows(rows: Any) -> list[DeadWebhook]:
    """The dead letters of an XRANGE reply (``list_dead``'s, or a pipeline's)."""
    out = []
    for entry_id, raw in rows:
        f = {as_text(k): as_text(v) for k, v in raw.items()}
        out.append(
            DeadWebhook(
                dead_id=as_text(entry_id),
                webhook_id=f.get("webhook_id", ""),
                type=f.get("type", ""),
                object_id=f.get("id", ""),
                tenant=f.get("tenant", ""),
                endpoint=f.get("endpoint", ""),
                error=f.get("error", ""),
                deliveries=int(f.get("deliveries") or 0),
            )
        )
    return out


def retry_dead(r: Any, keys: Keys, dead_ids: list[str] | None) -> list[str]:
    """Send these dead letters again (None: all of them); the ids sent."""
    entries = r.xrange(keys.webhook_dead) if dead_ids is None else _some(r, keys, dead_ids)
    sent = []
    pipe = r.pipeline(transaction=False)
    for entry_id, raw in entries:
        f = {as_text(k): as_text(v) for k, v in raw.items()}
        event = {k: f[k] for k in _EVENT_FIELDS if f.get(k)}
        event["created_at"] = str(int(time.time()))  # the retry window starts again
        pipe.xadd(keys.webhook_events, event)
        pipe.xdel(keys.webhook_dead, entry_id)
        sent.append(as_text(entry_id))
    pipe.execute()
    return sent


def _some(r: Any, keys: Keys, dead_ids: list[str]) -> list[Any]:
    found = []
    for dead_id in dead_ids:
        found += r.xrange(keys.webhook_dead, min=dead_id, max=dead_id)
    return found
