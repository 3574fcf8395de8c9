"""Batch lines that repeat an earlier line's ``custom_id``, found as a file is uploaded.

A batch's output is joined to its input by ``custom_id``, so each must be unique (OpenAI's
rule). A wave batch reads its file a window at a time and never holds every id, so the check
is made once, on the upload's own pass over the bytes, in about 12 bytes a line:

1. ``CustomIds.add`` keeps a 64-bit hash of each line's ``custom_id`` with the line's number,
   in 256 ``array`` buckets (no Python object per line);
2. ``CustomIds.candidates`` sorts each bucket alone and gives the lines whose hash another
   line has too (none, for a usual file: nothing more is done);
3. ``repeats`` reads only those lines' ids back from the stored file and keeps the exact
   repeats: ``{line: first line with its custom_id}``, the first occurrence running and each
   later one an error line (``custom_id 'x' appears twice``, as for a batch kept in Redis).

A file with more than ``MAX_REPEATS`` repeated lines is refused at upload: its record would
otherwise grow with the file. Pure: no Redis; the store is read through a function given in.
"""

from __future__ import annotations

import functools
import itertools
import json
import re
from array import array
from collections.abc import Iterable, Iterator

import orjson

MAX_REPEATS = 10_000
"""The most lines of one file that may repeat an earlier line's ``custom_id`` (each is an
error line of its batch); a file with more is refused at upload."""
_FIRST_KEY = re.compile(rb'\A\s*\{\s*"custom_id"\s*:\s*"((?:[^"\\]|\\.)*)"')
"""A line whose first key is its ``custom_id`` (the usual writers' order): read without
parsing the whole line."""
_MASK = (1 << 64) - 1


def custom_id(line: bytes) -> str | None:
    """The ``custom_id`` of a batch line's bytes (None: not a JSON object with a string one;
    such a line is refused when it is fed, and repeats nothing)."""
    found = _FIRST_KEY.match(line) if line.count(b'"custom_id"') == 1 else None
    if found is not None:  # (a key given twice: parsed whole, as the feeder parses it)
        raw = found.group(1)
        if b"\\" not in raw:
            return raw.decode("utf-8", "replace")
        try:
            value = orjson.loads(b'"' + raw + b'"')
        except orjson.JSONDecodeError:
            return None
        return value if isinstance(value, str) else None
    try:
        item = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None
    value = item.get("custom_id") if isinstance(item, dict) else None
    return value if isinstance(value, str) else None


class CustomIds:
    """Each line's ``custom_id`` hash and number, as an upload passes (``add``)."""

    def __init__(self) -> None:
        self._hashes = [array("Q") for _ in range(256)]
        self._lines = [array("L") for _ in range(256)]

    def add(self, number: int, line: bytes) -> None:
        """Line ``number`` (1-based, blank lines counted) has passed."""
        cid = custom_id(line)
        if cid is None:
            return
        h = hash(cid) & _MASK
        self._hashes[h >> 56].append(h)
        self._lines[h >> 56].append(number)

    def candidates(self) -> set[int]:
        """The lines whose hash another line has (each one: the first too); usually none."""
        out: set[int] = set()
        for hashes, lines in zip(self._hashes, self._lines, strict=True):
            ordered = sorted(hashes)
            twice = {a for a, b in itertools.pairwise(ordered) if a == b}
            if twice:
                out.update(n for h, n in zip(hashes, lines, strict=True) if h in twice)
        return out


def repeats(lines: Iterable[tuple[int, bytes]], candidates: set[int]) -> dict[int, int]:
    """Of the numbered ``lines`` (the stored file's, in order), the candidates that repeat an
    earlier line's ``custom_id`` exactly: ``{line: the first line with that id}``."""
    first: dict[str, int] = {}
    out: dict[int, int] = {}
    left = len(candidates)
    for number, line in lines:
        if number not in candidates:
            continue
        cid = custom_id(line)
        if cid is not None:
            if cid in first:
                out[number] = first[cid]
            else:
                first[cid] = number
        left -= 1
        if not left:
            break
    return out


def numbered(lines: Iterable[tuple[int, bytes]]) -> Iterator[tuple[int, bytes]]:
    """A store's ``(offset, line)`` pairs as ``(line number, line)``."""
    for number, (_, line) in enumerate(lines, start=1):
        yield number, line


@functools.lru_cache(maxsize=16)
def parse_repeats(text: str) -> dict[int, int]:
    """A batch record's ``repeats`` (JSON: line -> first line) as numbers; {} if it has none."""
    return {int(k): int(v) for k, v in json.loads(text).items()} if text else {}


def too_many(found: dict[int, int]) -> str | None:
    """Why a file with these repeats is refused (None: it is not)."""
    if len(found) <= MAX_REPEATS:
        return None
    line = min(found)
    return (
        f"{len(found)} lines repeat an earlier line's custom_id (the first: line {line} "
        f"repeats line {found[line]}'s), more than {MAX_REPEATS}: each line's custom_id "
        "must be unique"
    )
