"""Redis' side in one home: every script in ``genq.common.lua``, each helper it calls from a
fragment it includes, and no key name spelled in Lua."""

from __future__ import annotations

import importlib
import pkgutil
import re
from pathlib import Path

import genq.common.lua as lua_package
import pytest
import redis
from genq.common.keys import Keys
from genq.common.lua import key_names
from genq.common.lua.compose import SCRIPTS, Fragment, Script, compose

ROOT = Path(__file__).resolve().parent.parent
for _module in pkgutil.iter_modules(lua_package.__path__):
    importlib.import_module(f"genq.common.lua.{_module.name}")

BUILTINS = {
    "tonumber",
    "tostring",
    "type",
    "pairs",
    "ipairs",
    "unpack",
    "pcall",
    "select",
    "next",
    "error",
    "assert",
    "setmetatable",
    "getmetatable",
    "rawget",
    "rawset",
}
KEYWORDS = {"function", "if", "elseif", "and", "or", "not", "return", "while", "until", "in"}
SHARED_BY_REDIS = {"KEYS", "ARGV"}


def _code(lua: str) -> tuple[str, list[str]]:
    """``lua`` without its comments, each string literal left as ``''``; and the literals."""
    out, literals, i = [], [], 0
    while i < len(lua):
        if lua.startswith("--", i):
            end = lua.find("\n", i)
            i = len(lua) if end < 0 else end
        elif lua[i] in "'\"":
            j = i + 1
            while lua[j] != lua[i]:
                j += 2 if lua[j] == "\\" else 1
            literals.append(lua[i + 1 : j])
            out.append("''")
            i = j + 1
        else:
            out.append(lua[i])
            i += 1
    return "".join(out), literals


_CALL = re.compile(r"(?<![.:\w])([A-Za-z_]\w*)\s*\(")
_SHARED = re.compile(r"(?<![.:\w])([A-Z][A-Z0-9_]+)\b")
_LOCAL_FUNCTION = re.compile(r"\bfunction\s+([A-Za-z_]\w*)\s*\(")
_LOCALS = re.compile(r"\blocal\s+(?!function\b)([A-Za-z_][\w\s,]*?)\s*(?:=|\n)")


def _defined_in(code: str) -> set[str]:
    names = set(_LOCAL_FUNCTION.findall(code))
    for group in _LOCALS.findall(code):
        names |= {n.strip() for n in group.split(",")}
    return names


def _used_in(code: str) -> set[str]:
    calls = set(_CALL.findall(code)) - KEYWORDS - BUILTINS
    return calls | (set(_SHARED.findall(code)) - SHARED_BY_REDIS)


def _given(fragments: tuple[Fragment, ...] | list[Fragment]) -> set[str]:
    return {name for f in fragments for name in f.defines} | set(key_names.functions())


def _closure(fragment: Fragment) -> list[Fragment]:
    out: list[Fragment] = []
    for inner in fragment.needs:
        out += [f for f in _closure(inner) if f not in out]
    return [*out, fragment]


def _fragments() -> list[Fragment]:
    seen: list[Fragment] = []
    for s in SCRIPTS.values():
        seen += [f for f in s.fragments if f not in seen]
    return seen


def test_every_script_is_registered_from_genq_common_lua() -> None:
    expected = {"submit", "apply", "read", "give back", "take back", "hold", "cancel"}
    assert expected | {"snapshot", "history", "quota claim", "feed a wave"} <= set(SCRIPTS)


def test_no_module_outside_genq_common_lua_holds_lua() -> None:
    sources = [p for d in ("common", "producer", "worker") for p in (ROOT / d).rglob("*.py")]
    holding = [
        str(p.relative_to(ROOT))
        for p in sources
        if "lua" not in p.relative_to(ROOT).parts and "redis.call(" in p.read_text()
    ]
    assert not holding


