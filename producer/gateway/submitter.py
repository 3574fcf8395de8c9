"""The gateway's submissions, gathered (``Submitter``): the requests its routes submit within one
turn of the event loop go to Redis together, one SUBMIT call per tenant (all pipelined in one
round trip), instead of one call each.

Under a flood (thousands of requests arriving at once) one call per request made every request
wait for a pool connection and a round trip of its own, and another tenant's request waited in
that line too; gathered, 5,000 arrivals are a few dozen calls. A call is all or nothing (a full
queue refuses all of it), so each tenant's requests go in their own call: one tenant's refusal
is never another's. A request alone costs what it did, plus one turn of the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence

from genq.common.errors import GenqError
from genq.common.models import Request
from genq.producer.aio import AsyncClient

MAX_PER_CALL = 256
"""Most requests of one tenant in one SUBMIT call."""


class Submitter:
    """Gathers the submissions of one turn of the event loop, by tenant."""

    def __init__(self, client: AsyncClient) -> None:
        self._client = client
        self._pending: dict[str, list[tuple[Request, asyncio.Future[str]]]] = {}
        self._scheduled = False
        self._sending: set[asyncio.Task[None]] = set()

    async def submit(self, request: Request) -> str:
        """Enqueue ``request`` (with the others of this turn); its id. Raises what the client's
        ``submit_requests`` raises (QueueFull, SubmitFailed, a Redis error)."""
        future: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._pending.setdefault(request.tenant, []).append((request, future))
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)
        return await future

    def _flush(self) -> None:
        self._scheduled = False
        pending, self._pending = self._pending, {}
        for items in pending.values():
            for i in range(0, len(items), MAX_PER_CALL):
                task = asyncio.create_task(self._send(items[i : i + MAX_PER_CALL]))
                self._sending.add(task)
                task.add_done_callback(self._sending.discard)

    async def _send(self, items: Sequence[tuple[Request, asyncio.Future[str]]]) -> None:
        try:
            ids = await self._client.submit_requests([r for r, _ in items])
        except Exception as err:  # every waiting route answers it (QueueFull: 429, ...)
            for _, future in items:
                if not future.done():
                    future.set_exception(err)
            return
        for request_id, (_, future) in zip(ids, items, strict=True):
            if not future.done():
                future.set_result(request_id)
            else:  # its route went away while it was sent: nobody waits for it
                await self._cancel(request_id)

    async def _cancel(self, request_id: str) -> None:
        with contextlib.suppress(GenqError, OSError):
            await self._client.cancel(request_id)

    async def close(self) -> None:
        """Wait for the calls in flight."""
        if self._sending:
            await asyncio.gather(*self._sending, return_exceptions=True)
