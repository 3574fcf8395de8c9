"""genq's queue operations as a Redis Functions library, for clients in any language.

``FUNCTION LOAD REPLACE`` (Redis >= 7.0) stores the library with the data: it survives a
restart (with persistence) and reaches replicas, unlike EVAL's script cache. Workers load it
when they start (``load``), and ``genq functions load`` does it by hand; on a Redis Cluster it
must be on every primary (redis-py's cluster client sends FUNCTION LOAD to all of them).

==================  =======================================================================
function            what it does
==================  =======================================================================
``genq_submit``     the SUBMIT script of ``scripts.py``: the depth limit, one request per
                    id, the ``queued`` state and the entry that owns the id, all in one step
``genq_cancel``     cancel a queued or running request: 1 cancelled, 0 already final,
                    -1 no such request (with a response's keys, its webhook event too)
``genq_version``    the library's version (``VERSION``)
==================  =======================================================================

The Lua of ``genq_submit`` is the same text the Python client sends with EVAL; the states it
and ``genq_cancel`` build are the ones ``states.py`` builds (a test compares them).
"""

from __future__ import annotations

import logging
from typing import Any

import redis
from genq.common.lua.cancel import CANCEL
from genq.common.lua.submit import SUBMIT

log = logging.getLogger("genq")

LIBRARY = "genq"
VERSION = 5
"""Raised whenever a function's arguments or answers change (2: genq_submit indexes each request
under its tenant and may answer GENQ_TENANT_FULL; 3: genq_cancel takes a response's record and
the webhook outbox as optional KEYS 4 and 5; 4: genq_submit may answer GENQ_PRIORITY_DENIED; 5:
genq_submit puts a request whose body names a ``model`` in that model's lane)."""


def _function(name: str, body: str) -> str:
    # The scripts read KEYS and ARGV as globals (EVAL's); here they are the function's arguments.
    return f"redis.register_function('{name}', function(KEYS, ARGV)\n{body}\nend)\n"


def library_code() -> str:
    """The library's source, as FUNCTION LOAD takes it."""
    return (
        f"#!lua name={LIBRARY}\n"
        + _function("genq_submit", SUBMIT)
        + _function("genq_cancel", CANCEL)
        + _function("genq_version", f"return {VERSION}")
    )


def load(r: Any) -> None:
    """Load (or replace) the library; on a Redis Cluster, on every primary."""
    r.function_load(library_code(), replace=True)


def try_load(r: Any) -> bool:
    """``load``, but only warn if this Redis user may not (the Python client does not need the
    library; clients in other languages do)."""
    try:
        load(r)
    except redis.ResponseError as err:  # NoPermissionError included; an old Redis (< 7)
        log.warning(
            "could not load genq's Redis Functions library (FCALL genq_submit ...): %s. "
            "Load it as a user allowed to: genq functions load --redis-url URL",
            err,
        )
        return False
    return True
