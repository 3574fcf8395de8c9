"""Waiting for results: the bookkeeping of reading many requests' event streams (``Waiter``)
and of following one as it streams (``StreamReader``). Both clients drive them with their own
Redis calls.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from itertools import islice
from typing import Any

from genq.common import states
from genq.common.connection import MAX_BLOCK_MS
from genq.common.errors import ResultTimeout
from genq.common.keys import Keys
from genq.common.models import FINAL_STATUSES, Result
from genq.common.wire import (
    DELTA_EVENT,
    EVENT_DATA_FIELD,
    EVENT_TYPE_FIELD,
    FINAL_EVENT,
    as_text,
    decode_result,
)

#: How many event streams one round of waiting reads.
MAX_STREAMS_PER_READ = 500


def final_from_events(
    response: list[Any] | None,
) -> tuple[dict[str, Result], dict[str, str]]:
    """From an XREAD response over event streams: the final results found, by event key, and
    the last entry id read per event key (to continue from)."""
    finals: dict[str, Result] = {}
    last_ids: dict[str, str] = {}
    for stream, entries in response or []:
        key = as_text(stream)
        for entry_id, fields in entries:
            last_ids[key] = as_text(entry_id)
            if _field(fields, EVENT_TYPE_FIELD) == FINAL_EVENT:
                finals[key] = decode_result(_field(fields, EVENT_DATA_FIELD))
    return finals, last_ids


def parse_stored(raw: bytes | str | None) -> Result | None:
    """Decode the value of a result key (None if the key does not exist)."""
    return None if raw is None else decode_result(raw)


POLL_START_S = 0.002
POLL_MAX_S = 0.05
"""Bounds of the pause between polling rounds for results on a Redis Cluster."""


class Waiter:
    """The bookkeeping of waiting for many results: which event streams to read, from where,
    and for how long. Both clients drive it with their own Redis calls."""

    def __init__(self, keys: Keys, ids: Sequence[str], timeout_s: float | None) -> None:
        self._keys = keys
        self.results: dict[str, Result] = {}
        self.pending: dict[str, str] = {keys.events(i): i for i in ids}  # event key -> id
        self.last_ids: dict[str, str] = dict.fromkeys(self.pending, "0-0")
        self._timeout_s = timeout_s
        self._deadline = None if timeout_s is None else time.monotonic() + timeout_s
        self._poll_s = POLL_START_S

    def take_stored(self, ids: Sequence[str], raws: Sequence[bytes | str | None]) -> None:
        """Record the results already final at their keys."""
        before = len(self.pending)
        for request_id, raw in zip(ids, raws, strict=True):
            if raw is not None and states.status_of(raw) in FINAL_STATUSES:
                self._done(request_id, decode_result(raw))
        self._poll_s = POLL_START_S if len(self.pending) < before else self._poll_s

    def timed_out(self) -> ResultTimeout:
        """The error to raise when the time is up."""
        return ResultTimeout(f"{len(self.pending)} request(s) not final after {self._timeout_s} s")

    def next_poll(self) -> tuple[list[str], float] | None:
        """Redis Cluster: the ids whose states to read in the next round, and the pause before
        it (growing from 2 ms to 50 ms while nothing ends); None when the time is up. The event
        streams of many requests live on different nodes there, so one blocking XREAD cannot
        wait for them all: the client polls their states instead, one pipeline per round."""
        pause_s = self._poll_s
        self._poll_s = min(POLL_MAX_S, self._poll_s * 2)
        if self._deadline is not None:
            left_s = self._deadline - time.monotonic()
            if left_s <= 0:
                return None
            pause_s = min(pause_s, left_s)
        return list(islice(self.pending.values(), MAX_STREAMS_PER_READ)), pause_s

    def _done(self, request_id: str, result: Result) -> None:
        self.results[request_id] = result
        key = self._keys.events(request_id)
        self.pending.pop(key, None)
        self.last_ids.pop(key, None)

    def next_read(self) -> tuple[dict[Any, Any], dict[Any, Any], int] | None:
        """What to read next: the oldest pending request's event stream, to block on, and up
        to ``MAX_STREAMS_PER_READ - 1`` other pending ones to read without blocking right
        after (a second read, decoded with the collector paused: ``collector.paused``), with
        the block time; None when the time is up.

        Blocking on one stream costs Redis far less than on hundreds, and waits no longer: the
        wait cannot end before the oldest request is final anyway, and whatever else ended
        meanwhile comes with the second read. Redis' BLOCK 0 means forever, so the block
        time is at least 1 ms."""
        block_ms = MAX_BLOCK_MS
        if self._deadline is not None:
            left_ms = int((self._deadline - time.monotonic()) * 1000)
            if left_ms <= 0:
                return None
            block_ms = max(1, min(block_ms, left_ms))
        streams = iter(self.last_ids.items())
        head = dict(islice(streams, 1))
        return head, dict(islice(streams, MAX_STREAMS_PER_READ - 1)), block_ms

    def queue_poll(self, pipe: Any) -> tuple[list[str], float] | None:
        """Redis Cluster: queue the next round's state reads (``next_poll``) on ``pipe``;
        return the ids read, in order, and the pause after; None when the time is up."""
        poll = self.next_poll()
        if poll is not None:
            for request_id in poll[0]:
                pipe.get(self._keys.result(request_id))
        return poll

    def take_events(self, response: Any) -> None:
        """Record what one XREAD returned."""
        finals, last_ids = final_from_events(response)
        self.last_ids.update({k: v for k, v in last_ids.items() if k in self.last_ids})
        for key, res in finals.items():
            if key in self.pending:
                self._done(self.pending[key], res)


def _field(fields: dict[Any, Any], name: str) -> Any:
    """An event field as text, whether the client decodes responses or not."""
    value = fields.get(_ENCODED.get(name) or name.encode())
    if value is None:
        value = fields.get(name)
    return None if value is None else as_text(value)


_ENCODED = {name: name.encode() for name in (EVENT_TYPE_FIELD, EVENT_DATA_FIELD)}


def parse_event(fields: dict[Any, Any]) -> str | Result | None:
    """A streamed piece of text (``delta``), the final Result, or None for an unknown type."""
    kind = _field(fields, EVENT_TYPE_FIELD)
    if kind == FINAL_EVENT:
        return decode_result(_field(fields, EVENT_DATA_FIELD))
    if kind == DELTA_EVENT:
        text: str = json.loads(_field(fields, EVENT_DATA_FIELD))["text"]
        return text
    return None


class StreamReader:
    """The bookkeeping of following one request's event stream (for both clients)."""

    def __init__(self, keys: Keys, request_id: str, timeout_s: float | None) -> None:
        self.key = keys.events(request_id)
        self.last_id = "0-0"
        self.sent = ""
        self.done = False
        self._deadline = None if timeout_s is None else time.monotonic() + timeout_s

    def next_block_ms(self) -> int | None:
        """Block time of the next XREAD; None when the time is up."""
        if self._deadline is None:
            return MAX_BLOCK_MS
        left_ms = int((self._deadline - time.monotonic()) * 1000)
        return None if left_ms <= 0 else max(1, min(MAX_BLOCK_MS, left_ms))

    def take(self, response: list[Any] | None) -> list[str | Result]:
        """What to yield from one XREAD response: text pieces, and the final Result last (with
        any final text the deltas had not yet carried, so the pieces add up to result.text)."""
        out: list[str | Result] = []
        for _stream, entries in response or []:
            for entry_id, fields in entries:
                self.last_id = as_text(entry_id)
                event = parse_event(fields)
                if isinstance(event, str):
                    self.sent += event
                    out.append(event)
                elif isinstance(event, Result):
                    text = event.text or ""
                    if text.startswith(self.sent) and len(text) > len(self.sent):
                        out.append(text[len(self.sent) :])
                    out.append(event)
                    self.done = True
                    return out
        return out
