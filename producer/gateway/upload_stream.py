"""An upload's multipart body read as it arrives (``UploadStream``): its small fields kept, its
one file handed on chunk by chunk (to the file store), so a file of gigabytes passes through the
gateway without being held in memory or spooled to its disk.

python-multipart's streaming parser does the parsing; this module only routes what it finds:
fields (at most ``MAX_FIELDS``, each up to ``max_field_bytes``) into ``fields``, and the one part
with a filename into ``file_chunks()``. The body's total is bounded before it gets here
(``body_limit.py``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from genq.common.errors import InvalidRequest
from python_multipart.exceptions import MultipartParseError
from python_multipart.multipart import MultipartParser, parse_options_header

MAX_FIELDS = 8
"""Most multipart fields (the file included) one upload may have."""


class UploadStream:
    """The multipart body of ``stream`` (``content_type`` gives its boundary). Call
    ``until_file()`` first, then read ``file_chunks()`` to the end; ``fields`` then holds every
    small field, wherever it was in the body. Raises InvalidRequest for a body that is not
    multipart, a second file, too many or too big fields."""

    def __init__(
        self, stream: AsyncIterator[bytes], content_type: str, *, max_field_bytes: int
    ) -> None:
        kind, options = parse_options_header(content_type)
        boundary = options.get(b"boundary")
        if kind != b"multipart/form-data" or not boundary:
            raise InvalidRequest("an upload is multipart/form-data (fields 'file' and 'purpose')")
        self.fields: dict[str, str] = {}
        self.filename: str | None = None
        self.file_field: str | None = None
        self._stream = stream
        self._max_field_bytes = max_field_bytes
        self._parts = 0
        self._headers: dict[bytes, bytes] = {}
        self._header = [b"", b""]
        self._name: str | None = None
        self._value = bytearray()
        self._in_file = False
        self._file_seen = False
        self._out: list[bytes] = []
        self._ended = False
        callbacks: Any = {
            "on_part_begin": self._part_begin,
            "on_header_field": lambda d, s, e: self._header.__setitem__(
                0, self._header[0] + d[s:e]
            ),
            "on_header_value": lambda d, s, e: self._header.__setitem__(
                1, self._header[1] + d[s:e]
            ),
            "on_header_end": self._header_end,
            "on_headers_finished": self._headers_finished,
            "on_part_data": self._part_data,
            "on_part_end": self._part_end,
        }
        self._parser = MultipartParser(boundary, callbacks)

    def _part_begin(self) -> None:
        self._parts += 1
        if self._parts > MAX_FIELDS:
            raise InvalidRequest(f"an upload has at most {MAX_FIELDS} fields")
        self._headers, self._name, self._value = {}, None, bytearray()

    def _add_header(self, which: int, data: bytes) -> None:
        self._header[which] += data
        if len(self._header[which]) > self._max_field_bytes:
            raise InvalidRequest("a header of an upload's part is too long")

    def _header_end(self) -> None:
        self._headers[self._header[0].lower()] = self._header[1]
        self._header = [b"", b""]

    def _headers_finished(self) -> None:
        _, options = parse_options_header(self._headers.get(b"content-disposition", b""))
        self._name = options.get(b"name", b"").decode("utf-8", "replace")
        if b"filename" in options:
            if self._file_seen:
                raise InvalidRequest("an upload carries one file")
            self._file_seen = self._in_file = True
            self.filename = options[b"filename"].decode("utf-8", "replace")
            self.file_field = self._name

    def _part_data(self, data: bytes, start: int, end: int) -> None:
        if self._in_file:
            self._out.append(bytes(data[start:end]))
            return
        self._value += data[start:end]
        if len(self._value) > self._max_field_bytes:
            raise InvalidRequest(f"a field of an upload is over {self._max_field_bytes} bytes")

    def _part_end(self) -> None:
        if self._in_file:
            self._in_file = False
        elif self._name is not None:
            self.fields[self._name] = self._value.decode("utf-8", "replace")

    async def _feed(self) -> bool:
        """Parse the next piece of the body; False at its end."""
        if self._ended:
            return False
        try:
            async for chunk in self._stream:
                if chunk:
                    self._parser.write(chunk)
                    return True
            self._parser.finalize()
        except MultipartParseError as err:
            raise InvalidRequest(f"the upload is not a valid multipart body: {err}") from None
        self._ended = True
        return False

    async def until_file(self) -> bool:
        """Read on until the file's part starts (True) or the body ends without one."""
        while not self._file_seen:
            if not await self._feed():
                return False
        return True

    async def file_chunks(self) -> AsyncIterator[bytes]:
        """The file's bytes as they arrive; then the rest of the body is read (its fields)."""
        while True:
            while self._out:
                yield self._out.pop(0)
            if not self._in_file:
                break
            if not await self._feed():
                raise InvalidRequest("the upload ended inside its file")
        while await self._feed():  # fields after the file
            self._out.clear()
