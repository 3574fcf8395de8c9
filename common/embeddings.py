"""Embeddings on the wire: an embedding request's limits and its inputs' shapes, and the one
encoding of a vector at a result key.

A vector is stored as its float32 values, little-endian, in base64 (``pack``): 4 bytes a
dimension plus a third, against ~11 bytes a dimension as JSON floats. OpenAI's
``encoding_format: base64`` is exactly these bytes, so the gateway hands them on as they are;
``unpack`` gives the floats back (the client's ``embed``, ``encoding_format: float``).
"""

from __future__ import annotations

import base64
import struct
from collections.abc import Sequence
from typing import Annotated, Literal

from pydantic import Field, StringConstraints

MAX_EMBED_INPUTS = 2_048
"""Most inputs in one embedding request (OpenAI's limit)."""
MAX_EMBED_INPUT_CHARS = 200_000
"""Most characters in one input (a worker refuses one over its model's tokens, by
``truncate``)."""
MAX_EMBED_CHARS = 1_200_000
"""Most characters in all of one request's inputs (OpenAI's 300,000 tokens, at 4 a token)."""
MAX_INPUT_TOKEN_IDS = 32_768
"""Most token ids in one input given as ids."""
MAX_DIMENSIONS = 65_536

Truncate = Literal["end", "start", "none"]
"""What a worker does with an input longer than its model takes: drop tokens from the end
(the default, as sentence-transformers and OpenAI do), from the start, or refuse the request
(``none``) with an error that names the input."""
DEFAULT_TRUNCATE: Truncate = "end"

TextInput = Annotated[str, StringConstraints(min_length=1, max_length=MAX_EMBED_INPUT_CHARS)]
TokenInput = Annotated[
    list[Annotated[int, Field(ge=0, le=2**31 - 1)]],
    Field(min_length=1, max_length=MAX_INPUT_TOKEN_IDS),
]
EmbedInput = TextInput | TokenInput
"""One input: a text (the model's tokenizer reads it, special tokens added) or the model's
token ids (taken as they are)."""


def input_chars(inputs: Sequence[str | Sequence[int]]) -> int:
    """Characters of the text inputs (ids count one each): bounded by ``MAX_EMBED_CHARS``."""
    return sum(len(i) for i in inputs)


def pack(values: Sequence[float] | bytes) -> str:
    """A vector as its result key stores it: float32 little-endian bytes in base64 (``bytes``:
    those bytes already)."""
    raw = values if isinstance(values, bytes) else struct.pack(f"<{len(values)}f", *values)
    return base64.b64encode(raw).decode()


def unpack(encoded: str) -> list[float]:
    """The floats of a packed vector."""
    raw = base64.b64decode(encoded)
    return list(struct.unpack(f"<{len(raw) // 4}f", raw))
