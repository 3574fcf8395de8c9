"""The prepared GPU check (``scripts/gpu_check.sh``), tested where it can be: its dry run (the
same cases on the CPU with the tiny model, through a real redis-server and worker), and its
time limit."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from genq.worker.devtools.gpu_check import GPU_CASES, SKIPPED, Case, check

from tests.conftest import ROOT


def test_the_dry_run_measures_each_engine_in_process_and_through_the_queue(
    tmp_path: Path,
) -> None:
    out = tmp_path / "gpu_check.md"
    done = subprocess.run(
        ["bash", "scripts/gpu_check.sh", "run", "--dry-run", "--output", str(out)],
        cwd=ROOT,
        env={**os.environ, "PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    text = out.read_text()
    rows = [line.split(" | ") for line in text.splitlines() if line.startswith("| tiny |")]
    assert [r[1] for r in rows] == ["static", "continuous"], text
    for row in rows:
        assert row[-1] == "ok |", text
        in_process, queue, ratio = (float(x.replace(",", "")) for x in row[2:5])
        assert in_process > 0 and queue > 0 and ratio == round(ratio, 3) > 0
    adapters = text.split("LoRA adapters through the queue")[1]
    for config in ("base", "4 adapters mixed", "4 adapters, --max-loras 2"):
        assert f"| {config} |" in adapters and "| 64 / 64 |" in adapters, text
    assert "redis-server 7." in text or "redis-server 8." in text
    assert all(what in text for what, _ in SKIPPED)


def test_cases_the_time_limit_cannot_hold_are_reported_not_run(tmp_path: Path) -> None:
    out = tmp_path / "gpu_check.md"
    rows = check(dry_run=False, output=out, limit_s=0)
    assert [r["status"] for r in rows] == ["no time"] * len(GPU_CASES)
    tables = sum(isinstance(c, Case) for c in GPU_CASES)
    assert out.read_text().count("| no time |") == tables
    assert "LoRA adapters through the queue" in out.read_text()


def test_only_picks_the_cases_whose_model_and_engine_hold_its_text(tmp_path: Path) -> None:
    rows = check(
        dry_run=False, output=tmp_path / "x.md", limit_s=0, only=("random-250m continuous",)
    )
    assert [(r["model"], r["engine"]) for r in rows] == [
        ("random-250m", "continuous"),
        ("random-250m", "continuous (time slice off)"),
        ("random-250m", "continuous (no prefix room)"),
    ]
    variants = {c.variant: c.env for c in GPU_CASES if isinstance(c, Case) and c.variant}
    assert variants == {
        "time slice off": {"GENQ_TIME_SLICE_MS": "0"},
        "no prefix room": {"GENQ_PREFIX_CACHE_TOKENS": "0"},
    }
