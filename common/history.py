"""The queue's recent history: a bounded rolling series in Redis, written by workers.

Every worker adds what it did since its last heartbeat to the hash of the current 5-s bucket
of Redis' clock (``Keys.history(unix_s // BUCKET_S)``) with ``HISTORY``, one script call in the
heartbeat's round trip; each bucket expires ``BUCKET_TTL_S`` after its last write. So the
history is the same for every reader (every gateway replica's dashboard draws the same
picture), survives a gateway's restart, and costs the queue nothing when nobody looks.

A bucket's fields:

==============  ==========================================================================
field           what
==============  ==========================================================================
``requests``    requests that reached a final state in the bucket (succeeded, failed,
                expired), summed over workers
``tokens``      tokens generated
``w:B``         requests that started after waiting in the queue a time in bin ``B``
                (``wait_bin``: quarter-octaves of milliseconds), for the wait percentiles
``depth_max``   the most requests waiting for a worker (``LLEN genq:{Q}:waiting``) any
                worker saw at a heartbeat in the bucket
==============  ==========================================================================
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Mapping
from typing import Any

from genq.common import script_calls
from genq.common.keys import Keys
from genq.common.lua.history import HISTORY
from genq.common.wire import as_text

BUCKET_S = 5
"""Seconds per history bucket."""
BUCKETS = 180
"""Buckets a dashboard shows: the last 15 minutes."""
BUCKET_TTL_S = 16 * 60
"""A bucket expires this long after its last write (a little more than ``BUCKETS`` cover)."""
BINS_PER_OCTAVE = 4
"""Resolution of the wait histogram: a bin spans a factor of 2 ** (1/4), about 19 %."""

WAIT_PREFIX = "w:"


def wait_bin(wait_ms: int) -> int:
    """The histogram bin of a queue wait: 0 for 0 ms, then quarter-octaves (bin ``b`` holds
    waits up to ``bin_upper_ms(b)``)."""
    if wait_ms <= 0:
        return 0
    return max(1, math.ceil(math.log2(wait_ms + 1) * BINS_PER_OCTAVE))


def bin_upper_ms(b: int) -> int:
    """The longest wait (ms) bin ``b`` holds."""
    return max(0, round(2 ** (b / BINS_PER_OCTAVE) - 1))


def increments(requests: int, tokens: int, waits_ms: Iterable[int]) -> dict[str, int]:
    """The fields a worker adds to the current bucket (only those that are not zero)."""
    out: dict[str, int] = {}
    if requests:
        out["requests"] = requests
    if tokens:
        out["tokens"] = tokens
    for w in waits_ms:
        field = f"{WAIT_PREFIX}{wait_bin(w)}"
        out[field] = out.get(field, 0) + 1
    return out


@functools.cache
def _script_keys(queue: str) -> tuple[str, str, str]:
    """HISTORY's keys and bucket prefix: the unnamed lane's backlog (a worker's ``Lanes`` has
    no single one), the lanes' registry and ``Keys.history``'s prefix. Made once, as this is
    on the path of every write that publishes a worker's stats."""
    keys = Keys(queue)
    return keys.waiting, keys.models, keys.history("")


def add(pipe: Any, keys: Keys, fields: Mapping[str, int], now_ms: int) -> None:
    """Queue ``HISTORY`` on ``pipe``: ``fields`` added to the current bucket, depth sampled
    (``now_ms``, the caller's clock, is used only where Redis' TIME is not allowed)."""
    waiting, models, prefix = _script_keys(keys.queue)
    args: list[Any] = [prefix, BUCKET_S, BUCKET_TTL_S, now_ms // 1000]
    for k, v in fields.items():
        args += [k, v]
    script_calls.add(pipe, HISTORY, 2, waiting, models, *args)


def percentile(bins: Mapping[int, int], q: float) -> int | None:
    """The ``q`` quantile (0-1) of a wait histogram, as its bin's upper edge (ms); None if
    empty."""
    total = sum(bins.values())
    if not total:
        return None
    rank = math.ceil(q * total)
    seen = 0
    for b in sorted(bins):
        seen += bins[b]
        if seen >= rank:
            return bin_upper_ms(b)
    return bin_upper_ms(max(bins))


def series(buckets: Iterable[tuple[int, Mapping[Any, Any]]]) -> dict[str, list[Any]]:
    """Chart series from ``(bucket number, bucket hash)`` pairs, oldest first: the bucket's
    start (Unix s), requests/s, tokens/s, depth (None where no worker wrote), wait p50/p99."""
    names = ("t", "requests_per_s", "tokens_per_s", "depth", "wait_p50_ms", "wait_p99_ms")
    out: dict[str, list[Any]] = {k: [] for k in names}
    for number, raw in buckets:
        h = {as_text(k): int(as_text(v)) for k, v in raw.items()}
        bins = {int(k[len(WAIT_PREFIX) :]): v for k, v in h.items() if k.startswith(WAIT_PREFIX)}
        written = bool(h)
        out["t"].append(number * BUCKET_S)
        out["requests_per_s"].append(h.get("requests", 0) / BUCKET_S if written else None)
        out["tokens_per_s"].append(h.get("tokens", 0) / BUCKET_S if written else None)
        out["depth"].append(h.get("depth_max") if written else None)
        out["wait_p50_ms"].append(percentile(bins, 0.5))
        out["wait_p99_ms"].append(percentile(bins, 0.99))
    return out
