"""The result writer: final results go to Redis from a thread of their own.

The loop hands each batch's outcomes to the writer and goes on to the next batch (reading,
marking it running, generating) while Redis runs the last batch's writes; nothing waits for
Redis that does not have to. What stays the same as writing in the loop:

- no entry is acknowledged without its result: the writes are the same APPLY calls;
- an outcome stays with the writer until Redis has taken it, so the ClaimKeeper keeps renewing
  its entry and the loop does not admit it twice (both ask ``entries``); while Redis is away
  the writer retries with backoff, in order, and the outcomes wait;
- the loop cannot run ahead without bound: ``put`` blocks while more than ``max_backlog``
  outcomes wait;
- an error that is not Redis being away (a script error, Redis refusing writes when out of
  memory) stops the writer and is raised in the loop by its next ``put`` or ``check``;
- counters are updated by the loop, never by this thread: it collects ``take_written``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Generic, Protocol, TypeVar

import redis
from genq.common.connection import TRANSIENT_ERRORS

PASSING: tuple[type[Exception], ...] = (*TRANSIENT_ERRORS, redis.exceptions.OutOfMemoryError)
"""Errors the writer waits out, holding its results: Redis away, or full (noeviction)."""
log = logging.getLogger("genq.worker")


class Written(Protocol):
    """What the writer needs of an outcome: the entry it acknowledges."""

    stream: str
    entry_id: str


T = TypeVar("T", bound=Written)

BACKOFF_START_S = 0.1
BACKOFF_MAX_S = 5.0


class ResultWriter(Generic[T]):
    """Runs ``write(outcomes) -> answers`` in a thread, over everything waiting at once.
    ``on_away()`` runs after each failed try while Redis is away (to refresh a Cluster view)."""

    def __init__(
        self,
        write: Callable[[list[T]], Sequence[int]],
        max_backlog: int,
        on_away: Callable[[], None] = lambda: None,
    ) -> None:
        self._write = write
        self._on_away = on_away
        self.max_backlog = max(1, max_backlog)
        self._waiting: list[T] = []  # in order; the head may be being written
        self._written: deque[tuple[list[T], list[int]]] = deque()
        self._cond = threading.Condition()
        self._stopping = False
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="genq-writer", daemon=True)
        self._thread.start()

    # -- the loop's side -------------------------------------------------------------------

    def put(self, outcomes: Sequence[T]) -> None:
        """Queue ``outcomes`` for writing; wait while the backlog is over ``max_backlog``.
        Raises the error that stopped the writer, if one did (``check``)."""
        with self._cond:
            if self._error is None:
                self._waiting.extend(outcomes)
                self._cond.notify_all()
            while len(self._waiting) > self.max_backlog and self._error is None:
                self._cond.wait(0.5)
        if self._error is not None:
            raise self._error

    def check(self) -> None:
        """Raise the error that stopped the writer, if one did."""
        if self._error is not None:
            raise self._error

    def take_written(self) -> list[tuple[list[T], list[int]]]:
        """The batches written since the last call, with the script's answer per outcome."""
        out = []
        while self._written:
            out.append(self._written.popleft())
        return out

    def entries(self) -> list[tuple[str, str]]:
        """(stream, entry id) of every outcome waiting to be written."""
        with self._cond:
            return [(o.stream, o.entry_id) for o in self._waiting]

    def __len__(self) -> int:
        return len(self._waiting)

    def flush(self, timeout_s: float) -> bool:
        """Wait until everything queued is written (True) or ``timeout_s`` passed (False)."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self._waiting and self._error is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(min(left, 0.5))
        self.check()
        return True

    def stop(self) -> None:
        """Stop the thread (what is still waiting stays pending in Redis)."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._thread.join(timeout=10)

    # -- the thread ------------------------------------------------------------------------

    def _run(self) -> None:
        delay = BACKOFF_START_S
        while True:
            with self._cond:
                while not self._waiting and not self._stopping:
                    self._cond.wait()
                if self._stopping:
                    return
                batch = list(self._waiting)
            try:
                answers = list(self._write(batch))
            except PASSING as err:
                if not isinstance(err, redis.exceptions.OutOfMemoryError):
                    log.warning(
                        "Redis unreachable writing results (%s); retrying in %.1f s", err, delay
                    )
                elif delay == BACKOFF_START_S:  # once per episode: the loop says more
                    log.warning("holding %d results until Redis has room for them", len(batch))
                self._on_away()
                with self._cond:
                    self._cond.wait_for(lambda: self._stopping, timeout=delay)
                delay = min(BACKOFF_MAX_S, delay * 2)
                continue
            except BaseException as err:
                log.error("writing results failed: %r", err)
                with self._cond:
                    self._error = err
                    self._cond.notify_all()
                return
            delay = BACKOFF_START_S
            self._written.append((batch, answers))
            with self._cond:
                del self._waiting[: len(batch)]
                self._cond.notify_all()
