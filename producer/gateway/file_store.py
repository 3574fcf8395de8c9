"""Where batch files live (files outside Redis): ``FileStore``, a local directory by default
or an object store by URL (``s3://bucket/prefix``, and S3-compatible stores), through obstore.

Redis keeps only each file's record (``Keys.file``: its name, size, owner and where it is);
the bytes are here, so a file may be gigabytes (``genq serve --max-file-bytes``) without costing
Redis anything. Gateways on several hosts share files by naming the same object store.

- **Atomic writes.** A file is written whole or not at all: an upload that fails (too big, not
  UTF-8, a line over the limit, the store full or gone) leaves nothing behind (obstore's puts
  are atomic; a multipart upload that raises is aborted).
- **Streamed.** Uploads go to the store in chunks (``upload``) and files are read back in
  chunks (``chunks``, ``lines``): no file is ever held whole in a gateway's memory.
- **One clear error.** What the store refuses or cannot answer becomes ``StoreError`` with one
  line saying which store and why (a full disk, an unreachable endpoint), never a traceback;
  an unreachable store fails within ``--files-timeout-s``, it does not hang.

An S3 store takes its credentials, endpoint and region from the usual ``AWS_*`` environment
variables (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_ENDPOINT_URL``,
``AWS_REGION``; ``AWS_ALLOW_HTTP=true`` for a plain-HTTP endpoint such as a local MinIO).
"""

from __future__ import annotations

import datetime
import os
from collections.abc import AsyncIterator, Iterator
from typing import Any, Protocol

from genq.common.errors import GenqError
from genq.producer.gateway.repeated_ids import CustomIds, numbered, repeats, too_many

READ_CHUNK_BYTES = 4 << 20
"""How much of a file one read from the store brings."""
PART_BYTES = 8 << 20
"""The size of each part of a multipart upload to an object store."""


class StoreError(GenqError):
    """The file store refused or could not be reached (full, unreachable, no permission)."""

    code = "file_store_error"


class StoredFileMissing(StoreError):
    """A file the records name is not in the store (deleted from under genq)."""

    code = "file_missing"


class UploadRefused(GenqError):
    """An upload's content broke a rule (too big, not UTF-8, a line over the limit): nothing was
    stored."""

    code = "invalid_file"


class FileTooLarge(UploadRefused):
    """An upload passed ``--max-file-bytes`` (answered 413)."""

    code = "file_too_large"


def default_files_dir() -> str:
    """Where files go when ``--files-dir`` is not given: ``$XDG_DATA_HOME/genq/files``
    (``~/.local/share/genq/files``)."""
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local/share")
    return os.path.join(base, "genq", "files")


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return text[0] if text else type(err).__name__


class LineSink(Protocol):
    """What is handed each line of an upload as it passes (``CustomIds``, ``LineVerdicts``)."""

    def add(self, number: int, line: bytes) -> None: ...


