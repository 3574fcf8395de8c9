"""The code's shape, kept: units a reader can hold, and a policy that stays pure."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SOURCES = sorted(
    p for folder in ("common", "producer", "worker") for p in (ROOT / folder).rglob("*.py")
)
MAX_FILE_LINES, MAX_CLASS_LINES, MAX_FUNCTION_LINES = 500, 300, 80


def _spans(path: Path) -> list[tuple[str, int, int]]:
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ClassDef):
            out.append((f"class {node.name}", node.end_lineno - node.lineno + 1, MAX_CLASS_LINES))  # type: ignore[operator]
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            length = node.end_lineno - node.lineno + 1  # type: ignore[operator]
            out.append((f"def {node.name}", length, MAX_FUNCTION_LINES))
    return out


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_source_file_class_or_function_is_too_long_to_hold(path: Path) -> None:
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_FILE_LINES, f"{lines} lines"
    too_long = [f"{name}: {n} lines" for name, n, limit in _spans(path) if n > limit]
    assert not too_long


def test_no_call_needs_fmt_skip_to_stay_readable() -> None:
    marked = [str(p.relative_to(ROOT)) for p in SOURCES if "fmt: skip" in p.read_text()]
    assert not marked


def test_the_policy_units_import_neither_redis_nor_torch() -> None:
    code = (
        "import sys\n"
        "import genq.worker.policy.admission, genq.worker.policy.batching\n"
        "import genq.worker.policy.arrivals\n"
        "import genq.worker.policy.budget, genq.worker.policy.lookahead\n"
        "import genq.worker.policy.planning, genq.worker.policy.suspects\n"
        "heavy = [m for m in ('redis', 'torch', 'transformers') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_the_folders_show_the_architecture() -> None:
    worker = ROOT / "worker"
    folders = {p.name for p in worker.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert folders == {"commands", "devtools", "engines", "policy", "runtime"}
    assert not [p.name for p in worker.glob("*.py") if p.name not in {"__init__.py", "__main__.py"}]
