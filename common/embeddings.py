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
PART_CHARS = 16_000
"""Most characters in one of ``embed_many``'s requests (ids count 4 each): ~3-4 k tokens, within
one embedding worker's batch (4,096 tokens by default), so that a part never makes a batch
longer than the budget and a high request never waits behind a long one."""

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


def cut_by_length(
    inputs: Sequence[str | Sequence[int]], *, most_inputs: int, most_chars: int = PART_CHARS
) -> list[list[int]]:
    """Many inputs cut into requests as ``encode`` cuts its batches: the indexes of ``inputs``
    sorted by length, then parts of at most ``most_inputs`` inputs and ``most_chars``
    characters (one longer input alone). Inputs of one length share a part, so a worker pads
    them little (in input order, a part of 64 mixed inputs padded ~1.5x; sorted, ~1.05x)."""
    size = [len(i) if isinstance(i, str) else 4 * len(i) for i in inputs]
    parts: list[list[int]] = []
    chars = 0
    for index in sorted(range(len(inputs)), key=size.__getitem__):
        if not parts or len(parts[-1]) >= most_inputs or chars + size[index] > most_chars:
            parts.append([])
            chars = 0
        parts[-1].append(index)
        chars += size[index]
    return parts


def pack(values: Sequence[float] | bytes) -> str:
    """A vector as its result key stores it: float32 little-endian bytes in base64 (``bytes``:
    those bytes already)."""
    raw = values if isinstance(values, bytes) else struct.pack(f"<{len(values)}f", *values)
    return base64.b64encode(raw).decode()


def unpack(encoded: str) -> list[float]:
    """The floats of a packed vector."""
    raw = base64.b64decode(encoded)
    return list(struct.unpack(f"<{len(raw) // 4}f", raw))
