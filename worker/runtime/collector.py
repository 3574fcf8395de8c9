"""The worker process's garbage collector, settled once its engine and parts are built.

Each request makes short-lived objects (its decoded body, its held entry, its outcome), and
a few hundred of them live at once in the look-ahead. With Python's default thresholds the
collector ran about 300 young and 2 full passes per 20,000 echo requests, each full pass
walking every object the imports and the model made: about 0.2 s of the worker's 2.5 s of
CPU in ``benchmarks/queue_speed.py`` (counted with ``gc.callbacks``, BENCHMARKS.md, session
34). ``settle_collector`` moves what start-up made out of the collector's sight
(``gc.freeze``: they live as long as the process) and lets the young generation grow to
``YOUNG_THRESHOLD`` objects before a pass, as serving engines do after start-up (vLLM freezes
its heap once its engine is up). Reference counting still frees what is not in a cycle at
once; cycles are found as before, only in fewer passes.

A process-wide setting: the ``genq worker`` command calls it, not ``Worker.run`` (a worker run
in a thread of another program, as in tests, leaves that program's collector alone).
"""

from __future__ import annotations

import gc

YOUNG_THRESHOLD = 10_000
"""Objects allocated (less those freed) before a young-generation pass (Python's default:
700). The older generations keep their default multipliers (every 10 passes of the one
below)."""


def settle_collector() -> None:
    """Freeze what start-up made and raise the young generation's threshold (see above)."""
    gc.collect()  # start-up's garbage is freed, not frozen
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, older, oldest)
