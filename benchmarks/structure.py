"""The code's shape, one tree against another, measured the same way on both: where Lua lives,
key names spelled in Lua, files and units near their caps, the Worker's parts, the turn's
length, history markers, and the longest cells of the two reference tables.

    python benchmarks/structure.py --revs c0e7e64,HEAD
"""

from __future__ import annotations

import argparse
import ast
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CODE = ("common", "producer", "worker")
FILE_CAP, CLASS_CAP, FUNCTION_CAP = 500, 300, 80
KEY_LITERAL = re.compile(r"'(:[A-Za-z<][^'\n]*|:)'")
"""A single-quoted literal that starts a key's suffix (Python code here quotes with ")."""
HISTORY_MARKER = re.compile(r"\b[Ss]ession \d+|\(#\d+\)|#\d+\b")
GUIDES = ("README.md", "ARCHITECTURE.md", "RELIABILITY.md", "docs")


def checkout(rev: str, into: Path) -> Path:
    """``rev``'s tree (``worktree``: this checkout as it is)."""
    if rev == "worktree":
        return ROOT
    command = ["git", "-C", str(ROOT), "worktree", "add", "-f", str(into), rev]
    subprocess.run(command, check=True, capture_output=True)
    return into


def _sources(tree: Path) -> list[Path]:
    return sorted(p for d in CODE for p in (tree / d).rglob("*.py"))


def _markdown(tree: Path) -> list[Path]:
    out: list[Path] = []
    for name in GUIDES:
        path = tree / name
        out += sorted(path.rglob("*.md")) if path.is_dir() else [path]
    return [p for p in out if p.exists()]


def _longest_cell(text: str, heading: str) -> int:
    """The longest cell of the first table after ``heading`` (a line that starts with it)."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith(heading)), None)
    if start is None:
        return 0
    rows, seen = [], False
    for line in lines[start + 1 :]:
        if line.startswith("|"):
            rows.append(line)
            seen = True
        elif seen:
            break
    return max((len(c.strip()) for r in rows for c in r.strip().strip("|").split("|")), default=0)


def _worker_shape(tree: Path) -> tuple[int, int, int]:
    """The Worker's parts (its dataclass fields), its distinct ``self.part.member`` pairs, and
    the turn's lines (its ``turn`` method's body)."""
    tree_ = ast.parse((tree / "worker" / "runtime" / "worker.py").read_text())
    cls = next(n for n in ast.walk(tree_) if isinstance(n, ast.ClassDef) and n.name == "Worker")
    parts = [n.target.id for n in cls.body if isinstance(n, ast.AnnAssign)]  # type: ignore[union-attr]
    part_set = {p for p in parts if not p.startswith("_")}
    pairs = {
        (n.value.attr, n.attr)
        for n in ast.walk(cls)
        if isinstance(n, ast.Attribute)
        and isinstance(n.value, ast.Attribute)
        and isinstance(n.value.value, ast.Name)
        and n.value.value.id == "self"
        and n.value.attr in part_set
    }
    turn = next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "turn"), None)
    turn_lines = 0
    if turn is not None:
        body = turn.body[1:] if ast.get_docstring(turn) else turn.body
        turn_lines = body[-1].end_lineno - body[0].lineno + 1  # type: ignore[operator]
    return len(part_set), len(pairs), turn_lines


def measure(tree: Path) -> dict[str, int]:
    """Every figure of one tree."""
    sources = _sources(tree)
    texts = {p: p.read_text() for p in sources}
    near = 0
    for text in texts.values():
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef):
                cap = CLASS_CAP
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                cap = FUNCTION_CAP
            else:
                continue
            length = node.end_lineno - node.lineno + 1  # type: ignore[operator]
            near += length >= 0.9 * cap
    parts, pairs, turn = _worker_shape(tree)
    tests = sorted((tree / "tests").rglob("*.py"))
    return {
        "modules holding Lua": sum("redis.call(" in t for t in texts.values()),
        "of them outside common/lua": sum(
            "redis.call(" in t for p, t in texts.items() if "lua" not in p.parts
        ),
        "key names spelled in Lua": sum(
            len(KEY_LITERAL.findall(t)) for t in texts.values() if "redis.call(" in t
        ),
        "common files over 400 lines": sum(
            len(t.splitlines()) > 400 for p, t in texts.items() if p.parts[-2] == "common"
        ),
        "files within 10% of the cap": sum(
            len(t.splitlines()) >= 0.9 * FILE_CAP for t in texts.values()
        ),
        "classes and functions within 10% of a cap": near,
        "Worker's parts": parts,
        "Worker's part.member pairs": pairs,
        "the turn's lines": turn,
        "history markers in code": sum(len(HISTORY_MARKER.findall(t)) for t in texts.values()),
        "history markers in tests": sum(len(HISTORY_MARKER.findall(p.read_text())) for p in tests),
        "history markers in the guides": sum(
            len(HISTORY_MARKER.findall(p.read_text())) for p in _markdown(tree)
        ),
        "longest cell, BENCHMARKS' first table": _longest_cell(
            (tree / "BENCHMARKS.md").read_text(), "## "
        ),
        "longest cell, ARCHITECTURE's folder map": _longest_cell(
            (tree / "ARCHITECTURE.md").read_text(), "## Folder map"
        ),
    }


def main() -> None:
    """Print a table: one row a figure, one column a revision."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--revs", default="c0e7e64,worktree")
    args = parser.parse_args()
    revs = args.revs.split(",")
    columns = []
    with tempfile.TemporaryDirectory(prefix="genq-structure-") as tmp:
        try:
            for i, rev in enumerate(revs):
                columns.append(measure(checkout(rev, Path(tmp) / str(i))))
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "prune"], check=False)
    print("| figure | " + " | ".join(revs) + " |")
    print("|---|" + "---:|" * len(revs))
    for name in columns[0]:
        print(f"| {name} | " + " | ".join(str(c[name]) for c in columns) + " |")


if __name__ == "__main__":
    sys.exit(main())
