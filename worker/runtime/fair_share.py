"""The fair share's runtime side: the tenants' accounts as one worker keeps them: their
weights (read again at most every second, in a read's round trip), and what goes back to their
shares in Redis: the charge corrections of requests just read (sent with the next read, or at
once for a limited tenant), the move of a started request's charge from reserved to served,
and the refunds when requests end (``policy/fair_share.py`` says what each is). Keys from
``genq.common.keys``.
"""

from __future__ import annotations

import time
from collections.abc import Container, Sequence
from typing import Any

import redis
from genq.common.fair_share import weighted_tokens
from genq.common.keys import Keys
from genq.common.tenants import TenantSettings
from genq.common.wire import as_text
from genq.worker.policy.fair_share import Refund, merged, started_charges
from genq.worker.policy.lookahead import Held
from genq.worker.runtime import clock
from genq.worker.runtime.read_trip import Taker

WEIGHTS_EVERY_S = 1.0
"""How often a worker reads the tenants' weights again (changes reach it within this)."""
WINDOW_TTL_S = 120
"""A tenant's per-second token counts live this long (its limit looks back 60 s)."""


class TenantAccounts:
    """One worker's side of the tenants' shares (the loop's thread only)."""

    def __init__(self, r: redis.Redis, keys: Keys) -> None:
        self.redis = r
        self.keys = keys
        self.weights = TenantWeights(keys)
        self._deferred: list[Refund] = []
        """Charge corrections for the next read's round trip (``defer``)."""

    def refund(self, refunds: Sequence[Refund]) -> None:
        """``add_refunds`` now, in a round trip of its own (requests that ended without an
        outcome of this worker's; a limited tenant's corrections)."""
        if refunds:
            pipe = self.redis.pipeline(transaction=False)
            add_refunds(pipe, self.keys, refunds, self.weights.limited)
            pipe.execute()

    def defer(self, refunds: Sequence[Refund]) -> None:
        """Send ``refunds`` in the next read's round trip (or at ``flush``)."""
        self._deferred.extend(refunds)

    def ride(self, pipe: Any) -> Taker | None:
        """Queue what was deferred on ``pipe`` (a rider of every read); what drops it once it
        went through (None: nothing deferred)."""
        if not self._deferred:
            return None
        add_refunds(pipe, self.keys, self._deferred, self.weights.limited)
        n = len(self._deferred)
        return lambda _replies: self.sent(n)

    def sent(self, n: int) -> None:
        """The first ``n`` deferred refunds reached Redis."""
        del self._deferred[:n]

    def flush(self) -> None:
        """Send what is deferred now (a worker leaving)."""
        self.refund(self._deferred)
        self._deferred.clear()

    def corrections(self, held: Sequence[Held]) -> None:
        """Make the charges of newly read requests exact (``recharge``): a limited tenant's at
        once (its bucket must learn a prompt's size), the others' with the next read, so that
        a tenant of many small requests is not held back by the read's estimate (a body's
        bytes) of every one it has waiting in the fleet's look-aheads."""
        now: list[Refund] = []
        limited = self.weights.limited
        for h in held:
            (now if h.request.tenant in limited else self._deferred).append(h.recharge())
        if now:
            self.refund(now)


class TenantWeights:
    """Each tenant's weight (``genq tenants``) as this worker knows it: read again in the
    round trip of a read, at most every ``WEIGHTS_EVERY_S`` (``ride``)."""

    def __init__(self, keys: Keys) -> None:
        self.keys = keys
        self.now: dict[str, float] = {}
        self.limited: set[str] = set()
        """The tenants with a tokens-per-minute limit."""
        self.sharing: set[str] = set()
        """The tenants whose prefix keys meet other sharing tenants' (``share_prefixes``)."""
        self._read_s = -WEIGHTS_EVERY_S

    def ride(self, pipe: Any) -> Taker | None:
        """Queue the read of the weights on ``pipe`` if it is due (a rider of every read);
        what takes them once it went through (None: not due)."""
        now_s = time.monotonic()
        if now_s - self._read_s < WEIGHTS_EVERY_S:
            return None
        pipe.hgetall(self.keys.tenants)
        return lambda replies: self.took(replies[0], now_s)

    def took(self, raw: dict[Any, Any], read_s: float) -> None:
        """The weights as Redis holds them (``genq tenants``), read at ``read_s``."""
        self._read_s = read_s
        found = {as_text(k): TenantSettings.from_json(v) for k, v in raw.items()}
        self.now = {t: s.weight for t, s in found.items()}
        self.limited = {t for t, s in found.items() if s.tokens_per_minute}
        self.sharing = {t for t, s in found.items() if s.share_prefixes}


def give_back_args(keys: Keys, held: Sequence[Held], rings: int) -> list[str | int]:
    """KEYS and ARGV (after the key count) of the GIVE_BACK call for ``held``."""
    streams = keys.streams()
    args: list[str | int] = [keys.config, *streams, rings, clock.now_ms() // 1000]
    for h in held:
        est, max_new = h.charge
        args += [streams.index(h.stream) + 1, h.entry_id, h.request.tenant]
        args += [weighted_tokens(est, max_new), est + max_new]
    return args


def add_refunds(
    pipe: Any, keys: Keys, refunds: Sequence[Refund], limited: Container[str] = ()
) -> None:
    """Queue on ``pipe`` what goes back to each tenant when these requests end: the charge of
    the read less what they used, to its weighted service (or, never started, to its reserved),
    its last minute and, for a ``limited`` tenant (a tokens-per-minute limit: the read charged
    its bucket), its bucket; and what they used, to its total (``policy/fair_share.py``). One
    set of commands per tenant."""
    second = str(clock.now_ms() // 1000)
    for tenant, back in merged(list(refunds)).items():
        if back.served:
            pipe.zincrby(keys.vtc, -back.served, tenant)
        if back.reserved:
            pipe.zincrby(keys.reserved, -back.reserved, tenant)
        if back.tokens:
            pipe.hincrby(keys.window(tenant), second, -back.tokens)
            pipe.expire(keys.window(tenant), WINDOW_TTL_S)
        if back.tokens and tenant in limited:
            pipe.hincrbyfloat(keys.bucket(tenant), "level", back.tokens)
            pipe.expire(keys.bucket(tenant), WINDOW_TTL_S)
        if back.used:
            pipe.hincrby(keys.served, tenant, back.used)
            pipe.hincrby(keys.served, f"{tenant}:requests", back.requests)


def add_starts(pipe: Any, keys: Keys, held: Sequence[Held]) -> None:
    """Queue on ``pipe`` the move of these requests' charges, per tenant, from reserved to
    served (``vtc``): a worker starts them now."""
    for tenant, weighted in started_charges((h.request.tenant, h.charge) for h in held).items():
        if weighted:
            pipe.zincrby(keys.reserved, -weighted, tenant)
            pipe.zincrby(keys.vtc, weighted, tenant)
