"""The worker's signals. SIGTERM and SIGINT stop it (drain what it holds, then exit; a second
signal exits at once), and cut short the one wait that may block long: an idle worker's wait
on the doorbell (``interruptible``), so that a worker blocked for ``--read-block-ms`` still
stops at once.

How: while the main thread is inside ``interruptible``, the handler raises ``Interrupted``
there, which ends the blocked read (redis-py drops that connection; the next command opens
another). Python runs signal handlers in the main thread only, so a worker run in another
thread (tests, embedding) never blocks longer than ``MAX_BLOCK_MS`` instead.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import TypeVar

from genq.common.connection import MAX_BLOCK_MS

log = logging.getLogger("genq.worker")
T = TypeVar("T")

_blocking = False
"""Whether the main thread is inside ``interruptible`` (the handler's cue to raise)."""
_stopped = False
"""Whether a stop signal came (a wait that begins after it does not block)."""


class Interrupted(Exception):
    """Raised by the stop signal's handler inside ``interruptible``."""


def install_signal_handlers(stop: Callable[[], None]) -> None:
    """SIGTERM and SIGINT call ``stop`` (drain, then exit), and end a wait inside
    ``interruptible``; a second signal exits at once, leaving held entries pending for other
    workers. Only in the main thread."""
    if threading.current_thread() is not threading.main_thread():
        return
    signals = 0

    def on_signal(signum: int, frame: FrameType | None) -> None:
        nonlocal signals
        signals += 1
        if signals > 1:
            log.warning("second signal: exiting now; held entries stay pending")
            os._exit(1)
        log.info("signal %d: finishing held work, then exiting", signum)
        global _stopped
        _stopped = True
        stop()
        if _blocking:
            raise Interrupted

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)


def longest_block_ms(block_ms: int) -> int:
    """How long a wait inside ``interruptible`` may block: ``block_ms`` in the main thread
    (a signal ends it), else at most ``MAX_BLOCK_MS`` (nothing would)."""
    if threading.current_thread() is threading.main_thread():
        return block_ms
    return min(block_ms, MAX_BLOCK_MS)


def interruptible(wait: Callable[[], T]) -> T | None:
    """``wait()``, or None if a stop signal came meanwhile (or before)."""
    global _blocking
    try:
        try:
            _blocking = True
            if _stopped:  # (after the flag: a signal now raises, one before is seen here)
                return None
            return wait()
        finally:
            _blocking = False
    except Interrupted:
        _blocking = False  # (the signal may have come inside the finally above)
        return None