class LineCheck:
    """Checks an upload's bytes as they pass: UTF-8, and no line over ``max_line_bytes``;
    counts its bytes and its lines (those that are not blank: ``lines``); with ``ids``, hands
    each line to it (``repeated_ids.CustomIds``: lines that repeat a ``custom_id``). ``feed``
    raises ``UploadRefused`` at the first problem."""

    def __init__(self, *, max_bytes: int, max_line_bytes: int, ids: LineSink | None = None) -> None:
        self.max_bytes, self.max_line_bytes = max_bytes, max_line_bytes
        self.ids = ids
        self._parts: list[bytes] = []  # the line so far (with ``ids`` only)
        self.bytes = 0
        self.lines = 0
        """Its lines that are not blank (a batch's lines: each one a request, or refused)."""
        self.number = 0
        """Its lines, blank ones included (the last line's number)."""
        self._line_bytes = 0
        self._text = False
        self._tail = b""  # an unfinished UTF-8 sequence at a chunk's end

    def feed(self, chunk: bytes) -> None:
        self.bytes += len(chunk)
        if self.bytes > self.max_bytes:
            raise FileTooLarge(
                f"the file is over {self.max_bytes} bytes (genq serve --max-file-bytes)"
            )
        data = self._tail + chunk
        try:
            data.decode("utf-8")
            self._tail = b""
        except UnicodeDecodeError as err:
            if err.start < len(data) - 3 or err.reason != "unexpected end of data":
                raise UploadRefused(
                    f"the file is not UTF-8 text (line {self.number + 1}): a batch input file "
                    "is JSON Lines"
                ) from None
            self._tail = data[err.start :]
        start = 0
        while True:
            end = chunk.find(b"\n", start)
            piece = chunk[start:] if end < 0 else chunk[start:end]
            self._line_bytes += len(piece)
            self._text = self._text or bool(piece.strip())
            if self.ids is not None:
                self._parts.append(piece)
            if self._line_bytes > self.max_line_bytes:
                raise UploadRefused(
                    f"line {self.number + 1} is over {self.max_line_bytes} bytes (genq serve "
                    "--max-body-bytes: one line is one request's body)"
                )
            if end < 0:
                return
            self._end_line()
            start = end + 1

    def _end_line(self) -> None:
        self.number += 1
        self.lines += self._text
        if self.ids is not None:
            if self._text:
                line = self._parts[0] if len(self._parts) == 1 else b"".join(self._parts)
                self.ids.add(self.number, line)
            self._parts.clear()
        self._line_bytes, self._text = 0, False

    def finish(self) -> None:
        """The upload ended: a last line without its newline counts too."""
        if self._tail:
            raise UploadRefused("the file is not UTF-8 text (it ends inside a character)")
        if self._line_bytes:
            self._end_line()


