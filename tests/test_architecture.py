"""The code's shape, kept: units a reader can hold, and a policy that stays pure."""

from __future__ import annotations

import ast
import re
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
    def packages(folder: Path) -> set[str]:
        return {p.name for p in folder.iterdir() if p.is_dir() and (p / "__init__.py").exists()}

    worker = ROOT / "worker"
    assert packages(worker) == {"bench", "commands", "devtools", "engines", "policy", "runtime"}
    assert not [p.name for p in worker.glob("*.py") if p.name not in {"__init__.py", "__main__.py"}]
    assert packages(ROOT / "producer") == {"commands", "gateway"}
    assert packages(ROOT / "common") == {"lua"}


PACKAGES = sorted(p.parent for p in SOURCES if p.name == "__init__.py")


@pytest.mark.parametrize("folder", PACKAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_each_package_docstring_names_every_module_in_it(folder: Path) -> None:
    doc = ast.get_docstring(ast.parse((folder / "__init__.py").read_text())) or ""
    modules = sorted(p.stem for p in folder.glob("*.py") if p.stem not in {"__init__", "__main__"})
    assert not [m for m in modules if f"``{m}``" not in doc and f"`{m}`" not in doc]


def _layer(module: str) -> str:
    """``genq.worker.policy.batching`` -> ``worker/policy``; ``genq.producer.client`` ->
    ``producer``: the folders ARCHITECTURE.md's import rules name."""
    parts = module.split(".")[1:]
    if len(parts) >= 2 and (ROOT / parts[0] / parts[1] / "__init__.py").exists():
        return f"{parts[0]}/{parts[1]}"
    return parts[0]


def _documented_import_rules() -> dict[str, set[str]]:
    """The table under "Import direction" in ARCHITECTURE.md: folder -> what it may import."""
    text = (ROOT / "ARCHITECTURE.md").read_text().split("## Import direction", 1)[1]
    rules: dict[str, set[str]] = {}
    for line in text.split("\n## ", 1)[0].splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| `") and len(cells) == 2:
            rules[cells[0].strip("`")] = {c.strip(" `") for c in cells[1].split(",")} - {"-"}
    return rules


def test_imports_go_only_the_directions_architecture_md_states() -> None:
    rules = _documented_import_rules()
    layers = {
        _layer("genq." + ".".join(p.relative_to(ROOT).with_suffix("").parts)) for p in SOURCES
    }
    assert set(rules) == layers, "every folder has a row in ARCHITECTURE.md's import table"
    crossing = []
    for path in SOURCES:
        own = _layer("genq." + ".".join(path.relative_to(ROOT).with_suffix("").parts))
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("genq."):
                names = [str(node.module)]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names if a.name.startswith("genq.")]
            for name in names:
                other = _layer(name)
                if other != own and other not in rules[own]:
                    crossing.append(f"{path.relative_to(ROOT)}:{node.lineno} imports {name}")
    assert not crossing


def test_the_client_library_imports_no_server_and_no_model_code() -> None:
    code = (
        "import sys, genq.producer\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in "
        "('fastapi', 'starlette', 'uvicorn', 'httpx', 'torch', 'transformers', 'click')"
        " or m.startswith(('genq.producer.gateway', 'genq.producer.commands', 'genq.worker'))]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_an_old_import_path_of_a_moved_module_still_works_and_says_where_it_went() -> None:
    code = (
        "import warnings\n"
        "with warnings.catch_warnings(record=True) as seen:\n"
        "    warnings.simplefilter('always')\n"
        "    from genq.producer.batches import submit_batch\n"
        "    import genq.producer.gateway.batches as new\n"
        "assert submit_batch is new.submit_batch\n"
        "assert 'moved to genq.producer.gateway.batches' in str(seen[0].message), seen\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_a_test_module_takes_its_helpers_from_conftest_not_from_another_test_module() -> None:
    crossing = []
    for path in sorted((ROOT / "tests").glob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tests.test_"):
                crossing.append(f"{path.name} imports {node.module}")
    assert not crossing


def test_architecture_md_folder_map_names_every_module() -> None:
    folder_map = (ROOT / "ARCHITECTURE.md").read_text().split("## Folder map", 1)[1]
    folder_map = folder_map.split("\n## ", 1)[0]
    modules = sorted(
        str(p.relative_to(ROOT)) for p in SOURCES if p.stem not in {"__init__", "__main__"}
    )
    missing = [
        m
        for m in modules
        if m not in folder_map
        and f"{Path(m).name}`" not in folder_map
        and f"`{Path(m).stem}`" not in folder_map
    ]
    assert not missing