@pytest.mark.parametrize("script", list(SCRIPTS.values()), ids=lambda s: s.name)
def test_every_helper_a_script_calls_comes_from_a_fragment_it_includes(script: Script) -> None:
    code, _ = _code(script.body)
    missing = _used_in(code) - _defined_in(code) - _given(script.fragments)
    assert not missing, f"{script.name} uses {sorted(missing)} from no fragment it includes"


@pytest.mark.parametrize("fragment", _fragments(), ids=lambda f: f.name)
def test_each_fragment_defines_what_it_declares_and_needs_only_what_it_includes(
    fragment: Fragment,
) -> None:
    code, _ = _code(fragment.lua)
    defined = _defined_in(code)
    assert not set(fragment.defines) - defined, "declared, not defined"
    missing = _used_in(code) - defined - _given(_closure(fragment)[:-1])
    assert not missing, f"{fragment.name} uses {sorted(missing)} from no fragment it needs"


def test_no_script_spells_a_key_name() -> None:
    """A key's name is built by a ``key_*`` function (keys.py's), never by a literal such as
    ``':idx:'`` or ``':config'`` concatenated to a base."""
    texts = [s.body for s in SCRIPTS.values()] + [f.lua for f in _fragments()]
    spelled = sorted(
        {lit for text in texts for lit in _code(text)[1] if re.match(r"^:($|[A-Za-z<])", lit)}
    )
    assert not spelled


MODEL = "org/m:1@v+2"


def _lua_key(r: redis.Redis, name: str, *args: str) -> str:
    params = ", ".join(f"ARGV[{i + 1}]" for i in range(len(args)))
    got = r.eval(compose(f"return {name}({params})"), 0, *args)
    return got.decode() if isinstance(got, bytes) else str(got)


def test_the_generated_key_functions_build_what_keys_builds(r: redis.Redis) -> None:
    queue = Keys("q-1.x")
    q = key_names.lane_base_of(queue)
    for lane in (queue, queue.lane(MODEL)):
        base = key_names.lane_base_of(lane)
        assert _lua_key(r, "key_lane_config", base) == lane.lane_config
        assert _lua_key(r, "key_stream", base, "low") == lane.stream("low")
        assert _lua_key(r, "key_idx", base, "high", "t-1") == lane.tenant_index("high", "t-1")
        assert _lua_key(r, "key_active", base, "normal") == lane.active("normal")
        assert _lua_key(r, "key_waiting", base) == lane.waiting
        assert _lua_key(r, "key_doorbell", base) == lane.doorbell
        assert _lua_key(r, "lane_of_stream", lane.stream("high")) == base
        assert _lua_key(r, "base_of_waiting", lane.waiting) == base
    assert _lua_key(r, "key_lane", q, MODEL) == key_names.lane_base_of(queue.lane(MODEL))
    assert _lua_key(r, "model_of_lane", key_names.lane_base_of(queue.lane(MODEL))) == MODEL
    assert _lua_key(r, "base_of_config", queue.config) == q
    for name, expected in [
        ("key_config", queue.config),
        ("key_models", queue.models),
        ("key_adapters", queue.adapters),
        ("key_tenants", queue.tenants),
        ("key_vtc", queue.vtc),
        ("key_reserved", queue.reserved),
        ("key_holders", queue.holders),
        ("key_slots", queue.adapter_slots),
        ("key_load", queue.load),
    ]:
        assert _lua_key(r, name, q) == expected
    assert _lua_key(r, "key_window", q, "t") == queue.window("t")
    assert _lua_key(r, "key_bucket", q, "t") == queue.bucket("t")
    assert _lua_key(r, "key_worker", q, "w-1") == queue.worker("w-1")
    assert _lua_key(r, "key_batch_done", Keys.batch("b1")) == Keys.batch_done("b1")


def test_a_script_defines_only_the_key_functions_it_calls() -> None:
    hold = SCRIPTS["hold"].source
    assert "local function key_holders(" in hold and "local function key_idx(" not in hold
