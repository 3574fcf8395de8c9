"""Webhook delivery: every ``genq serve`` delivers the queue's webhook events, at least once.

The events wait in the queue's outbox stream (``Keys.webhook_events``; APPLY adds one when a
response or a batch becomes final), read through the consumer group ``deliverers``: any live gateway
delivers, and a killed one's unacknowledged events are claimed by another once they have been
idle for their retry time. Each event goes to the gateway's endpoint (``--webhook-url``) and
its tenant's (``genq tenants set NAME --webhook-url``), signed (``common/webhooks.py``), each
endpoint on its own: an endpoint that succeeded is remembered (``Keys.webhook_done``) and not
sent the event again, a slow or dead one holds only its own deliveries (a per-delivery timeout,
a few at a time per endpoint). A failed event is tried again after ``--webhook-first-retry-s``,
doubling up to ten minutes (never while the attempt before may still run), with
the same ``webhook-id``, for ``--webhook-retry-for-s``; then it goes to the dead letters
(``Keys.webhook_dead``: ``genq webhooks list`` / ``retry``). An event with no endpoint is
dropped. The secret is never logged.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
import uuid
from typing import Any

import httpx
import redis
from genq.common import webhooks
from genq.common.connection import REDIS_ERRORS
from genq.common.keys import DEAD_LETTER_MAX_ENTRIES, WEBHOOK_GROUP, Keys
from genq.common.tenants import TenantSettings
from genq.common.wire import as_text
from genq.producer.gateway.settings import GatewaySettings

log = logging.getLogger("genq.webhooks")
logging.getLogger("httpx").setLevel(logging.WARNING)  # not a line per delivery

RETRY_SCAN_MOST_S = 2.0
"""How often, at most, the pending events are scanned for those due again: every quarter of
the first retry's wait (at least 2 x ``--webhook-timeout-s`` + 1 s: with the defaults, 21 s),
up to this. A read of new events blocks as long (an event ends it at once): an idle gateway
makes one read and one scan in that time."""
MOST_RETRY_S = 600.0
"""The longest wait between two tries of an event."""
PER_ENDPOINT = 8
"""Deliveries in flight to one endpoint at once, per gateway; an event that waits longer than
the delivery timeout for one of them waits for its retry instead, so a slow or dead endpoint
holds the gateway's room (``MOST_IN_FLIGHT``) for one timeout at most, not its backlog."""
MOST_IN_FLIGHT = 1024
"""Events in flight per gateway; beyond it new ones wait in the stream (for any gateway)."""
REDIS_AT_ONCE = 8
"""The deliveries' Redis calls in flight at once: the gateway's connection pool serves its
HTTP requests first."""
TENANTS_CACHE_S = 1.0