def test_the_fair_share_cost_is_written_once() -> None:
    """``weighted_tokens`` (and its Lua twin) is the one formula; nobody writes it out again."""
    formula = re.compile(r"\+ 2 \* (max_new|c\.max_new|self\.completion)")
    home = ROOT / "common" / "fair_share.py"
    again = [
        f"{p.relative_to(ROOT)}:{n}"
        for p in SOURCES
        if p != home
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if formula.search(line)
    ]
    assert not again


def test_no_module_imports_itself_back_through_another() -> None:
    """No import cycles between genq's modules, TYPE_CHECKING imports included."""
    graph: dict[str, set[str]] = {}
    for path in SOURCES:
        name = "genq." + ".".join(path.relative_to(ROOT).with_suffix("").parts)
        name = name.removesuffix(".__init__")
        deps = graph.setdefault(name, set())
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("genq."):
                deps.add(str(node.module))
            elif isinstance(node, ast.Import):
                deps |= {a.name for a in node.names if a.name.startswith("genq.")}
    cycles = []

    def visit(node: str, path: list[str], done: set[str]) -> None:
        if node in path:
            cycles.append(" -> ".join([*path[path.index(node) :], node]))
            return
        if node in done:
            return
        done.add(node)
        for dep in sorted(graph.get(node, ())):
            if dep != node and not node.startswith(dep + "."):  # a package's own __init__
                visit(dep, [*path, node], done)

    for start in sorted(graph):
        visit(start, [], set())
    assert not cycles


def test_the_clients_submit_docstrings_name_every_request_option() -> None:
    import inspect

    from genq.producer import AsyncClient, Client, build_request

    options = [p for p in inspect.signature(build_request).parameters if p != "prompt"]
    for submit in (Client.submit, AsyncClient.submit):
        doc = submit.__doc__ or ""
        missing = [o for o in options if o not in doc]
        assert not missing, f"{submit.__qualname__} does not name {missing}"


def test_each_command_loads_when_asked_and_a_worker_imports_no_gateway() -> None:
    """The ``genq`` group imports a command's module only when that command runs
    (``COMMANDS``): each name loads a command of that name, and ``genq worker`` starts
    without the gateway, the batch files' code or the benches (a fresh interpreter)."""
    import click
    from genq.worker.commands import COMMANDS, main

    ctx = click.Context(main)
    assert [getattr(main.get_command(ctx, name), "name", None) for name in COMMANDS] == list(
        COMMANDS
    )
    assert main.get_command(ctx, "no-such-command") is None
    code = (
        "import sys, click; from genq.worker.commands import main; "
        "main.get_command(click.Context(main), 'worker'); print(' '.join(sys.modules))"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = run.stdout.split()
    assert "genq.worker.commands.worker" in loaded
    for heavy in ("genq.producer.gateway", "genq.producer.commands.batch", "genq.worker.bench"):
        assert not [m for m in loaded if m.startswith(heavy)], heavy


HISTORY_MARKER = re.compile(r"\b[Ss]essions? \d+|(?<![\w\"/])(?<!vLLM )#\d+\b")
"""A work-log number or an issue number: when something came, not what it is (the commit log
and BENCHMARKS.md keep the history; an outside project's issue, such as vLLM's, may be cited)."""
GUIDES = [ROOT / n for n in ("README.md", "ARCHITECTURE.md", "RELIABILITY.md")]


def test_code_tests_and_guides_say_the_rule_in_force_not_when_it_came() -> None:
    tests = sorted((ROOT / "tests").rglob("*.py"))
    pages = [*GUIDES, *sorted((ROOT / "docs").rglob("*.md"))]
    marked = [
        f"{p.relative_to(ROOT)}:{n}: {m.group(0)}"
        for p in [*SOURCES, *tests, *pages]
        for n, line in enumerate(p.read_text().splitlines(), 1)
        for m in HISTORY_MARKER.finditer(line)
    ]
    assert not marked
