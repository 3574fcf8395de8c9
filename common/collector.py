"""A server process's garbage collector, settled once the process is built (``genq worker``
once its engine and parts are, ``genq serve`` and ``genq dashboard`` once their app is).

Each request makes short-lived objects (its decoded body, its held entry, its outcome; at the
gateway its HTTP request, its models, its tasks), and hundreds of them live at once. With
Python's default thresholds the collector ran about 300 young and 2 full passes per 20,000 echo
requests in a worker, each full pass walking every object the imports and the model made:
0.15-0.25 s of the worker's ~2 s of CPU in ``benchmarks/queue_speed.py`` (counted with
``gc.callbacks``, BENCHMARKS.md). ``settle_collector`` moves what start-up made
out of the collector's sight (``gc.freeze``: those objects live as long as the process) and
lets the young generation grow to ``YOUNG_THRESHOLD`` objects before a pass, as serving engines
do once they are up (vLLM freezes its heap after start-up). Reference counting still frees
what is not in a cycle at once; cycles are found as before, in fewer passes.

A process-wide setting: the commands call it, not ``Worker.run`` or ``create_app`` (a worker
or an app run inside another program, as in tests, leaves that program's collector alone).

The client library cannot settle its host's collector; it pauses it instead (``paused``) for
the moment it decodes a round of results, which it keeps: with the default thresholds the
passes during ``Client.results`` walked every result decoded before, about as much CPU as the
decoding itself (BENCHMARKS.md).
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

YOUNG_THRESHOLD = 10_000
"""Objects allocated (less those freed) before a young-generation pass (Python's default:
700). The older generations keep their default multipliers (every 10 passes of the one
below)."""


def settle_collector() -> None:
    """Free start-up's garbage, freeze what is left and raise the young generation's
    threshold (see above)."""
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, older, oldest)


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """No collector passes inside: for a short loop that builds objects it keeps (a round of
    decoded results, in no cycle). Objects allocated meanwhile still count: the first pass
    after it comes at once if they passed the threshold. Leaves a collector that was off
    alone. Process-wide, like the collector: another thread's (or, around an ``await``,
    another coroutine's) allocations are not collected inside either, so the clients never
    hold it across a read that blocks."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
