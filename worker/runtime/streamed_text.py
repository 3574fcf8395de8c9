"""Streamed text: the pieces of streaming requests go to their event streams from a thread of
their own, many in one round trip.

An engine hands each streaming request's new text to ``add`` as it decodes it: on the loop's
thread, for every request of the batch, once a decode step. Sending each piece at once was one
round trip per request per step (32 streaming requests: 32 round trips a step on the loop's
thread, and as many wake-ups of each gateway's reader, which then read one piece at a time).
Here ``add`` only queues the piece; the sender's thread sends whatever is queued when it gets
to run, which is when the loop's thread lets go of the interpreter: after the step's pieces
are all queued. So a step's pieces go in one pipeline, and a reader blocked on their streams
wakes once for them.

What does not change:

- a request's pieces reach its event stream in order, and all of them before its final event:
  the result writer calls ``flush`` before each write, and a piece is queued before the
  request's outcome reaches the writer (both happen on the loop's thread, in that order);
- while Redis is away the pieces wait and go in order when it is back (the writer's ``flush``
  then fails too, so its final write waits as well);
- pieces of one request queued while a send is in flight go in the next send as one piece
  (their text joined): a delta is any piece of text, and the pieces still add up to the
  result's text.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable

from genq.common.keys import Keys
from genq.common.wire import encode_delta_event

log = logging.getLogger("genq.worker")

TTL_MEMORY = 4096
"""How many requests the sender remembers having set the TTL of (their event stream's, set with
a request's first piece and again once half of it has passed, not with every piece); past it,
it forgets them all, and each one streaming then gets one EXPIRE more."""
RETRY_PAUSE_S = 0.2
"""The sender's pause after a send failed (Redis away or full), before it tries again; the
pieces stay queued. (A failure that is not Redis being away reaches the loop through the
result writer, whose ``flush`` meets it too.)"""


class TextSender:
    """Queues streamed pieces (``add``) and sends them from a thread, many per round trip.
    ``pipeline()`` gives a fresh redis-py pipeline: a transaction, so that a gateway's reader
    blocked on the pieces' streams wakes once for them all, except on a Redis Cluster (the
    event streams of a step's requests live in different slots)."""

    def __init__(self, pipeline: Callable[[], object], keys: Keys, ttl_s: int) -> None:
        self._pipeline = pipeline
        self._keys = keys
        self._ttl_s = ttl_s
        self._pending: dict[str, list[str]] = {}  # request id -> pieces (dicts keep order)
        self._ttl_set: dict[str, float] = {}  # request id -> when its TTL was set (monotonic)
        self._cond = threading.Condition()
        self._sending = threading.Lock()  # one send at a time: pieces go in the order queued
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="genq-text", daemon=True)
        self._thread.start()

    def add(self, request_id: str, text: str) -> None:
        """Queue a piece of ``request_id``'s streamed text (the loop's thread)."""
        with self._cond:
            self._pending.setdefault(request_id, []).append(text)
            self._cond.notify()

    def flush(self) -> None:
        """Send every piece queued so far, now (the result writer's thread, before it writes
        final events). Raises what Redis raised; the pieces stay queued then."""
        with self._sending:
            with self._cond:
                batch, self._pending = self._pending, {}
            if not batch:
                return
            try:
                self._send(batch)
            except BaseException:
                with self._cond:  # back in front, in order, joined with what came since
                    for request_id, pieces in self._pending.items():
                        batch.setdefault(request_id, []).extend(pieces)
                    self._pending = batch
                raise

    def _send(self, batch: dict[str, list[str]]) -> None:
        """One round trip (under ``_sending``: ``_ttl_set`` is this lock's too)."""
        now, renewed = time.monotonic(), []
        if len(self._ttl_set) > TTL_MEMORY:
            self._ttl_set.clear()
        pipe = self._pipeline()
        for request_id, pieces in batch.items():
            events = self._keys.events(request_id)
            pipe.xadd(events, encode_delta_event("".join(pieces)))  # type: ignore[attr-defined]
            if now - self._ttl_set.get(request_id, -math.inf) > self._ttl_s / 2:
                pipe.expire(events, self._ttl_s)  # type: ignore[attr-defined]
                renewed.append(request_id)
        pipe.execute()  # type: ignore[attr-defined]
        self._ttl_set.update(dict.fromkeys(renewed, now))

    def __len__(self) -> int:
        """Requests with pieces waiting to be sent."""
        return len(self._pending)

    def stop(self) -> None:
        """Send what is queued (if Redis takes it), then end the thread."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._thread.join(timeout=10)
        try:
            self.flush()
        except Exception as err:  # the worker stops anyway: its other parts stop after this
            log.warning("streamed text of %d requests not sent: %r", len(self), err)

    def _run(self) -> None:
        failing = False
        while True:
            with self._cond:
                while not self._pending and not self._stopping:
                    self._cond.wait()
                if self._stopping:
                    return
            try:
                self.flush()
                failing = False
            except Exception as err:  # kept; the writer's flush meets it too
                if not failing:  # once an episode: the writer's own path says the rest
                    log.warning("streamed text waits: sending it failed (%r); retrying", err)
                failing = True
                with self._cond:
                    self._cond.wait_for(lambda: self._stopping, timeout=RETRY_PAUSE_S)
