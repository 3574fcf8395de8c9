"""Building and checking requests on the client side, before anything reaches Redis.

Shared by the sync and async clients, which differ only in how they talk to Redis.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from itertools import islice
from typing import Any, NamedTuple

import orjson
from genq.common.errors import InvalidRequest, QueueFull, RequestNotFound, ResultTimeout
from genq.common.keys import Keys
from genq.common.models import (
    FINAL_STATUSES,
    MAX_PROMPT_CHARS,
    PRIORITIES,
    ErrorInfo,
    Priority,
    Request,
    Result,
    new_request_id,
    now_ms,
)
from genq.common.scripts import QUEUE_FULL_PREFIX, apply_args
from genq.common.wire import (
    BODY_FIELD,
    DELTA_EVENT,
    EVENT_DATA_FIELD,
    EVENT_TYPE_FIELD,
    FINAL_EVENT,
    decode_result,
    describe_validation_error,
    encode_request,
)
from pydantic import ValidationError

#: Longest single blocking read while waiting for results. Waiting longer loops, which keeps
#: a dropped connection from hanging a caller forever; it is not polling (each read blocks).
MAX_BLOCK_MS = 5_000
#: How many event streams one round of waiting reads.
MAX_STREAMS_PER_READ = 500


def build_request(
    prompt: str | None = None,
    *,
    messages: Sequence[Mapping[str, Any]] | None = None,
    max_new_tokens: int = 64,
    priority: str = "normal",
    temperature: float = 0.0,
    top_p: float = 1.0,
    top_k: int = 0,
    seed: int | None = None,
    stop: Sequence[str] | None = None,
    deadline_in_s: float | None = None,
    metadata: Mapping[str, Any] | None = None,
    request_id: str | None = None,
    stream: bool = False,
) -> Request:
    """Validate the arguments into a Request; raise InvalidRequest saying what is wrong. Give a
    ``prompt`` to continue, or chat ``messages`` (``[{"role": ..., "content": ...}]``) that the
    worker renders with the model's chat template."""
    if isinstance(stop, str):
        stop = [stop]
    deadline_unix_ms = None
    if deadline_in_s is not None:
        if not isinstance(deadline_in_s, int | float) or not math.isfinite(deadline_in_s):
            raise InvalidRequest(f"deadline_in_s must be a finite number, got {deadline_in_s!r}")
        deadline_unix_ms = now_ms() + int(deadline_in_s * 1000)
    fields: dict[str, Any] = {
        "id": request_id if request_id is not None else new_request_id(),
        "prompt": prompt,
        "messages": None if messages is None else [dict(m) for m in messages],
        "max_new_tokens": max_new_tokens,
        "priority": priority,
        "temperature": float(temperature) if isinstance(temperature, int) else temperature,
        "top_p": float(top_p) if isinstance(top_p, int) else top_p,
        "top_k": top_k,
        "seed": seed,
        "stop": list(stop or []),
        "deadline_unix_ms": deadline_unix_ms,
        "metadata": dict(metadata or {}),
        "stream": stream,
    }
    try:
        return Request.model_validate(fields)
    except ValidationError as err:
        raise InvalidRequest(f"invalid request: {describe_validation_error(err)}") from None


def queued_json(request_id: str, priority: str, metadata: Mapping[str, Any]) -> str:
    """The JSON written to the result key at submission."""
    # A Result's JSON written directly (the submit hot path); clients parse it as a Result.
    state = {"id": request_id, "status": "queued", "priority": priority, "metadata": metadata}
    return orjson.dumps(state).decode()


class Prepared(NamedTuple):
    """A validated request in the form SUBMIT takes: its id, priority, the entry's ``body``
    JSON and the ``queued`` state JSON."""

    id: str
    priority: Priority
    body: str
    queued: str


def prepare(request: Request) -> Prepared:
    """The SUBMIT form of a built request."""
    return Prepared(
        request.id,
        request.priority,
        encode_request(request)[BODY_FIELD],
        queued_json(request.id, request.priority, request.metadata),
    )


