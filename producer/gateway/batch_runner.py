"""The gateway's part in running wave batches (``BatchRunner``): a loop that runs the rounds of
the queue's running batches (``Keys.batches_running``: fed as the queue drains, results written
to the file store as they end; ``batch_waves.py``). Every gateway runs one; a batch's lease
gives its rounds to one process at a time, and another takes over within ``LEASE_MS`` when that
one dies. Rounds are blocking Redis and store I/O: they run in a thread, off the event loop."""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import Any

from genq.common.errors import GenqError
from genq.common.wire import as_text
from genq.producer.client import Client
from genq.producer.gateway import batch_waves
from genq.producer.gateway.file_store import FileStore
from starlette.concurrency import run_in_threadpool

log = logging.getLogger(__name__)

IDLE_S = 0.5
"""Pause between rounds when no batch had anything to do."""


class BatchRunner:
    """Runs the rounds of the queue's running batches while the gateway serves."""

    def __init__(self, client: Client, files: FileStore, queue_redis: Any) -> None:
        self.client, self.files = client, files
        self.queue_redis = queue_redis
        """The gateway's asyncio connection: an idle gateway asks it whether any batch runs
        (SMEMBERS, which its documented ACL user has), with no thread hop, twice a second."""
        self.owner = f"gateway-{uuid.uuid4().hex[:12]}"
        self._warned: set[str] = set()

    async def run(self) -> None:
        while True:
            try:  # (the rounds block: a thread; whether any batch runs, asked on the loop)
                members = await self.queue_redis.smembers(self.client.keys.batches_running)
                busy = bool(members) and await run_in_threadpool(self.turn, members)
            except Exception as err:  # Redis away, say: the next turn tries again
                log.warning("batch rounds: %s", err)
                busy = False
            await asyncio.sleep(0 if busy else IDLE_S)

    def turn(self, members: Any) -> bool:
        """One round of each of these running batches (``Keys.batches_running``' members) this
        gateway may run; whether any did work."""
        busy = False
        for batch_id in sorted(as_text(m) for m in members):
            try:
                done = batch_waves.run_round(self.client, self.files, batch_id, self.owner)
            except GenqError as err:  # its store is not ours, or away: said once per batch
                if batch_id not in self._warned:
                    self._warned.add(batch_id)
                    log.warning("batch %s: %s", batch_id, err)
                continue
            busy = busy or bool(done and (done.fed or done.written))
        return busy

    def release(self) -> None:
        """Give up the leases this gateway holds (at shutdown: another takes over at once)."""
        members: Any = self.client.redis.smembers(self.client.keys.batches_running)
        for batch_id in (as_text(m) for m in members):
            lease = self.client.keys.batch_lease(batch_id)
            if as_text(self.client.redis.get(lease) or "") == self.owner:
                self.client.redis.delete(lease)
