"""The key functions the scripts call, generated from ``Keys``: Lua spells no key name.

Each ``key_NAME(base, ...)`` returns what ``Keys.NAME(...)`` returns, built from a base the
script holds: the queue's (``genq:{Q}``, ``q``), a lane's (``genq:{Q}`` or ``genq:{Q}:m<M>``,
``lane``) or a batch record's (``record``). ``base_of_NAME(key)`` goes back from a key to its
base, ``lane_of_stream`` and ``model_of_lane`` from a work stream to its lane and from a lane
to its model. The text is made here by calling ``Keys`` with placeholders, so a change to
``keys.py`` changes the scripts with it; ``prelude`` puts in a script only the functions it
calls. A test runs every function against ``Keys``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import cache

from genq.common.keys import PREFIX, Keys

_QUEUE, _MODEL, _BATCH = "Q", "ZZ9", "B"
_ARGS = ("\x01", "\x02")
"""Placeholders for a key function's arguments beside its base."""

_QUEUE_BASE = f"{PREFIX}:{{{_QUEUE}}}"
_LANE = Keys(_QUEUE, _MODEL)
_UNNAMED = Keys(_QUEUE)

# name: (base, its parameter names, how Keys builds it from a Keys of the base and arguments)
_BY_QUEUE: dict[str, tuple[tuple[str, ...], Callable[..., str]]] = {
    "config": ((), lambda k: k.config),
    "models": ((), lambda k: k.models),
    "adapters": ((), lambda k: k.adapters),
    "tenants": ((), lambda k: k.tenants),
    "vtc": ((), lambda k: k.vtc),
    "reserved": ((), lambda k: k.reserved),
    "window": (("t",), lambda k, t: k.window(t)),
    "bucket": (("t",), lambda k, t: k.bucket(t)),
    "worker": (("c",), lambda k, c: k.worker(c)),
    "holders": ((), lambda k: k.holders),
    "slots": ((), lambda k: k.adapter_slots),
    "load": ((), lambda k: k.load),
    "history": (("b",), lambda k, b: k.history(b)),
}
_BY_LANE: dict[str, tuple[tuple[str, ...], Callable[..., str]]] = {
    "stream": (("p",), lambda k, p: k.stream(p)),
    "lane_config": ((), lambda k: k.lane_config),
    "idx": (("p", "t"), lambda k, p, t: k.tenant_index(p, t)),
    "active": (("p",), lambda k, p: k.active(p)),
    "waiting": ((), lambda k: k.waiting),
    "doorbell": ((), lambda k: k.doorbell),
}
_BY_RECORD: dict[str, tuple[tuple[str, ...], Callable[..., str]]] = {
    "batch_done": ((), lambda b: Keys.batch_done(b)),
}


def _lua_string(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _lua_pattern(text: str) -> str:
    """``text`` as a Lua pattern that matches it literally."""
    return re.sub(r"([\^$()%.\[\]*+\-?])", r"%\1", text)


def _concat(base: str, built: str, base_param: str, params: tuple[str, ...]) -> str:
    """Lua that builds ``built`` (a key made from ``base`` and the placeholders)."""
    if not built.startswith(base):
        raise ValueError(f"{built!r} is not built on {base!r}")
    rest, parts = built[len(base) :], [base_param]
    pieces = re.split("([\x01\x02])", rest)
    for piece in pieces:
        if piece in _ARGS:
            parts.append(params[_ARGS.index(piece)])
        elif piece:
            parts.append(_lua_string(piece))
    return " .. ".join(parts)


def _function(name: str, params: tuple[str, ...], expression: str) -> str:
    return f"local function {name}({', '.join(params)}) return {expression} end\n"


def _forward_and_back(
    name: str, base: str, base_param: str, params: tuple[str, ...], built: str
) -> dict[str, str]:
    """``key_NAME`` (the key from its base and arguments) and, for a key of its base alone,
    ``base_of_NAME`` (its base from the key)."""
    out = {
        f"key_{name}": _function(
            f"key_{name}", (base_param, *params), _concat(base, built, base_param, params)
        )
    }
    if not params:
        cut = len(built) - len(base)
        out[f"base_of_{name}"] = _function(
            f"base_of_{name}", ("k",), f"string.sub(k, 1, #k - {cut})"
        )
    return out


@cache
def functions() -> dict[str, str]:
    """Every key function's Lua, by name."""
    out: dict[str, str] = {}
    for name, (params, build) in _BY_QUEUE.items():
        built = build(_UNNAMED, *_ARGS[: len(params)])
        out |= _forward_and_back(name, _QUEUE_BASE, "q", params, built)
    lane_base = lane_base_of(_LANE)
    for name, (params, build) in _BY_LANE.items():
        built = build(_LANE, *_ARGS[: len(params)])
        unnamed = build(_UNNAMED, *_ARGS[: len(params)])
        if built[len(lane_base) :] != unnamed[len(_QUEUE_BASE) :]:
            raise ValueError(f"{name}: a named lane's key differs from the unnamed lane's")
        out |= _forward_and_back(name, lane_base, "lane", params, built)
    for name, (params, build) in _BY_RECORD.items():
        out |= _forward_and_back(name, Keys.batch(_BATCH), "record", params, build(_BATCH))
    # A named lane's base from the queue's and the model's name, and back.
    before, after = lane_base[len(_QUEUE_BASE) :].split(_MODEL)
    out["key_lane"] = _function(
        "key_lane", ("q", "m"), f"q .. {_lua_string(before)} .. m .. {_lua_string(after)}"
    )
    model_pattern = _lua_pattern(before) + "(.+)" + _lua_pattern(after) + "$"
    out["model_of_lane"] = _function(
        "model_of_lane", ("lane",), f"string.match(lane, {_lua_string(model_pattern)})"
    )
    stream_sep = _LANE.stream("high")[len(lane_base) :].removesuffix("high")
    stream_pattern = "^(.*)" + _lua_pattern(stream_sep) + "%a+$"
    out["lane_of_stream"] = _function(
        "lane_of_stream", ("s",), f"string.match(s, {_lua_string(stream_pattern)})"
    )
    return out


def lane_base_of(keys: Keys) -> str:
    """The base of ``keys``' lane's work keys (``genq:{Q}`` or ``genq:{Q}:m<M>``)."""
    return keys.lane_config.removesuffix(_UNNAMED.lane_config[len(_QUEUE_BASE) :])


_CALL = re.compile(r"\b((?:key|base_of)_\w+|model_of_lane|lane_of_stream)\s*\(")


def prelude(text: str) -> str:
    """The key functions ``text`` calls, defined for it (none it does not call)."""
    defined = functions()
    used = sorted({m.group(1) for m in _CALL.finditer(text)} & set(defined))
    return "".join(defined[name] for name in used)
