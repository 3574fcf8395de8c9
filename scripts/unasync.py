"""Writes the synchronous client (``producer/client.py``) from the asyncio one
(``producer/aio.py``): the two had the same ~200 lines twice, kept equal by hand. Now
``aio.py`` is the one to edit; run ``python scripts/unasync.py`` after, and
``tests/test_client.py`` fails while ``client.py`` differs from what this writes (the way
httpcore keeps its sync twin).

The rewrite is textual and small on purpose: ``async``/``await`` dropped, redis.asyncio's
names for redis-py's, the asyncio helpers of ``genq.common`` for their sync twins, then
``ruff format``.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "producer" / "aio.py"
TARGET = ROOT / "producer" / "client.py"

ASYNC_HEADER = (
    '"""The asyncio client: the same API as Client, on redis.asyncio.\n\n'
    "The synchronous client (``client.py``) is written from this file by "
    "``scripts/unasync.py``:\nedit this one, then run the script."
    '"""'
)
HEADER = (
    '"""The synchronous client: the same API as AsyncClient (``aio.py``), on redis-py.\n\n'
    "Written from ``aio.py`` by ``scripts/unasync.py``: edit that file, then run the script (a\n"
    'test fails while the two differ)."""'
)
REPLACEMENTS = (
    ("import asyncio\n", "import time\n"),
    (
        "from collections.abc import AsyncIterator, Iterable, Mapping, Sequence",
        "from collections.abc import Iterable, Iterator, Mapping, Sequence",
    ),
    ("import redis.asyncio as aioredis", "import redis"),
    ("aioredis.Redis", "redis.Redis"),
    ("connect_async", "connect"),
    ("refresh_cluster_view_async", "refresh_cluster_view"),
    ("script_calls.execute_async", "script_calls.execute"),
    ("script_calls.call_async", "script_calls.call"),
    ("AsyncClient", "Client"),
    ("self.redis.aclose()", "self.redis.close()"),
    ("__aenter__", "__enter__"),
    ("__aexit__", "__exit__"),
    ("asyncio.sleep", "time.sleep"),
    ("AsyncIterator[", "Iterator["),
    (
        "for item in reader.take(response):  # type: ignore[arg-type]\n                yield item",
        "yield from reader.take(response)  # type: ignore[arg-type]",
    ),
    (ASYNC_HEADER.replace("AsyncClient", "Client"), HEADER),  # last: the others rename in it
)


def sync_source(async_source: str) -> str:
    """The synchronous client's source for this asyncio client's source, formatted."""
    text = async_source
    for old, new in REPLACEMENTS:
        if old not in text:
            raise ValueError(f"scripts/unasync.py: {old!r} is no longer in aio.py")
        text = text.replace(old, new)
    text = re.sub(r"\(await ([^\n]*?)\)\[0\]", r"\1[0]", text)  # (await f(x))[0] -> f(x)[0]
    text = re.sub(r"\basync def\b", "def", text)
    text = re.sub(r"\bawait ", "", text)
    formatted = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--stdin-filename", str(TARGET), "-"],
        input=text,
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    return formatted.stdout


def main() -> None:
    TARGET.write_text(sync_source(SOURCE.read_text()))


if __name__ == "__main__":
    main()
