"""`genq demo` runs end to end: its own redis-server, a worker on the tiny model, results."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow


def test_demo_runs_and_reports_batches() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "genq.worker", "demo", "--requests", "12", "--max-batch-size", "4"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "12 succeeded" in out.stdout
    assert "batches formed: 3" in out.stdout or "batches formed: 4" in out.stdout
    assert "padding fraction" in out.stdout
