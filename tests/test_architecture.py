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
    tests = sorted((ROOT / "tests").rglob("*.py"))
    marker = "fmt: " + "skip"  # not spelled out: this file is checked too
    marked = [str(p.relative_to(ROOT)) for p in [*SOURCES, *tests] if marker in p.read_text()]
    assert not marked


POLICY_MODULES = sorted(
    p.stem for p in (ROOT / "worker" / "policy").glob("*.py") if p.stem != "__init__"
)
CLOCKS = {"time", "datetime"}


def test_the_policy_units_import_neither_redis_nor_torch() -> None:
    assert {"batching", "ordering", "lookahead"} <= set(POLICY_MODULES)  # discovered, not listed
    imports = "".join(f"import genq.worker.policy.{m}\n" for m in POLICY_MODULES)
    code = (
        f"import sys\n{imports}"
        "heavy = [m for m in ('redis', 'torch', 'transformers') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


@pytest.mark.parametrize("module", POLICY_MODULES)
def test_the_policy_units_read_no_clock(module: str) -> None:
    """Time is an argument of the policy (``now_ms``), never read inside it."""
    tree = ast.parse((ROOT / "worker" / "policy" / f"{module}.py").read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module.split(".")[0])
    assert not imported & CLOCKS, f"{module} imports {sorted(imported & CLOCKS)}"


def test_the_folders_show_the_architecture() -> None:
    worker = ROOT / "worker"
    folders = {p.name for p in worker.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert folders == {"commands", "devtools", "engines", "policy", "runtime"}
    assert not [p.name for p in worker.glob("*.py") if p.name not in {"__init__.py", "__main__.py"}]


@pytest.mark.parametrize("package", ["policy", "runtime", "engines", "commands", "devtools"])
def test_each_package_docstring_names_every_module_in_it(package: str) -> None:
    folder = ROOT / "worker" / package
    doc = ast.get_docstring(ast.parse((folder / "__init__.py").read_text())) or ""
    modules = sorted(p.stem for p in folder.glob("*.py") if p.stem != "__init__")
    assert not [m for m in modules if f"``{m}``" not in doc and f"`{m}`" not in doc]


def test_a_test_module_takes_its_helpers_from_conftest_not_from_another_test_module() -> None:
    crossing = []
    for path in sorted((ROOT / "tests").glob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tests.test_"):
                crossing.append(f"{path.name} imports {node.module}")
    assert not crossing