class FileStore:
    """A directory or an object store holding batch files by name (``where``: a path, or a
    URL such as ``s3://bucket/prefix``)."""

    def __init__(self, where: str, *, timeout_s: float = 30.0) -> None:
        self.where = where
        self.timeout_s = timeout_s
        self._store: Any = None

    @property
    def store(self) -> Any:
        """The obstore store, made on first use (raises StoreError for a bad URL)."""
        if self._store is None:
            self._store = self._open()
        return self._store

    def _open(self) -> Any:
        try:
            from obstore.store import LocalStore, from_url
        except ImportError:  # pragma: no cover - the serve extra installs it
            raise StoreError("batch files need obstore: pip install 'genq[serve]'") from None
        try:
            if "://" not in self.where:
                return LocalStore(os.path.abspath(self.where), mkdir=True)
            timeout = f"{max(1, round(self.timeout_s))}s"
            retry: Any = {
                "max_retries": 2,
                "retry_timeout": datetime.timedelta(seconds=self.timeout_s),
                "backoff": {
                    "init_backoff": datetime.timedelta(milliseconds=100),
                    "max_backoff": datetime.timedelta(seconds=2),
                    "base": 2,
                },
            }
            options: Any = {"timeout": timeout, "connect_timeout": timeout}
            if os.environ.get("AWS_ALLOW_HTTP", "").lower() in ("1", "true"):
                options["allow_http"] = True  # client options given: the env's is not read
            return from_url(self.where, client_options=options, retry_config=retry)
        except Exception as err:
            raise StoreError(f"the file store {self.where!r}: {_first_line(err)}") from None

    def _error(self, err: BaseException, name: str) -> GenqError:
        if isinstance(err, GenqError):
            return err
        if isinstance(err, FileNotFoundError):
            return StoredFileMissing(f"{name!r} is not in the file store {self.where!r}")
        return StoreError(f"the file store {self.where!r} failed on {name!r}: {_first_line(err)}")

    async def upload(
        self, name: str, chunks: AsyncIterator[bytes], check: LineCheck | None = None
    ) -> None:
        """Write ``name`` from ``chunks`` (each passed through ``check``): whole, or not at all
        (UploadRefused or StoreError)."""
        import obstore

        failed: list[BaseException] = []  # what the chunks themselves raised

        async def checked() -> AsyncIterator[bytes]:
            try:
                async for chunk in chunks:
                    if check is not None:
                        check.feed(chunk)
                    yield chunk
                if check is not None:
                    check.finish()
            except BaseException as err:
                failed.append(err)
                raise

        try:
            await obstore.put_async(self.store, name, checked(), chunk_size=PART_BYTES)
        except Exception as err:  # the put is aborted: nothing of it stays
            if failed:
                raise failed[0] from None
            raise self._error(err, name) from None

    def put(self, name: str, data: bytes, *, create: bool = False) -> bool:
        """Write ``name`` whole; with ``create``, only if it is not there yet (False if it was:
        written once, whoever tries again)."""
        import obstore
        from obstore.exceptions import AlreadyExistsError

        try:
            obstore.put(self.store, name, data, mode="create" if create else "overwrite")
        except AlreadyExistsError:
            return False
        except Exception as err:
            raise self._error(err, name) from None
        return True

    def size(self, name: str) -> int | None:
        """The size of ``name`` in bytes, or None if it is not there."""
        import obstore

        try:
            return int(obstore.head(self.store, name)["size"])
        except FileNotFoundError:
            return None
        except Exception as err:
            raise self._error(err, name) from None

    async def chunks(self, name: str) -> AsyncIterator[bytes]:
        """The content of ``name``, a chunk at a time."""
        import obstore

        try:
            found = await obstore.get_async(self.store, name)
            async for chunk in found.stream(min_chunk_size=READ_CHUNK_BYTES):
                yield bytes(chunk)
        except Exception as err:
            raise self._error(err, name) from None

    def read(self, name: str, start: int = 0, length: int = READ_CHUNK_BYTES) -> bytes:
        """Up to ``length`` bytes of ``name`` from byte ``start`` (b"" past its end)."""
        import obstore

        try:
            found = obstore.get(self.store, name, options={"range": {"offset": start}})
            if length >= found.meta["size"] - start:
                return bytes(found.bytes())
            return bytes(obstore.get_range(self.store, name, start=start, length=length))
        except Exception as err:
            if "range" in str(err).lower() and start > 0:  # at or past its end
                return b""
            raise self._error(err, name) from None

    def lines(
        self, name: str, start: int = 0, chunk_bytes: int = READ_CHUNK_BYTES
    ) -> Iterator[tuple[int, bytes]]:
        """The lines of ``name`` from byte ``start`` (a line's first byte), each with the byte
        offset just after it (where to start again to read on from the next one); read
        ``chunk_bytes`` at a time (a reader that wants a few lines reads little)."""
        offset, rest = start, b""
        while True:
            chunk = self.read(name, offset, chunk_bytes)
            if not chunk:
                if rest:
                    yield offset, rest
                return
            offset += len(chunk)
            data = rest + chunk
            pieces = data.split(b"\n")
            rest = pieces.pop()
            at = offset - len(data)
            for piece in pieces:
                at += len(piece) + 1
                yield at, piece

    def delete(self, name: str) -> None:
        """Remove ``name`` (nothing if it is not there)."""
        import obstore

        try:
            obstore.delete(self.store, name)
        except FileNotFoundError:
            return
        except Exception as err:
            raise self._error(err, name) from None

    def names(self, prefix: str) -> list[str]:
        """The names under ``prefix`` (a folder), sorted."""
        return [name for name, _ in self.listing(prefix)]

    def listing(self, prefix: str) -> list[tuple[str, int]]:
        """The names under ``prefix`` (a folder) with their sizes, sorted by name."""
        import obstore

        try:
            found = obstore.list(self.store, prefix).collect()
        except FileNotFoundError:
            return []
        except Exception as err:
            raise self._error(err, prefix) from None
        return sorted((str(meta["path"]), int(meta["size"])) for meta in found)


def repeats_of(store: FileStore, name: str, ids: CustomIds) -> dict[int, int]:
    """The lines of the stored file ``name`` that repeat an earlier line's ``custom_id``
    (``{line: first line}``; ``ids`` saw its upload pass): the file is read back only when
    some hashes matched. Too many: the file is deleted and ``UploadRefused``."""
    candidates = ids.candidates()
    if not candidates:
        return {}
    found = repeats(numbered(store.lines(name)), candidates)
    why = too_many(found)
    if why is not None:
        store.delete(name)
        raise UploadRefused(why)
    return found
