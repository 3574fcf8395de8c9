"""Requests from a file: one prompt per line, or JSON Lines of ``build_request`` arguments.

Each bad line is reported with its number and skipped; it does not stop the others.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from genq.common.errors import InvalidRequest
from genq.common.models import Request
from genq.producer.building import build_request


@dataclass(frozen=True, kw_only=True)
class LineError:
    """Why line ``line`` (1-based) was not submitted."""

    line: int
    message: str


def read_requests(
    lines: Iterable[str], defaults: Mapping[str, Any] | None = None
) -> tuple[list[tuple[int, Request]], list[LineError]]:
    """Parse ``lines``: a line starting with ``{`` is a JSON object of ``build_request``
    arguments (``prompt`` required; they override ``defaults``), any other non-empty line is a
    prompt. Returns the (line number, request) pairs and the errors."""
    requests: list[tuple[int, Request]] = []
    errors: list[LineError] = []
    for n, raw in enumerate(lines, start=1):
        line = raw.rstrip("\n").rstrip("\r")
        if not line.strip():
            continue
        try:
            if line.lstrip().startswith("{"):
                try:
                    args = json.loads(line)
                except ValueError as err:
                    raise InvalidRequest(f"not valid JSON: {err}") from None
                if not isinstance(args, dict) or "prompt" not in args:
                    raise InvalidRequest("a JSON line must be an object with a 'prompt'")
                requests.append((n, build_request(**{**(defaults or {}), **args})))
            else:
                requests.append((n, build_request(line, **(defaults or {}))))
        except InvalidRequest as err:
            errors.append(LineError(line=n, message=str(err)))
        except TypeError as err:  # an unknown argument name
            errors.append(LineError(line=n, message=f"invalid request: {err}"))
    return requests, errors