def prepare_many(
    items: Iterable[str | Mapping[str, Any]], defaults: Mapping[str, Any]
) -> list[Prepared]:
    """``build_request`` for each item (a prompt, or a dict of arguments overriding
    ``defaults``), then ``prepare``; raises InvalidRequest for the first invalid one.

    Plain prompts take a fast path that gives the same entries: the shared ``defaults`` are
    validated once (as a request with a placeholder prompt) and each prompt is checked on its
    own against the prompt's limits, so a big ``submit_many`` costs a few microseconds per
    request instead of a full model validation each. Anything the fast path cannot vouch for
    (an over-long, empty or non-UTF-8 prompt) goes through ``build_request``, which raises
    the same error it always does."""
    fast = not {"prompt", "messages", "request_id"} & set(defaults)
    shared: dict[str, Any] | None = None
    priority: Priority = "normal"
    queued_tail = ""
    items = list(items)
    ids = iter(new_request_ids(sum(isinstance(x, str) for x in items)))
    out: list[Prepared] = []
    for item in items:
        if not isinstance(item, str):
            out.append(prepare(build_request(**{**defaults, **item})))
            continue
        if fast and shared is None:
            template = build_request("-", **defaults)  # raises if the options are invalid
            shared = orjson.loads(encode_request(template)[BODY_FIELD])
            del shared["prompt"]
            priority = template.priority
            queued_tail = queued_json("", priority, template.metadata)[len('{"id":""') :]
        request_id = next(ids)
        if shared is not None and 0 < len(item) <= MAX_PROMPT_CHARS:
            try:
                body = orjson.dumps({"prompt": item, **shared}).decode()
            except orjson.JSONEncodeError:  # a lone surrogate: build_request says why
                pass
            else:
                queued = '{"id":"' + request_id + '"' + queued_tail
                out.append(Prepared(request_id, priority, body, queued))
                continue
        out.append(prepare(build_request(item, **{"request_id": request_id, **defaults})))
    return out


def new_request_ids(n: int) -> list[str]:
    """``n`` fresh random request ids like ``new_request_id`` (32 hex digits), made at once."""
    digits = os.urandom(16 * n).hex()
    return [digits[i : i + 32] for i in range(0, 32 * n, 32)]


#: Requests per SUBMIT script call: each call is atomic, and short enough not to stall Redis.
SUBMIT_CHUNK = 500


def submit_calls(
    keys: Keys, requests: Sequence[Prepared], ttl_s: int, cluster: bool = False
) -> list[tuple[list[str], list[str | int]]]:
    """The (KEYS, ARGV) of the SUBMIT script calls that enqueue ``requests``, in chunks. On a
    Redis Cluster the per-id keys are the queue-slot markers (see ``Keys.submitted``) and the
    queued states are written after (``queued_writes``)."""
    calls: list[tuple[list[str], list[str | int]]] = []
    per_id = keys.submitted if cluster else keys.result
    for start in range(0, len(requests), SUBMIT_CHUNK):
        chunk = requests[start : start + SUBMIT_CHUNK]
        script_keys = [keys.config, *keys.streams()] + [per_id(r.id) for r in chunk]
        args: list[str | int] = [ttl_s, len(chunk)]
        for r in chunk:
            args += [PRIORITIES.index(r.priority) + 1, r.id, r.body, r.queued]
        calls.append((script_keys, args))
    return calls


def queued_writes(
    keys: Keys, requests: Sequence[Prepared], replies: Sequence[Any]
) -> list[tuple[str, str]]:
    """Redis Cluster only: (result key, queued state JSON) of each request the SUBMIT calls
    enqueued, for the client to SET NX (a worker may have written a newer state already)."""
    out: list[tuple[str, str]] = []
    for i, reply in enumerate(replies):
        if isinstance(reply, Exception):
            continue
        chunk = requests[i * SUBMIT_CHUNK : (i + 1) * SUBMIT_CHUNK]
        out += [
            (keys.result(r.id), r.queued) for r, new in zip(chunk, reply, strict=True) if new == 1
        ]
    return out


