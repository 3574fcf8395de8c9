"""Packaging promises: the client needs no torch; names live under genq.*."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parent.parent


def test_importing_the_client_imports_no_torch_or_transformers() -> None:
    code = (
        "import sys, genq.producer, genq.common.settings, genq.common.keys\n"
        "heavy = [m for m in ('torch', 'transformers') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_base_dependencies_exclude_torch_and_transformers() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    base = " ".join(project["dependencies"]).lower()
    assert "torch" not in base and "transformers" not in base
    worker = " ".join(project["optional-dependencies"]["worker"])
    assert "transformers==" in worker  # pinned to the tested version
    assert "torch>=" in worker  # a range: the set-up installs the local pin first


def test_packages_install_under_the_genq_namespace() -> None:
    import genq.common
    import genq.producer
    import genq.worker

    for mod, folder in (
        (genq.common, "common"),
        (genq.producer, "producer"),
        (genq.worker, "worker"),
    ):
        assert Path(mod.__file__ or "").resolve().parent == ROOT / folder
