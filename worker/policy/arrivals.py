"""When waiting to fill a batch pays off: an estimate of the time between arrivals.

A static batch waits up to ``max_wait_ms`` for more requests only if more are likely to arrive
within what is left of that window, as BentoML's dispatcher does with its measured arrival
rate. The estimate is an exponentially weighted mean of the gaps between consecutive arrivals
(entry ids' times), stretched by the time since the last one: a lone request on an idle queue
sees a long gap and starts at once; a busy stream with gaps shorter than the window waits and
fills its batch.

Pure: arrival times and ``now_ms`` are arguments.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

WEIGHT = 0.2
"""How much each new gap moves the mean (about the last ten gaps count)."""


@dataclass(kw_only=True)
class ArrivalEstimate:
    """The mean time between arrivals, in ms (None until two arrivals were seen)."""

    mean_gap_ms: float | None = None
    last_ms: int | None = None
    """The latest arrival seen."""

    def observe(self, arrivals_ms: Iterable[int]) -> None:
        """Arrival times just read (any order; ones older than the latest seen add no gap)."""
        for t in sorted(arrivals_ms):
            if self.last_ms is not None and t >= self.last_ms:
                gap, mean = t - self.last_ms, self.mean_gap_ms
                self.mean_gap_ms = gap if mean is None else mean + WEIGHT * (gap - mean)
            if self.last_ms is None or t > self.last_ms:
                self.last_ms = t

    def expected_gap_ms(self, now_ms: int) -> float | None:
        """The gap to expect before the next arrival, now: the mean, or longer if the queue has
        been quiet for longer than that. None: nothing known yet."""
        if self.mean_gap_ms is None or self.last_ms is None:
            return None
        return max(self.mean_gap_ms, float(now_ms - self.last_ms))

    def worth_waiting(self, wait_ms: int, now_ms: int) -> bool:
        """Whether another arrival is expected within ``wait_ms``."""
        gap = self.expected_gap_ms(now_ms)
        return gap is not None and wait_ms > 0 and gap <= wait_ms
