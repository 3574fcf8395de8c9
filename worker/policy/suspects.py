"""The suspect gate: when a request delivered before may start, and what may start beside it.

A request delivered more than once (a *suspect*) was held by a worker that died: it may be the
request that kills workers. So:

- it runs alone: it starts only when nothing is running, and nothing starts while it runs;
- it starts only once every result already computed is written (``FLUSH_FIRST``), and so does
  the batch after it: a crash must not take finished results with it, or their requests would
  be started again and counted towards poison.

Pure: the caller says what is running and whether a suspect waits; the gate remembers only
whether the last start was a suspect's.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Gate(Enum):
    """What the next start must wait for."""

    OPEN = "open"
    """Start as the batching policy says."""
    FLUSH_FIRST = "flush_first"
    """Start only once the writer has written everything handed to it."""
    CLOSED = "closed"
    """Start nothing this turn."""


@dataclass(kw_only=True)
class SuspectGate:
    """Remembers whether the last start was a suspect's (the start after it flushes too)."""

    after_suspect: bool = False

    def check(self, *, suspect_waiting: bool, running: int, suspect_running: bool) -> Gate:
        """The gate for the next start."""
        if suspect_running or (suspect_waiting and running):
            return Gate.CLOSED
        if suspect_waiting or self.after_suspect:
            return Gate.FLUSH_FIRST
        return Gate.OPEN

    def passed(self, *, suspect: bool) -> None:
        """The writer was flushed and a start goes ahead (``suspect``: the suspect's own)."""
        self.after_suspect = suspect
