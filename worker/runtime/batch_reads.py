"""Reads while a static batch runs: the turn's read, off its critical path.

A static runner runs its whole batch inside the turn (``static_runner.StaticRunner.collect``), so
the loop used to read only between batches: a request that arrived during a batch was read
after it ended, and that read (a round trip, slow on a busy host or Redis) came before the
next start. Identical workers end their batches together and their reads then queue behind
each other's results: a request arriving just after their reads waited a whole batch plus
that (a tenant beside another's batch).

So while a short static batch runs (one expected under ``hand_back_after_ms``: a longer one
hands back what waits here instead) this thread reads in the loop's place: once shortly before
the batch is expected to end (the read the next turn would have made; ``LEAD_MS``) and again
whenever the doorbell rings after that (the doorbell listener's thread calls ``ring``). What
it reads is kept, not admitted: admission (tokenizing, the look-ahead) stays on the loop, at
its next turn, which then plans at once without a read of its own. The loop's state is never
touched by both threads at once: reads run only inside ``window()``, which the loop holds
while it is inside the engine, and leaving it waits for a read in flight.

The thread also calls ``exchange`` (the start spacing's exchange of phases, ``spacing.py``) as a
window opens (the batch just started: the others learn of it at once) and after its first read
(the phases the next plan uses, fresh), outside any read: the loop waits for neither.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator

from genq.common.connection import REDIS_ERRORS
from genq.common.wire import as_text
from genq.worker.runtime.read_trip import Delivered

log = logging.getLogger("genq.worker")

SHORTEST_MS = 5.0
"""A batch expected to take less than this is over before a read during it could help (a read
takes 1-5 ms): the turn reads itself, as before."""
LEAD_MS = (2.0, 10.0)
"""The least and most a batch's first read starts before the batch's expected end: late, so
that what arrived meanwhile is in it, and so that of identical busy workers the one whose batch
ends first reads first (as the reads between batches did); early enough to be done by then."""


class ReadsDuringBatch:
    """A thread that runs ``read(fetched)`` while the loop is inside a batch's ``window()``:
    once a lead before the batch's expected end, and once after each ``ring()`` from then on
    (rings during a read: one more). ``fetched``: per stream, how many entries earlier reads
    brought and the loop has not taken yet (they count against the look-ahead's room)."""

    def __init__(
        self,
        read: Callable[[dict[str, int]], Delivered] | None = None,
        exchange: Callable[[], None] | None = None,
    ) -> None:
        self.read = read
        """The read itself (``ReadAsks.beside_batch``, bound once the worker is built)."""
        self.exchange = exchange
        """Called as a window opens and after its first read (``StaggeredStarts.exchange``)."""
        self._opened = self._first = False
        self._cond = threading.Condition()
        self._open = self._wanted = self._reading = self._stopping = False
        self._got: Delivered = []
        self._covered = self._failed = False
        self._read_at = 0.0
        self._read_ms = LEAD_MS[0] / 2
        """A read's time, measured (weighted towards the latest)."""
        self.reads = 0
        """Reads made during batches, in all (the worker's own count, for tests and logs)."""
        self.taken = True
        """False from a window's opening until ``take``: whether the loop has something to
        take (read without a call: a turn with no window costs nothing here)."""
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start the thread (idempotent)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="genq-batch-reads", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """End the thread, after a read in flight."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=30)

    @contextlib.contextmanager
    def window(self, ends_in_ms: float) -> Iterator[None]:
        """The loop is inside the engine for this block, expected to take ``ends_in_ms``:
        reads may run, the first one a read's ``lead_ms`` before that end. Leaving waits for a
        read in flight, so that the loop has its state to itself again."""
        with self._cond:
            self._open, self._wanted, self.taken = True, True, False
            self._opened = self._first = self.exchange is not None
            self._covered = self._failed = False
            self._read_at = time.monotonic() + max(0.0, ends_in_ms - self.lead_ms()) / 1000
            self._cond.notify_all()
        try:
            yield
        finally:
            with self._cond:
                self._open = False
                self._cond.wait_for(lambda: not self._reading)

    def ring(self) -> None:
        """The doorbell rang (the listener's thread): read again, if a window is open."""
        with self._cond:
            if self._open:
                self._wanted = True
                self._cond.notify_all()

    def take(self) -> tuple[Delivered, bool]:
        """What the last window's reads brought (the loop admits it), and whether that window
        made its reads, none failing: then the loop need not read before its next plan."""
        with self._cond:
            got, covered = self._got, self._covered
            self._got, self._covered, self.taken = [], False, True
        return got, covered

    def entries(self) -> list[tuple[str, str]]:
        """(stream, entry id) of what was read and not yet taken (safe from any thread)."""
        with self._cond:
            return [(as_text(s), as_text(e[0])) for s, entries in self._got for e in entries]

    def lead_ms(self) -> float:
        """How long before a batch's expected end its first read starts: twice a read's
        measured time, within ``LEAD_MS``."""
        return min(max(2 * self._read_ms, LEAD_MS[0]), LEAD_MS[1])

    def _due(self) -> bool:
        """(Under the lock.) Whether a read should start now: one is wanted, in an open window,
        from its ``_read_at`` on."""
        if not (self._open and self._wanted):
            return False
        return time.monotonic() >= self._read_at

    def _run(self) -> None:
        while True:
            with self._cond:
                while not (self._stopping or self._due() or self._opened):
                    wait_s = (
                        self._read_at - time.monotonic() if self._open and self._wanted else None
                    )
                    self._cond.wait(None if wait_s is None else max(wait_s, 0.0005))
                if self._stopping:
                    return
                self._opened = False
                due = self._due()
                if due:
                    self._wanted, self._reading = False, True
                    fetched, first, self._first = self._fetched(), self._first, False
            if not due:  # (the window just opened: the exchange touches none of the loop's state)
                self._exchange()
                continue
            t0 = time.perf_counter()
            got, ok = self._read_once(fetched)
            took_ms = (time.perf_counter() - t0) * 1000
            with self._cond:
                self._read_ms += 0.3 * (took_ms - self._read_ms)
                self._reading = False
                self._got += got
                self._failed = self._failed or not ok
                self._covered = not self._failed
                self.reads += 1
                self._cond.notify_all()
            if first:
                self._exchange()

    def _fetched(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for stream, entries in self._got:
            counts[as_text(stream)] = counts.get(as_text(stream), 0) + len(entries)
        return counts

    def _exchange(self) -> None:
        try:
            if self.exchange is not None:
                self.exchange()
        except Exception:  # a bug: the thread goes on reading
            log.exception("the start spacing's exchange failed")

    def _read_once(self, fetched: dict[str, int]) -> tuple[Delivered, bool]:
        try:
            assert self.read is not None, "ReadsDuringBatch.read was never bound"
            return self.read(fetched), True
        except REDIS_ERRORS as err:  # the loop's own read, next turn, meets it and retries
            log.debug("read during a batch: %r", err)
            return [], False
        except Exception:  # not Redis: a bug; the loop reads itself, and the log says why
            log.exception("read during a batch failed; the next turn reads instead")
            return [], False
