"""The adaptive token budget: after an out-of-memory error a worker runs with half the budget
(at most half the batch that failed) for ``backoff_s``, then goes back to the full budget.

Pure: the time is an argument (``now_s``, any monotonic clock).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(kw_only=True)
class AdaptiveBudget:
    """A worker's batch budget in tokens, lowered after out of memory."""

    full_tokens: int
    """The configured budget (``--max-batch-tokens``)."""
    backoff_s: float
    """How long a lowered budget lasts (``--oom-backoff-s``)."""
    tokens: int = field(init=False)
    """The budget now."""
    restore_at_s: float | None = field(default=None, init=False)
    """When the full budget comes back (None: it is in force)."""

    def __post_init__(self) -> None:
        self.tokens = self.full_tokens

    def lower(self, failed_tokens: int, now_s: float) -> int:
        """Out of memory on a batch of ``failed_tokens``: halve the budget (at most half the
        failed batch, at least 1) for ``backoff_s``; return the new budget."""
        self.tokens = max(1, min(self.tokens, failed_tokens) // 2)
        self.restore_at_s = now_s + self.backoff_s
        return self.tokens

    def restore_due(self, now_s: float) -> bool:
        """Restore the full budget if its time has come; True if it was restored just now."""
        if self.restore_at_s is None or now_s < self.restore_at_s:
            return False
        self.restore_at_s = None
        self.tokens = self.full_tokens
        return True
