"""A batch file of any size, run in waves: its lines fed into the queue as it drains, its
results appended to the file store as they end. Used by the gateway (``batch_runner.py``) and
by ``genq batch``; whichever of them is alive runs a batch's rounds (``run_round``).

A wave batch's input stays in the file store. Redis holds its record (``Keys.batch``), the
requests fed and not yet written out (``Keys.batch_open``, at most ``window``), those that
ended (``Keys.batch_done``, pushed where each ends), the error-file lines waiting to be written
(``Keys.batch_rejected``), and who runs its rounds now
(``Keys.batch_lease``). One round:

1. **Feed**: while fewer than ``window`` of its requests are in Redis, read the next lines from
   the file (from the byte ``offset`` the record keeps), submit the valid ones (ids
   ``BATCH-LINE``: a line submitted twice is one request) and move the offset on with
   ``FEED``, which does it only if the offset is still the one the round read from: two
   feeders, or one that crashed between its submit and its write, never feed a line twice or
   skip one. A full queue (``--max-queue-depth``, a tenant's ``max_queued``) is waited out.
2. **Collect**: the requests that ended (``Keys.batch_done``), and the refused lines, are
   planned as one part (the record's ``plan``: its number and ids), written to the store as
   ``batches/B/output/NNNNNNNNN.jsonl`` and ``.../errors/...`` (create-only: written once, whoever
   tries again), then ``COMMIT`` drops them from Redis (states included: a batch's results
   do not wait for the result TTL) if the plan is still the record's. A crash between the two
   writes the same part again, which the store refuses, and commits.

A batch is finished when nothing is left to feed (``feeding`` 0: the file ended, or it was
cancelled or expired) and every line fed has been written out (``collected`` = ``fed``): then
it leaves ``Keys.batches_running`` and its webhook event is sent. Past its completion window it
expires (OpenAI's semantics): its requests still open are cancelled and the lines never fed
go to the error file as ``batch_expired``.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import orjson
from genq.common import script_calls
from genq.common.connection import is_cluster
from genq.common.errors import GenqError, InvalidRequest, RequestNotFound, SubmitFailed
from genq.common.lua.batch_waves import COMMIT, FEED, STOP
from genq.common.wire import as_text
from genq.producer.client import Client
from genq.producer.gateway.batch_lines import (
    BatchLine,
    LineTemplate,
    RejectedLine,
    custom_id_of,
    expired_line,
    output_line,
    parse_line,
    plain_output_line,
    rejected_output,
)
from genq.producer.gateway.file_store import (
    READ_CHUNK_BYTES,
    FileStore,
    StoredFileMissing,
)
from genq.producer.gateway.repeated_ids import parse_repeats
from genq.producer.waiting import parse_stored

DEFAULT_WINDOW = 10_000
"""A batch's requests in Redis at once, by default (``--batch-window``): enough to keep a big
fleet busy, few enough that a million-line batch costs Redis megabytes, not gigabytes."""
PART_LINES = 2_000
"""Most lines one output (or error) part holds: a round writes one part."""
MIN_READ_BYTES = 64 << 10
"""The least a round reads of its file at a time (about what its lines take, else)."""
FEED_STEP = 5_000
"""Most lines a round feeds (a round writes out a part meanwhile): half the default window, so
that any batch fills its window within two rounds, and Redis holds about the same for a batch
of 10,000 lines as for one of a million (with waves of 2,000 the small one's peak was half the
big one's: it ran out before its window filled); rounds stay short (~0.15 s of reading)."""
LEASE_MS = 5_000
"""How long a process holds a batch's rounds without renewing its lease."""
CHECK_FILE_EVERY_S = 5.0
"""How often a batch whose window is full checks that its file is still in the store."""
MAX_LINE_BYTES = 4_000_000
"""Longest line ``genq batch submit`` takes (the gateway's default ``--max-body-bytes``)."""
WINDOW_RE = re.compile(r"^([1-9][0-9]*)([smhd])$")
UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def window_seconds(window: str) -> int:
    """A completion window (``24h``; genq also takes ``30m``, ``90s``, ``7d``) in seconds;
    InvalidRequest for anything else."""
    found = WINDOW_RE.match(window) if isinstance(window, str) else None
    if found is None:
        raise InvalidRequest(
            f"completion_window is a duration such as '24h' (also '30m', '90s', '7d'), "
            f"got {window!r}"
        )
    return int(found.group(1)) * UNIT_S[found.group(2)]


def part_name(batch_id: str, kind: str, seq: int) -> str:
    """Where part ``seq`` of a batch's output (``kind`` 'output') or error file is."""
    return f"batches/{batch_id}/{kind}/{seq:09d}.jsonl"


@dataclass(frozen=True, kw_only=True)
class WaveBatch:
    """What a wave batch is made from: its input in the store and how it runs."""

    id: str
    path: str
    """Its input file in the store."""
    lines: int
    """Its lines that are not blank."""
    source: str
    endpoint: str
    priority: str = "normal"
    tenant: str = "default"
    window: int = DEFAULT_WINDOW
    completion_window: str = "24h"
    metadata: Mapping[str, str] = field(default_factory=dict)
    model: str = ""
    repeats: Mapping[int, int] = field(default_factory=dict)
    """Its lines that repeat an earlier line's ``custom_id`` (``repeated_ids.py``): each one's
    first line. They are error lines; the first ones run."""


def new_batch_id() -> str:
    """A fresh batch id (usable in request ids and key names): wave batches' and the others'."""
    return "batch_" + uuid.uuid4().hex[:20]


def create(client: Client, store: FileStore, batch: WaveBatch) -> bool:
    """Record a wave batch (False if one with its id exists: it is not made twice) and add it
    to the queue's running batches; its rounds feed it."""
    keys, ttl_s = client.keys, client.result_ttl_s
    now = int(time.time())
    rec = keys.batch(batch.id)
    record: Any = {
        "id": batch.id,
        "queue": keys.queue,
        "tenant": batch.tenant,
        "created_at": now,
        "expires_at": now + ttl_s,
        "window_ends_at": now + window_seconds(batch.completion_window),
        "completion_window": batch.completion_window,
        "total": batch.lines,
        "input": batch.source,
        "endpoint": batch.endpoint,
        "priority": batch.priority,
        "metadata": json.dumps(dict(batch.metadata)),
        "model": batch.model,
        "cancelled": 0,
        "refused": 0,
        "counted": 1,
        "open": batch.lines,
        "waves": 1,
        "store": store.where,
        "path": batch.path,
        "window": batch.window,
        "offset": 0,
        "line": 0,
        "fed": 0,
        "collected": 0,
        "parts": 0,
        "feeding": 1 if batch.lines else 0,
    }
    if batch.repeats:
        record["repeats"] = json.dumps(dict(batch.repeats))
    if not client.redis.hsetnx(rec, "id", batch.id):
        return False
    pipe = client.redis.pipeline(transaction=True)
    pipe.hset(rec, mapping=record)
    pipe.expire(rec, ttl_s)
    pipe.zadd(keys.batches, {batch.id: now})
    if batch.lines:
        pipe.sadd(keys.batches_running, batch.id)
    else:  # nothing to run: it failed as it came
        pipe.hset(rec, "finished_at_ms", now * 1000)
        if not is_cluster(client.redis):
            event = {"type": "batch.failed", "id": batch.id, "tenant": batch.tenant}
            pipe.xadd(keys.webhook_events, event)  # type: ignore[arg-type]
    pipe.execute()
    return True


def record_of(client: Client, batch_id: str) -> dict[str, str]:
    """A batch's record (empty: none)."""
    raw: Any = client.redis.hgetall(client.keys.batch(batch_id))
    return {as_text(k): as_text(v) for k, v in raw.items()}


def _hooks(client: Client) -> str:
    return "0" if is_cluster(client.redis) else "1"


@dataclass
class Round:
    """What one round did: lines fed (requests submitted), refused, lines written out."""

    fed: int = 0
    refused: list[RejectedLine] = field(default_factory=list)
    written: int = 0
    finished: bool = False


def feed(client: Client, store: FileStore, batch_id: str, rec: Mapping[str, str]) -> Round:
    """Feed the batch's next lines while its window has room (one round)."""
    done = Round()
    if rec.get("feeding") != "1":
        return done
    expired = rec.get("expired") == "1"
    if not expired and time.time() >= int(rec.get("window_ends_at") or 0):
        expire(client, batch_id)
        return done
    r, keys = client.redis, client.keys
    pipe = r.pipeline(transaction=False)
    pipe.hlen(keys.batch_open(batch_id))
    pipe.llen(keys.batch_rejected(batch_id))
    waiting = sum(int(n) for n in pipe.execute())
    room = min(int(rec.get("window") or DEFAULT_WINDOW) - waiting, FEED_STEP)
    if room <= 0:  # nothing to read now; but a file deleted meanwhile is noticed
        if _due(batch_id) and store.size(rec["path"]) is None:
            raise StoredFileMissing(f"{rec['path']!r} is not in the file store {store.where!r}")
        return done
    read = _read(store, batch_id, rec, room)
    done.refused = read.refused
    good = read.good
    if good and not rec.get("model") and good[0].model:
        r.hset(keys.batch(batch_id), "model", good[0].model)
    if good and not rec.get("endpoint"):  # a file of several endpoints: its first one's
        r.hset(keys.batch(batch_id), "endpoint", good[0].url)
    fits = _submit_what_fits(client, read)
    if fits is None:  # the queue (or the tenant's share of it) is full: wait for room
        return Round()
    offset = int(rec.get("offset") or 0)
    args: list[Any] = [offset, fits.end, fits.number, fits.fed, int(fits.ended), _hooks(client)]
    args += [x for g in fits.good for x in (g.prepared.id, g.url)] + fits.errors
    states = [keys.result(g.prepared.id) for g in fits.good]
    script_keys = _batch_keys(client, batch_id) + states
    if not script_calls.call(client.redis, FEED, len(script_keys), *script_keys, *args):
        return Round()  # another process fed these lines first
    done.fed = len(fits.good)
    done.refused = [x for x in read.refused if x.line <= fits.number]
    return done


@dataclass
class _Lines:
    """What one round read from a batch's file: its valid lines (``good``), the error-file
    lines of the others, where it stopped (byte ``end``, line ``number``), the lines that were
    not blank (``fed``), whether the file ended; and after each valid line, where it was
    (``marks``: line, end, fed, errors), to cut the round there."""

    good: list[BatchLine] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    refused: list[RejectedLine] = field(default_factory=list)
    marks: list[tuple[int, int, int, int]] = field(default_factory=list)
    end: int = 0
    number: int = 0
    fed: int = 0
    ended: bool = True


def _read(store: FileStore, batch_id: str, rec: Mapping[str, str], room: int) -> _Lines:
    """The next lines of the batch's file, until ``room`` lines that are not blank."""
    out = _Lines(end=int(rec.get("offset") or 0), number=int(rec.get("line") or 0))
    expired, endpoint = rec.get("expired") == "1", rec.get("endpoint") or None
    priority, tenant = rec.get("priority", "normal"), rec.get("tenant", "default")
    fed = int(rec.get("fed") or 0)
    templates: dict[str, LineTemplate | None] = {}
    twice = parse_repeats(rec.get("repeats", ""))
    per_line = out.end / fed if fed else 1024  # the file's lines so far, on average
    chunk = max(MIN_READ_BYTES, min(READ_CHUNK_BYTES, int(per_line * room * 1.1)))
    for at, raw in store.lines(rec["path"], out.end, chunk):
        out.end, out.number = at, out.number + 1
        text = raw.decode("utf-8", "replace")
        if not text.strip():
            continue
        out.fed += 1
        if expired:
            out.errors.append(expired_line(batch_id, out.number, text))
        else:
            try:
                if out.number in twice:
                    cid, first = custom_id_of(text), twice[out.number]
                    raise InvalidRequest(f"custom_id {cid!r} appears twice (line {first} first)")
                line = parse_line(out.number, text, batch_id, priority, endpoint, tenant, templates)
                out.good.append(line)
                out.marks.append((out.number, out.end, out.fed, len(out.errors)))
            except InvalidRequest as err:
                bad = RejectedLine(line=out.number, custom_id=custom_id_of(text), message=str(err))
                out.refused.append(bad)
                out.errors.append(json.dumps(rejected_output(batch_id, bad)))
        if out.fed >= room:
            out.ended = False
            break
    return out


def _submit_what_fits(client: Client, read: _Lines) -> _Lines | None:
    """Submit the round's requests; when the queue cannot take them all (its depth, the
    tenant's share), the most that fit from the first (halving), and the round cut after the
    last of them. None if not even one fits."""
    k = len(read.good)
    while k:
        try:
            client.submit_prepared([g.prepared for g in read.good[:k]])
        except SubmitFailed:
            k //= 2
            continue
        if k == len(read.good):
            return read
        number, end, fed, errors = read.marks[k - 1]
        return _Lines(
            good=read.good[:k],
            errors=read.errors[:errors],
            end=end,
            number=number,
            fed=fed,
            ended=False,
        )
    return read if not read.good else None


_checked: dict[str, float] = {}


def _due(batch_id: str, every_s: float = CHECK_FILE_EVERY_S) -> bool:
    """Whether it is time to check again that a waiting batch's file is still there."""
    now = time.monotonic()
    if now - _checked.get(batch_id, -every_s) < every_s:
        return False
    _checked[batch_id] = now
    return True


def _batch_keys(client: Client, batch_id: str) -> list[str]:
    keys = client.keys
    return [
        keys.batch(batch_id),
        keys.batch_open(batch_id),
        keys.batch_rejected(batch_id),
        keys.webhook_events,
        keys.batches_running,
        keys.batch_done(batch_id),
    ]


def collect(client: Client, store: FileStore, batch_id: str, rec: Mapping[str, str]) -> int:
    """Write one part of the batch's ended requests and refused lines to the store, and drop
    them from Redis; how many lines it held (0: nothing to write now)."""
    r, keys = client.redis, client.keys
    plan = rec.get("plan")
    if plan is None:
        plan = _plan(client, batch_id, int(rec.get("parts") or 0))
        if plan is None:
            return 0
    p = json.loads(plan)
    pairs, taken, seq = p["ids"], int(p["taken"]), int(p["seq"])
    ids = [rid for rid, _ in pairs]
    raws: Any = r.mget([keys.result(i) for i in ids]) if ids else []
    ok: list[str] = []
    errors: list[str] = []
    expired = rec.get("expired") == "1"
    for (rid, url), raw in zip(pairs, raws, strict=True):
        line = _output(rid, url, raw, expired)
        (errors if line["error"] else ok).append(orjson.dumps(line).decode())
    if taken:
        kept: Any = r.lrange(keys.batch_rejected(batch_id), 0, taken - 1)
        errors += [as_text(x) for x in kept]
    for kind, lines in (("output", ok), ("errors", errors)):
        if lines:
            content = "".join(x + "\n" for x in lines).encode()
            store.put(part_name(batch_id, kind, seq), content, create=True)
    args = [plan, taken, int(p["done"]), len(ok), len(errors), _hooks(client), *ids]
    states = [keys.result(i) for i in ids]  # (a wave line writes no event stream)
    script_keys = _batch_keys(client, batch_id) + states
    script_calls.call(r, COMMIT, len(script_keys), *script_keys, *args)
    return len(ids) + taken


def _plan(client: Client, batch_id: str, seq: int) -> str | None:
    """Plan part ``seq``: the requests that ended (first come, at most ``PART_LINES``, those
    still open: an id queued twice is written once) and the error lines waiting; set on the
    record unless another process planned it first. None if there is nothing to write."""
    r, keys = client.redis, client.keys
    pipe = r.pipeline(transaction=False)
    pipe.lrange(keys.batch_done(batch_id), 0, PART_LINES - 1)
    pipe.llen(keys.batch_rejected(batch_id))
    entries, waiting = pipe.execute()
    ids = list(dict.fromkeys(as_text(e) for e in entries))
    urls: Any = r.hmget(keys.batch_open(batch_id), ids) if ids else []
    pairs = [[i, as_text(u)] for i, u in zip(ids, urls, strict=True) if u is not None]
    taken = min(int(waiting), PART_LINES)
    if not entries and not taken:
        return None
    planned = json.dumps({"seq": seq, "ids": pairs, "taken": taken, "done": len(entries)})
    r.hsetnx(keys.batch(batch_id), "plan", planned)
    return as_text(r.hget(keys.batch(batch_id), "plan") or planned)


def _output(rid: str, url: str, raw: Any, expired: bool) -> dict[str, Any]:
    fast = None if raw is None else plain_output_line(rid, url, raw)
    if fast is not None:
        return fast
    state = parse_stored(raw)
    if state is None:
        return {
            "id": f"batch_req_{rid}",
            "custom_id": None,
            "response": None,
            "error": {"code": "state_expired", "message": "its state expired from Redis"},
        }
    line = output_line(rid, url, state)
    if expired and state.status == "cancelled":
        line["error"] = {
            "code": "batch_expired",
            "message": "this request could not be executed before the completion window expired",
        }
    return line


def expire(client: Client, batch_id: str) -> int:
    """The batch's completion window passed: mark it expired (its rounds feed the rest of its
    file as ``batch_expired`` errors) and cancel its open requests; how many."""
    _stop(client, batch_id, "expired")
    return _cancel_open(client, batch_id)


def cancel(client: Client, batch_id: str) -> int:
    """Stop feeding the batch and cancel its open requests; how many."""
    _stop(client, batch_id, "cancelled")
    return _cancel_open(client, batch_id)


def _stop(client: Client, batch_id: str, why: str) -> None:
    keys = client.keys
    stop_keys = [keys.batch(batch_id), keys.webhook_events, keys.batches_running]
    script_calls.call(client.redis, STOP, 3, *stop_keys, why, int(time.time()), _hooks(client))


def _cancel_open(client: Client, batch_id: str) -> int:
    n = 0
    ids: Any = client.redis.hkeys(client.keys.batch_open(batch_id))
    for raw in ids:
        try:
            n += client.cancel(as_text(raw))
        except RequestNotFound:  # expired meanwhile: nothing to cancel
            continue
    return n


def run_round(client: Client, store: FileStore, batch_id: str, owner: str) -> Round | None:
    """One round of the batch (feed a wave, then write out a part of what ended) if ``owner``
    holds its lease
    (taken if free); None if another process does. A batch that is gone or finished leaves the
    running set."""
    r, keys = client.redis, client.keys
    lease = keys.batch_lease(batch_id)
    if not r.set(lease, owner, nx=True, px=LEASE_MS):
        if as_text(r.get(lease) or "") != owner:
            return None
        r.set(lease, owner, xx=True, px=LEASE_MS)
    rec = record_of(client, batch_id)
    if not rec or rec.get("waves") != "1" or rec.get("finished_at_ms"):
        r.srem(keys.batches_running, batch_id)
        return Round(finished=bool(rec))
    if rec.get("store") != store.where:
        raise GenqError(
            f"batch {batch_id!r} reads its file from the store {rec.get('store')!r}, and this "
            f"process's is {store.where!r} (--files-dir)"
        )
    # Feeding and writing out are independent atomic steps (each script checks the record it
    # changes), so a round runs them at once: one waits on Redis or the store while the other
    # parses. Not when the round may stop the batch (its window passed): what it writes out
    # must then see the batch expired.
    at_once = time.time() < int(rec.get("window_ends_at") or 0) or rec.get("feeding") != "1"
    writing = _ROUNDS.submit(collect, client, store, batch_id, rec) if at_once else None
    try:
        done = feed(client, store, batch_id, rec)
    except StoredFileMissing as err:  # deleted while it ran: it fails, saying so
        _stop(client, batch_id, f"its input file is gone from the file store: {err}")
        _cancel_open(client, batch_id)
        done = Round()
    if writing is None:
        done.written = collect(client, store, batch_id, record_of(client, batch_id))
    else:
        done.written = writing.result()
    done.finished = bool(record_of(client, batch_id).get("finished_at_ms"))
    return done


_ROUNDS = ThreadPoolExecutor(max_workers=4, thread_name_prefix="genq-batch-write")
"""Threads that write out a round's part while the round feeds its wave."""