class Deliverer:
    """One gateway's share of the queue's webhook deliveries (``run`` until cancelled)."""

    def __init__(self, r: Any, keys: Keys, settings: GatewaySettings) -> None:
        self.redis = r
        self.keys = keys
        self.settings = settings
        self.own = (
            webhooks.endpoint(
                webhooks.GLOBAL_ENDPOINT, settings.webhook_url, settings.webhook_secret
            )
            if settings.webhook_url or settings.webhook_secret
            else None
        )
        self.consumer = f"gw-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.http = httpx.AsyncClient(timeout=settings.webhook_timeout_s, follow_redirects=False)
        self._in_flight: dict[str, asyncio.Task[None]] = {}
        self._limits: dict[str, asyncio.Semaphore] = {}
        self._redis_slots = asyncio.Semaphore(REDIS_AT_ONCE)
        self._tenants_lock = asyncio.Lock()
        self._tenants: dict[str, webhooks.Endpoint] = {}
        self._tenants_read_s = 0.0
        self._last_scan_s = 0.0
        self.delivered = 0
        """Deliveries that succeeded (for logs and benchmarks)."""

    async def run(self) -> None:
        """Deliver until cancelled; Redis away: wait and go on."""
        joined = False
        while True:
            try:
                if not joined:
                    await self._join()
                    joined = True
                await self._turn()
            except asyncio.CancelledError:
                raise
            except REDIS_ERRORS as err:
                log.warning("webhook delivery: Redis: %s", err)
                joined = False  # a Redis that lost the outbox (NOGROUP): make its group again
                await asyncio.sleep(1.0)

    async def close(self) -> None:
        """Stop the deliveries in flight (their events stay pending for any gateway)."""
        for task in list(self._in_flight.values()):
            task.cancel()
        await self.http.aclose()

    async def _join(self) -> None:
        try:
            await self.redis.xgroup_create(
                self.keys.webhook_events, WEBHOOK_GROUP, id="0", mkstream=True
            )
        except redis.ResponseError as err:
            if "BUSYGROUP" not in str(err):
                raise

    async def _turn(self) -> None:
        room = MOST_IN_FLIGHT - len(self._in_flight)
        if room > 0:
            reply = await self.redis.xreadgroup(
                WEBHOOK_GROUP,
                self.consumer,
                {self.keys.webhook_events: ">"},
                count=min(room, 64),
                block=int(self._scan_s() * 1000),
            )
            for entry_id, fields in _entries(reply):
                self._start(entry_id, fields, deliveries=1)
        else:
            await asyncio.sleep(self._scan_s())
        if time.monotonic() - self._last_scan_s >= self._scan_s():
            self._last_scan_s = time.monotonic()
            await self._retry_due()

    def _scan_s(self) -> float:
        """How often the retry scan runs (``RETRY_SCAN_MOST_S``)."""
        return min(RETRY_SCAN_MOST_S, self._due_after_ms(1) / 4000)

    def _due_after_ms(self, deliveries: int) -> int:
        """How long after its last try an event that was tried ``deliveries`` times is due:
        the backoff, and never before an attempt that may still run is over (a wait for a
        slot and the post: a timeout each)."""
        s = self.settings
        wait = webhooks.retry_after_s(
            deliveries, first_s=s.webhook_first_retry_s, most_s=MOST_RETRY_S
        )
        return int(max(wait, 2 * s.webhook_timeout_s + 1.0) * 1000)

    async def _retry_due(self) -> None:
        """Claim the pending events whose retry time has come (this gateway's, or a dead
        one's) and try them again."""
        rows = await self.redis.xpending_range(
            self.keys.webhook_events,
            WEBHOOK_GROUP,
            min="-",
            max="+",
            count=MOST_IN_FLIGHT,
            idle=self._due_after_ms(1),
        )
        for row in rows:
            entry_id = as_text(row["message_id"])
            if entry_id in self._in_flight or len(self._in_flight) >= MOST_IN_FLIGHT:
                continue
            due_ms = self._due_after_ms(int(row["times_delivered"]))
            if int(row["time_since_delivered"]) < due_ms:
                continue
            claimed = await self.redis.xclaim(
                self.keys.webhook_events, WEBHOOK_GROUP, self.consumer, due_ms, [entry_id]
            )
            for claimed_id, fields in _entries([[self.keys.webhook_events, claimed]]):
                self._start(claimed_id, fields, deliveries=int(row["times_delivered"]) + 1)

    def _start(self, entry_id: str, fields: dict[str, str], deliveries: int) -> None:
        if not fields:  # deleted meanwhile (delivered by another gateway)
            return
        task = asyncio.create_task(self._deliver(entry_id, fields, deliveries))
        self._in_flight[entry_id] = task
        task.add_done_callback(lambda _t: self._in_flight.pop(entry_id, None))

    async def _tenant_endpoints(self) -> dict[str, webhooks.Endpoint]:
        async with self._tenants_lock:  # one read per refresh, however many events wait
            if time.monotonic() - self._tenants_read_s >= TENANTS_CACHE_S:
                await self._read_tenants()
        return self._tenants

    async def _read_tenants(self) -> None:
        found = {}
        async with self._redis_slots:
            stored = await self.redis.hgetall(self.keys.tenants) or {}
            secrets = await self.redis.hgetall(self.keys.webhook_secrets) or {}
        secret_of = {as_text(k): as_text(v) for k, v in secrets.items()}
        for name, raw in stored.items():
            with contextlib.suppress(Exception):  # an unreadable entry: no webhook
                tenant = as_text(name)
                hook = TenantSettings.from_json(raw).webhook(tenant, secret_of.get(tenant, ""))
                if hook is not None:
                    found[tenant] = hook
        self._tenants, self._tenants_read_s = found, time.monotonic()

    async def _deliver(self, entry_id: str, fields: dict[str, str], deliveries: int) -> None:
        """``_send``, whose failure leaves the event pending: it is tried again when due."""
        try:
            await self._send(entry_id, fields, deliveries)
        except asyncio.CancelledError:
            raise
        except Exception as err:  # Redis away, a bug: the event stays pending, not lost
            log.warning("webhook event %s: %s (it will be tried again)", entry_id, err)

    async def _send(self, entry_id: str, fields: dict[str, str], deliveries: int) -> None:
        """Send one event to each of its endpoints not yet done; acknowledge it when every
        one has it, or it is too old to try again (those that never took it: dead letters)."""
        tenant = fields.get("tenant", "default")
        endpoints = webhooks.targets(tenant, self.own, await self._tenant_endpoints())
        only = fields.get("endpoint")
        if only:  # a dead letter sent again, for its one endpoint
            endpoints = [e for e in endpoints if e.name == only]
        marks = [f"{entry_id} {e.name}" for e in endpoints]
        async with self._redis_slots:
            done = await self.redis.hmget(self.keys.webhook_done, marks) if marks else []
        todo = [e for e, d in zip(endpoints, done, strict=True) if d is None]
        webhook_id = fields.get("webhook_id") or webhooks.event_id(entry_id)
        created_s = int(fields.get("created_at") or int(entry_id.split("-")[0]) // 1000)
        body = webhooks.payload(webhook_id, fields.get("type", ""), fields.get("id", ""), created_s)
        failures = await asyncio.gather(*(self._post(e, webhook_id, body) for e in todo))
        failed = [(e, why) for e, why in zip(todo, failures, strict=True) if why is not None]
        give_up = time.time() - created_s >= self.settings.webhook_retry_for_s
        # In this order, not as a transaction (the documented ACL has no MULTI): a crash
        # midway leaves the event pending, and it is delivered again (at least once).
        pipe = self.redis.pipeline(transaction=False)
        for e, why in zip(todo, failures, strict=True):
            if why is None:
                pipe.hset(self.keys.webhook_done, f"{entry_id} {e.name}", 1)
        if not failed or give_up:
            for e, why in failed:
                record = {**fields, "webhook_id": webhook_id, "created_at": created_s}
                record.update(endpoint=e.name, error=why or "", deliveries=deliveries)
                pipe.xadd(self.keys.webhook_dead, record, maxlen=DEAD_LETTER_MAX_ENTRIES)
                log.warning(
                    "webhook %s to %s gave up after %d tries", webhook_id, e.name, deliveries
                )
            pipe.xack(self.keys.webhook_events, WEBHOOK_GROUP, entry_id)
            pipe.xdel(self.keys.webhook_events, entry_id)
            if marks:
                pipe.hdel(self.keys.webhook_done, *marks)
        async with self._redis_slots:
            await pipe.execute()

    async def _post(self, target: webhooks.Endpoint, webhook_id: str, body: str) -> str | None:
        """One delivery attempt: None if the endpoint took it (a 2xx), else why not."""
        limit = self._limits.setdefault(target.name, asyncio.Semaphore(PER_ENDPOINT))
        try:  # a slow or dead endpoint: its event waits for a retry, not here
            await asyncio.wait_for(limit.acquire(), self.settings.webhook_timeout_s)
        except TimeoutError:
            return (
                f"{PER_ENDPOINT} deliveries to it in flight for {self.settings.webhook_timeout_s} s"
            )
        try:
            headers = webhooks.signed_headers(target.secret, webhook_id, int(time.time()), body)
            reply = await self.http.post(target.url, content=body, headers=headers)
        except httpx.HTTPError as err:
            return f"{type(err).__name__}: {err}"[:300]
        finally:
            limit.release()
        if 200 <= reply.status_code < 300:
            self.delivered += 1
            return None
        return f"HTTP {reply.status_code}"


def _entries(reply: Any) -> list[tuple[str, dict[str, str]]]:
    """An XREADGROUP/XCLAIM reply as (entry id, fields as text)."""
    if isinstance(reply, dict):  # RESP3
        reply = list(reply.items())
    out = []
    for _stream, found in reply or []:
        for entry_id, fields in found:
            text = {as_text(k): as_text(v) for k, v in (fields or {}).items()}
            out.append((as_text(entry_id), text))
    return out