def cancel_call(
    keys: Keys, request_id: str, raw: bytes | str | None, ttl_s: int
) -> tuple[list[str], list[str | int]] | None:
    """KEYS and ARGV of the APPLY call that cancels a request whose state is ``raw``; None if
    it is already final. Raises RequestNotFound if it has no state."""
    current = parse_stored(raw)
    if current is None:
        raise RequestNotFound(f"no request {request_id!r} in Redis (never submitted, or expired)")
    if current.is_final:
        return None
    state = current.model_copy(
        update={
            "status": "cancelled",
            "error": ErrorInfo(code="cancelled", message="cancelled by a client"),
            "timings": current.timings.model_copy(update={"finished_unix_ms": now_ms()}),
        }
    )
    return apply_args(keys, ttl_s, "cancel", [(request_id, None, "", state.model_dump_json())])


def cancel_outcome(request_id: str, reply: Any) -> bool:
    """Whether the APPLY call of ``cancel_call`` cancelled the request."""
    if reply[0] == -1:
        raise RequestNotFound(f"no request {request_id!r} in Redis (expired meanwhile)")
    return bool(reply[0] == 1)


def submit_outcome(requests: Sequence[Prepared], replies: Sequence[Any]) -> list[str]:
    """The ids of ``requests`` after the SUBMIT calls answered ``replies`` (one per chunk);
    raise QueueFull (with the ids that did go in) if a chunk was refused."""
    done: list[str] = []
    for i, reply in enumerate(replies):
        chunk = requests[i * SUBMIT_CHUNK : (i + 1) * SUBMIT_CHUNK]
        if isinstance(reply, Exception):
            if QUEUE_FULL_PREFIX in str(reply):
                _, depth, limit = str(reply).split()[-3:]
                raise QueueFull(
                    f"queue is full: {depth} requests waiting or running, its limit is {limit} "
                    f"(max_queue_depth); {len(done)} of {len(requests)} were enqueued. "
                    "Retry later, or raise the limit with genq worker --max-queue-depth",
                    submitted=done,
                )
            raise reply
        done += [r.id for r in chunk]
    return done


def final_from_events(
    response: list[Any] | None,
) -> tuple[dict[str, Result], dict[str, str]]:
    """From an XREAD response over event streams: the final results found, by event key, and
    the last entry id read per event key (to continue from)."""
    finals: dict[str, Result] = {}
    last_ids: dict[str, str] = {}
    for stream, entries in response or []:
        key = stream.decode() if isinstance(stream, bytes) else stream
        for entry_id, fields in entries:
            last_ids[key] = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
            if _field(fields, EVENT_TYPE_FIELD) == FINAL_EVENT:
                finals[key] = decode_result(_field(fields, EVENT_DATA_FIELD))
    return finals, last_ids


def parse_stored(raw: bytes | str | None) -> Result | None:
    """Decode the value of a result key (None if the key does not exist)."""
    return None if raw is None else decode_result(raw)


def stored_status(raw: bytes | str) -> object:
    """The ``status`` of a stored state, read without validating the rest (None if it has
    none): most states a wait finds are not final, and only final ones are decoded in full."""
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    return doc.get("status") if isinstance(doc, dict) else None


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
            if raw is not None and stored_status(raw) in FINAL_STATUSES:
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

    def next_read(self) -> tuple[dict[str, str], dict[str, str], int] | None:
        """What to read next: the oldest pending request's event stream, to block on, and up
        to ``MAX_STREAMS_PER_READ - 1`` other pending ones to read without blocking right
        after (one pipeline), with the block time; None when the time is up.

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

    def queue_read(self, pipe: Any) -> bool:
        """Queue the next round's reads (``next_read``) on ``pipe``; False when the time is up."""
        read = self.next_read()
        if read is None:
            return False
        head, rest, block_ms = read
        pipe.xread(head, block=block_ms)
        if rest:
            pipe.xread(rest)
        return True

    def queue_poll(self, pipe: Any) -> tuple[list[str], float] | None:
        """Redis Cluster: queue the next round's state reads (``next_poll``) on ``pipe``;
        return the ids read, in order, and the pause after; None when the time is up."""
        poll = self.next_poll()
        if poll is not None:
            for request_id in poll[0]:
                pipe.get(self._keys.result(request_id))
        return poll

    def take_events(self, response: list[Any] | None) -> None:
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
    return value.decode() if isinstance(value, bytes) else value


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
                self.last_id = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
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
