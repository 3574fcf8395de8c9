"""When waiting to fill a batch pays off: an estimate of the time between arrivals, and a record
of whether waiting has been bringing anyone.

A static batch waits up to ``max_wait_ms`` for more requests only if more are likely to arrive
within what is left of that window, as BentoML's dispatcher does with its measured arrival
rate. The estimate is an exponentially weighted mean of the gaps between consecutive arrivals
(entry ids' times), stretched by the time since the last one: a lone request on an idle queue
sees a long gap and starts at once; a busy stream with gaps shorter than the window waits and
fills its batch.

The gaps alone can fool it: a client that sends its next request only when the last one is
answered arrives every (wait + generation) ms, so each wait makes the next gap look like "one
is coming" and every request waits the whole window. So it also learns from its waits (as
BentoML's adaptive dispatcher learns from what its waits cost): ``payoff`` is the weighted share
of recent fill-waits during which another request arrived. Below ``PAYOFF_MIN`` it stops
waiting, and tries one wait again every ``RETRY_MS`` to notice traffic that changed.

Pure: arrival times and ``now_ms`` are arguments.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

WEIGHT = 0.2
"""How much each new gap moves the mean (about the last ten gaps count)."""
PAYOFF_WEIGHT = 0.25
"""How much each wait's outcome moves ``payoff``: three fruitless waits in a row stop waiting."""
PAYOFF_MIN = 0.5
"""Below this share of waits that brought someone, a batch starts without waiting."""
RETRY_MS = 1_000
"""While waiting does not pay, one wait is tried again this often."""


@dataclass(kw_only=True)
class ArrivalEstimate:
    """The mean time between arrivals, in ms (None until two arrivals were seen), and how often
    waiting for more brought any."""

    mean_gap_ms: float | None = None
    last_ms: int | None = None
    """The latest arrival seen."""
    payoff: float = 1.0
    """Weighted share of recent fill-waits during which another request arrived."""
    tried_ms: int | None = None
    """When the last fill-wait began."""
    in_wait: bool = False
    """A fill-wait is under way (``waiting`` was called, no batch started since)."""
    brought: bool = False
    """Another request arrived during the wait under way."""

    def observe(self, arrivals_ms: Iterable[int]) -> None:
        """Arrival times just read (any order; ones older than the latest seen add no gap)."""
        for t in sorted(arrivals_ms):
            if self.last_ms is not None and t >= self.last_ms:
                gap, mean = t - self.last_ms, self.mean_gap_ms
                self.mean_gap_ms = gap if mean is None else mean + WEIGHT * (gap - mean)
            if self.last_ms is None or t > self.last_ms:
                self.last_ms = t
            self.brought = self.brought or self.in_wait

    def expected_gap_ms(self, now_ms: int) -> float | None:
        """The gap to expect before the next arrival, now: the mean, or longer if the queue has
        been quiet for longer than that. None: nothing known yet."""
        if self.mean_gap_ms is None or self.last_ms is None:
            return None
        return max(self.mean_gap_ms, float(now_ms - self.last_ms))

    def worth_waiting(self, wait_ms: int, now_ms: int) -> bool:
        """Whether another arrival is expected within ``wait_ms``, and waiting has been paying
        off (or it is time to try again)."""
        gap = self.expected_gap_ms(now_ms)
        if gap is None or wait_ms <= 0 or gap > wait_ms:
            return False
        if self.in_wait or self.payoff >= PAYOFF_MIN:
            return True
        return self.tried_ms is None or now_ms - self.tried_ms >= RETRY_MS

    def waiting(self, now_ms: int) -> None:
        """The batch waits to fill (the decision was to wait)."""
        if not self.in_wait:
            self.in_wait, self.brought, self.tried_ms = True, False, now_ms

    def batch_started(self) -> None:
        """A batch started: the wait under way, if any, is scored by whether anyone came."""
        if self.in_wait:
            self.payoff += PAYOFF_WEIGHT * (float(self.brought) - self.payoff)
            self.in_wait = False
