"""How genq's Lua scripts are sent: by their hash (EVALSHA), the source only when Redis lacks
it.

Every call names its script by SHA1 (``add`` in a pipeline, ``call`` alone), so a request's
round trips carry a few dozen bytes where they carried the script (the read script alone is
over 10 KB). A Redis that restarted, or was told ``SCRIPT FLUSH``, answers NOSCRIPT; that call
alone is sent again by its source (EVAL, which also caches it for the next call). In a
pipeline the other commands are not repeated: a pipeline is not a transaction, each of its
commands ran once whatever its neighbours answered, and a NOSCRIPT call did nothing, so
``execute`` sends again exactly the calls that answered NOSCRIPT, in their order, in one more
round trip (the first of each script by its source, the others by hash behind it), and puts
their replies in their places. (Where a later command of the same
pipeline read what such a script writes, it ran before the script did: genq's pipelines
never depend on that order, and it happens only on the first call after a restart.)

The same Lua is also a Functions library (``functions.py``), for clients in other languages.
"""

from __future__ import annotations

import hashlib
from typing import Any

from redis.exceptions import NoScriptError

__all__ = ["add", "call", "call_async", "execute", "execute_async", "sha_of"]

_SOURCES: dict[str, str] = {}
"""Every script sent so far, by its SHA1: what a NOSCRIPT call is sent again with."""
_SHAS: dict[str, str] = {}
"""Each source's SHA1, computed once (the read script is over 20 KB: hashing it on every call
cost more than the rest of the call's Python)."""


def sha_of(source: str) -> str:
    """The script's SHA1, as Redis names it (remembered, to send its source if needed)."""
    sha = _SHAS.get(source)
    if sha is None:
        sha = _SHAS[source] = hashlib.sha1(source.encode()).hexdigest()
        _SOURCES.setdefault(sha, source)
    return sha


def add(pipe: Any, source: str, numkeys: int, *args: Any) -> None:
    """Queue the script on ``pipe`` by its hash (run the pipeline with ``execute``)."""
    pipe.execute_command("EVALSHA", _SHAS.get(source) or sha_of(source), numkeys, *args)


def call(r: Any, source: str, numkeys: int, *args: Any) -> Any:
    """Run the script now: by its hash, by its source if Redis does not have it."""
    try:
        return r.execute_command("EVALSHA", sha_of(source), numkeys, *args)
    except NoScriptError:
        return r.execute_command("EVAL", source, numkeys, *args)


async def call_async(r: Any, source: str, numkeys: int, *args: Any) -> Any:
    """``call`` on an asyncio client."""
    try:
        return await r.execute_command("EVALSHA", sha_of(source), numkeys, *args)
    except NoScriptError:
        return await r.execute_command("EVAL", source, numkeys, *args)


def _queued(stack: list[Any]) -> list[tuple[Any, ...]]:
    """The commands of a pipeline's queue (``_stack``) as their arguments."""
    return [tuple(c.args if hasattr(c, "args") else c[0]) for c in stack]


def _missing(stack: list[Any], replies: list[Any]) -> list[int]:
    """Where an EVALSHA answered NOSCRIPT (``stack``: the pipeline's queue, ``_stack``)."""
    return [
        i
        for i, (args, reply) in enumerate(zip(_queued(stack), replies, strict=True))
        if isinstance(reply, NoScriptError) and str(args[0]).upper() == "EVALSHA"
    ]


def _by_source(args: tuple[Any, ...]) -> tuple[Any, ...]:
    sha = args[1].decode() if isinstance(args[1], bytes) else str(args[1])
    return ("EVAL", _SOURCES[sha], *args[2:])


def _resent(
    queued: list[tuple[Any, ...]], missing: list[int], every: bool
) -> list[tuple[Any, ...]]:
    """The calls at ``missing`` again: the first of each script by its source (which caches
    it), the others by hash, run after it in the same pipeline (a pipeline of 40 submits after
    a restart sent 800 KB of one source, and Redis hashed it 40 times); ``every``: all by
    source (on a cluster a script is cached per node, so a call by hash can miss again)."""
    sent: set[Any] = set()
    out = []
    for i in missing:
        args = queued[i]
        out.append(_by_source(args) if every or args[1] not in sent else args)
        sent.add(args[1])
    return out


def _placed(replies: list[Any], missing: list[int], again: list[Any]) -> list[int]:
    """Put the replies of the calls sent again (``again``) in their places; those that still
    answered NOSCRIPT."""
    for i, reply in zip(missing, again, strict=True):
        replies[i] = reply
    return [i for i in missing if isinstance(replies[i], NoScriptError)]


def _stack(pipe: Any) -> list[Any]:
    """A copy of the commands queued on ``pipe`` (plain and cluster pipelines, sync and
    asyncio): ``execute`` empties the pipeline's own."""
    strategy = getattr(pipe, "_execution_strategy", None)  # cluster pipelines keep them there
    stack = getattr(strategy, "_command_queue", None)
    return list(pipe.command_stack if stack is None else stack)


def _settled(replies: list[Any], raise_on_error: bool) -> None:
    """Raise the first error among ``replies`` (if ``raise_on_error``)."""
    if raise_on_error:
        for reply in replies:
            if isinstance(reply, Exception):
                raise reply


def execute(pipe: Any, raise_on_error: bool = True) -> list[Any]:
    """``pipe.execute()``, its scripts sent by hash: those Redis lacked are sent again by
    source in one more round trip, nothing else is repeated. ``raise_on_error`` as
    redis-py's (the first error raised after every command ran)."""
    stack = _stack(pipe)
    replies = list(pipe.execute(raise_on_error=False))
    if any(isinstance(reply, Exception) for reply in replies):  # else the common case: done
        queued, missing = _queued(stack), _missing(stack, replies)
        for by_source in (False, True):  # one source per script, then (a cluster) every one
            if not missing:
                break
            for args in _resent(queued, missing, by_source):
                pipe.execute_command(*args)
            missing = _placed(replies, missing, pipe.execute(raise_on_error=False))
        _settled(replies, raise_on_error)
    return replies


async def execute_async(pipe: Any, raise_on_error: bool = True) -> list[Any]:
    """``execute`` on an asyncio pipeline."""
    stack = _stack(pipe)
    replies = list(await pipe.execute(raise_on_error=False))
    if any(isinstance(reply, Exception) for reply in replies):  # else the common case: done
        queued, missing = _queued(stack), _missing(stack, replies)
        for by_source in (False, True):  # as ``execute``
            if not missing:
                break
            for args in _resent(queued, missing, by_source):
                pipe.execute_command(*args)
            missing = _placed(replies, missing, await pipe.execute(raise_on_error=False))
        _settled(replies, raise_on_error)
    return replies
