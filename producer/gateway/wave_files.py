"""A wave batch's files and a command's part in its rounds (``batch_waves.py``): a local file
copied into the file store as a new batch (``genq batch submit``), the rounds run until a
batch reaches a state (``genq batch submit``, ``results``, ``cancel``), and its output and
error parts read back (``GET /v1/files/{id}/content``, ``genq batch results``). A command's
file is checked as it is copied (``LineVerdicts``): one with no request in it makes no batch."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from typing import Any

from genq.common.errors import InvalidRequest
from genq.common.models import DEFAULT_TENANT, tenant_problem
from genq.common.wire import as_text
from genq.producer.client import Client
from genq.producer.gateway.batch_lines import LineTemplate, parse_line
from genq.producer.gateway.batch_waves import (
    DEFAULT_WINDOW,
    MAX_LINE_BYTES,
    Round,
    WaveBatch,
    create,
    new_batch_id,
    record_of,
    run_round,
    window_seconds,
)
from genq.producer.gateway.file_store import (
    READ_CHUNK_BYTES,
    FileStore,
    LineCheck,
    default_files_dir,
    repeats_of,
)
from genq.producer.gateway.repeated_ids import CustomIds


class NotABatchFile(InvalidRequest):
    """A file with no line that is a batch request: no batch is made of it."""


class LineVerdicts:
    """Each line of a batch input file parsed as the feed will parse it, as the file passes
    (``add``, beside ``CustomIds``'): how many are requests, how many are refused, the first
    refused one's number and why, and the first few refused lines' numbers."""

    SHOWN = 5

    def __init__(
        self, batch_id: str, priority: str, endpoint: str | None, tenant: str, ids: CustomIds
    ) -> None:
        self.batch_id = batch_id
        self.lane = (priority, endpoint, tenant)  # (parse_line's, in its order)
        self.ids = ids
        self.good = 0
        self.refused: list[int] = []  # the first ``SHOWN`` refused lines' numbers
        self.refused_count = 0
        self.first_why = ""
        self._templates: dict[str, LineTemplate | None] = {}

    def add(self, number: int, line: bytes) -> None:
        self.ids.add(number, line)
        text = line.decode("utf-8", "replace")
        try:
            parse_line(number, text, self.batch_id, *self.lane, self._templates)
        except InvalidRequest as err:
            self.refused_count += 1
            self.first_why = self.first_why or str(err)
            if len(self.refused) < self.SHOWN:
                self.refused.append(number)
        else:
            self.good += 1

    def where(self) -> str:
        """The refused lines, for one line of a report: 'line 3' or 'lines 3, 8, 9 and 4
        more'."""
        shown = ", ".join(str(n) for n in self.refused)
        more = self.refused_count - len(self.refused)
        tail = f" and {more} more" if more else ""
        return f"line{'s' if self.refused_count > 1 else ''} {shown}{tail}"

    def check(self, name: str) -> None:
        """Raise ``NotABatchFile`` when no line is a request (``name``: the file's, to say)."""
        if self.good:
            return
        if not self.refused_count:
            raise NotABatchFile(f"{name} has no lines: a batch input file is JSON Lines")
        first, others = self.refused[0], self.refused_count - 1
        more = f" (and {others} more line{'s' if others > 1 else ''} like it)" if others else ""
        raise NotABatchFile(
            f"{name} is not a batch input file: line {first}: {self.first_why}{more}"
        )


def run_until(
    client: Client,
    store: FileStore,
    batch_id: str,
    done: Callable[[Mapping[str, str]], bool],
    *,
    timeout_s: float | None = None,
    every: Callable[[Round, Mapping[str, str]], None] | None = None,
    pause_s: float = 0.2,
) -> dict[str, str]:
    """Run the batch's rounds (while this process holds its lease; else wait) until
    ``done(record)`` or ``timeout_s``; the record then."""
    owner = f"cli-{uuid.uuid4().hex[:12]}"
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        did = run_round(client, store, batch_id, owner) or Round()
        rec = record_of(client, batch_id)
        if every is not None:
            every(did, rec)
        if not rec or done(rec) or (deadline is not None and time.monotonic() >= deadline):
            if _holds(client, batch_id, owner):  # let a gateway go on at once
                client.redis.delete(client.keys.batch_lease(batch_id))
            return rec
        if not did.fed and not did.written:
            time.sleep(pause_s)


def _holds(client: Client, batch_id: str, owner: str) -> bool:
    return as_text(client.redis.get(client.keys.batch_lease(batch_id)) or "") == owner


def parts(store: FileStore, batch_id: str, kind: str) -> list[tuple[str, int]]:
    """A wave batch's output (``kind`` 'output') or error parts, in order, with their sizes."""
    return store.listing(f"batches/{batch_id}/{kind}")


def read_parts(store: FileStore, names: list[tuple[str, int]]) -> Iterator[bytes]:
    """The parts' content, one after another, a chunk at a time."""
    for name, size in names:
        start = 0
        while start < size:
            chunk = store.read(name, start)
            if not chunk:
                break
            start += len(chunk)
            yield chunk


def store_of(files_dir: str | None) -> FileStore:
    """The file store at ``files_dir`` (None: the default directory)."""
    return FileStore(files_dir or default_files_dir())


def upload_and_create(
    client: Client,
    store: FileStore,
    path: str,
    *,
    source: str,
    batch_id: str | None = None,
    priority: str = "normal",
    tenant: str = DEFAULT_TENANT,
    endpoint: str | None = None,
    window: int = DEFAULT_WINDOW,
    completion_window: str = "24h",
    max_line_bytes: int = MAX_LINE_BYTES,
    on_verdicts: Callable[[LineVerdicts], None] | None = None,
) -> str:
    """Copy the local file ``path`` ('-': stdin) to the store, a chunk at a time, checking its
    lines (``LineVerdicts``, handed to ``on_verdicts``), and record its wave batch; the batch's
    id. A file with no request in it is deleted and refused (``NotABatchFile``), no batch made.
    A ``batch_id`` already recorded is not made again (its rounds go on where they stopped)."""
    problem = tenant_problem(tenant)
    if problem is not None:
        raise InvalidRequest(problem)
    window_seconds(completion_window)
    bid = batch_id or new_batch_id()
    if client.redis.exists(client.keys.batch(bid)):
        return bid
    name = f"uploads/{bid}.jsonl"
    ids = CustomIds()
    verdicts = LineVerdicts(bid, priority, endpoint, tenant, ids)
    check = LineCheck(max_bytes=1 << 62, max_line_bytes=max_line_bytes, ids=verdicts)
    with click_open(path) as f:

        async def chunks() -> AsyncIterator[bytes]:
            while chunk := f.read(READ_CHUNK_BYTES):  # this loop runs nothing else meanwhile
                yield chunk

        asyncio.run(store.upload(name, chunks(), check))
    try:
        verdicts.check(source)
    except NotABatchFile:
        store.delete(name)
        raise
    if on_verdicts is not None:
        on_verdicts(verdicts)
    wave = WaveBatch(
        repeats=repeats_of(store, name, ids),
        id=bid,
        path=name,
        lines=check.lines,
        source=source,
        endpoint=endpoint or "",
        priority=priority,
        tenant=tenant,
        window=window,
        completion_window=completion_window,
    )
    create(client, store, wave)
    return bid


def click_open(path: str) -> Any:
    """``path`` opened for binary reading ('-': stdin)."""
    import sys

    return open(sys.stdin.fileno(), "rb", closefd=False) if path == "-" else open(path, "rb")
