"""How a script is put together: the fragments it includes, each once and after what it needs,
behind the key functions its text calls (``key_names``).

A fragment is Lua that defines names for the scripts that include it, and says which
(``defines``); a script names the fragments it includes (``needs``). A test reads every
registered script and checks that each helper it calls, and each shared upper-case name it
uses, is its own or comes from a fragment it includes.
"""

from __future__ import annotations

from dataclasses import dataclass

from genq.common.lua import key_names


@dataclass(frozen=True)
class Fragment:
    """Lua that defines ``defines`` (local functions and shared names) for the scripts that
    include it; it includes ``needs`` in turn."""

    name: str
    defines: tuple[str, ...]
    lua: str
    needs: tuple[Fragment, ...] = ()


@dataclass(frozen=True)
class Script:
    """A registered script: its own text, the fragments it includes (in the order they are
    laid out) and the source Redis runs."""

    name: str
    body: str
    fragments: tuple[Fragment, ...]
    source: str


SCRIPTS: dict[str, Script] = {}
"""Every script genq sends, by name (filled as the modules of ``genq.common.lua`` load)."""

SHEBANG = "#!lua"


def _laid_out(needs: tuple[Fragment, ...]) -> list[Fragment]:
    """The fragments, each after the fragments it needs, each once."""
    out: list[Fragment] = []

    def visit(fragment: Fragment) -> None:
        if fragment in out:
            return
        for inner in fragment.needs:
            visit(inner)
        out.append(fragment)

    for fragment in needs:
        visit(fragment)
    return out


def _compose(body: str, fragments: list[Fragment]) -> str:
    # A shebang (``#!lua flags=...``) must stay the script's first line, and the script's
    # opening comment (its KEYS and ARGV) stays on top, where a reader of the source (or of
    # the SLOWLOG, which keeps its first 128 characters) finds it.
    lines = body.lstrip("\n").split("\n")
    top = 0
    while top < len(lines) and (
        lines[top].startswith("--") or (top == 0 and lines[0].startswith(SHEBANG))
    ):
        top += 1
    head, rest = "\n".join(lines[:top]), "\n".join(lines[top:])
    text = "".join(f.lua for f in fragments) + rest
    return (head + "\n" if head else "") + key_names.prelude(text) + text


def compose(body: str, *needs: Fragment) -> str:
    """The Lua of ``body`` with the fragments it needs (unregistered: for a test's probe)."""
    return _compose(body, _laid_out(needs))


def script(name: str, body: str, *needs: Fragment) -> str:
    """Register the script ``name`` and return its source, as ``script_calls`` sends it."""
    fragments = _laid_out(needs)
    source = _compose(body, fragments)
    if name in SCRIPTS and SCRIPTS[name].source != source:
        raise ValueError(f"two scripts are named {name!r}")
    SCRIPTS[name] = Script(name, body, tuple(fragments), source)
    return source
