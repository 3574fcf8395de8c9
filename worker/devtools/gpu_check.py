"""The prepared GPU check (``scripts/gpu_check.sh run`` calls it): the GPU measurements
BENCHMARKS.md reports, in one go inside a time limit, as one markdown table.

Each case is one ``genq bench`` run (``--json``, in a process of its own, so a case that runs
out of time is stopped and reported as such): an engine in-process against the same engine
through the queue (a private redis-server and a real ``genq worker``), on the built-in
``random-250m`` and ``random-1b`` (Llama-3.2-1B's shape, random weights), static and
continuous. Cases run in order of importance; what the time left cannot hold is reported as
not run. ``--dry-run``: the same cases on the CPU with the tiny model and a few requests (to
test the script where there is no GPU). Cases that need what such a machine lacks (vLLM, for
the prefix and adapter cases) are listed as skipped, with the reason.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import click

LIMIT_S = 480
"""The whole check's time limit (8 minutes: the device tool lends a machine for 15)."""


@dataclass(frozen=True)
class Case:
    """One ``genq bench`` run: ``mode`` in-process against ``queue_engine`` through the
    queue."""

    model: str
    mode: str
    queue_engine: str
    requests: int
    repeats: int
    variant: str = ""
    """What ``settings`` change, shown after the engine's name."""
    settings: tuple[tuple[str, str], ...] = ()
    """The worker's settings through the queue, as environment variables (``GENQ_...``)."""

    @property
    def engine(self) -> str:
        return f"{self.queue_engine} ({self.variant})" if self.variant else self.queue_engine

    @property
    def env(self) -> dict[str, str]:
        return dict(self.settings)

    def args(self, device: str) -> list[str]:
        return [
            "bench",
            "--device",
            device,
            "--model",
            self.model,
            "--requests",
            str(self.requests),
            "--repeats",
            str(self.repeats),
            "--modes",
            self.mode,
            "--queue-engine",
            self.queue_engine,
            "--json",
        ]


@dataclass(frozen=True)
class AdapterCase:
    """``genq bench --scenario adapters --quick`` (static engine) on ``model``: the base
    against 4 LoRA adapters mixed in batches, through the queue, and the fleet's loads (its
    markdown, as the bench prints it)."""

    model: str
    engine = "static, LoRA adapters"

    env: ClassVar[dict[str, str]] = {}

    def args(self, device: str) -> list[str]:
        scenario = ["bench", "--scenario", "adapters", "--quick"]
        return [*scenario, "--model", self.model, "--device", device]


SLICE_OFF = (("GENQ_TIME_SLICE_MS", "0"),)
NO_ROOM = (("GENQ_PREFIX_CACHE_TOKENS", "0"),)
"""A continuous engine whose paged cache has no prefix room beyond its budget (the bench's
in-process engine follows the worker's environment). BENCHMARKS.md has the queue's
tokens/s 8% higher without the room, one run each: this case repeats it."""
GPU_CASES: tuple[Case | AdapterCase, ...] = (
    Case("random-250m", "budgeted_static", "static", 256, 1),
    Case("random-1b", "budgeted_static", "static", 256, 1),
    AdapterCase("random-250m"),
    Case("random-250m", "continuous", "continuous", 256, 1),
    Case("random-250m", "continuous", "continuous", 256, 1, "time slice off", SLICE_OFF),
    Case("random-250m", "continuous", "continuous", 256, 1, "no prefix room", NO_ROOM),
    Case("random-1b", "continuous", "continuous", 256, 1),
)
"""In order of importance (what the time left cannot hold is reported as not run; ``--only``
picks cases). On an H200 the first four took about 100, 90, 170 and 140 s: the
rest do not fit in 8 minutes; run them with ``--only`` or by hand when there is time
(``genq bench --device cuda --model random-1b
--modes continuous --queue-engine continuous --requests 256 --repeats 1``)."""
SKIPPED = (
    ("prefix placement on vLLM (`genq bench --scenario prefix-vllm`)", "needs vLLM"),
    ("LoRA adapters on vLLM (`genq bench --scenario adapters --engine vllm`)", "needs vLLM"),
)


def dry_cases() -> tuple[Case | AdapterCase, ...]:
    """The GPU cases' shape on the tiny model, small enough for a CPU."""
    first: dict[str, Case] = {}  # each engine's first case
    for c in GPU_CASES:
        if isinstance(c, Case):
            first.setdefault(c.queue_engine, c)
    return (
        *(Case("tiny", c.mode, c.queue_engine, 8, 1) for c in first.values()),
        AdapterCase("tiny"),
    )


def run_case(case: Case | AdapterCase, device: str, timeout_s: float) -> dict[str, Any]:
    """One case's row: tokens/s in-process and through the queue, their ratio, its time (an
    adapter case: its section of markdown)."""
    t0 = time.perf_counter()
    command = [sys.executable, "-m", "genq.worker", *case.args(device)]
    row: dict[str, Any] = {"model": case.model, "engine": case.engine}
    try:
        done = subprocess.run(
            command,
            capture_output=True,
            text=True,
            timeout=max(1, timeout_s),
            env={**os.environ, **case.env},
        )
    except subprocess.TimeoutExpired:
        return {**row, "status": f"stopped after {timeout_s:.0f} s (time limit)"}
    row["wall_s"] = round(time.perf_counter() - t0, 1)
    if done.returncode != 0:
        return {**row, "status": f"failed: {done.stderr.strip().splitlines()[-1:]}"}
    if isinstance(case, AdapterCase):  # its markdown, after the line that names the machine
        return {**row, "status": "ok", "section": done.stdout.split("\n", 1)[1].strip()}
    report = json.loads(done.stdout)
    speeds = {m["mode"]: m["tokens_per_s"] for m in report["modes"]}
    row["in_process"] = speeds.get(case.mode)
    row["queue"] = speeds.get(f"queue_{case.queue_engine}")
    row["ratio"] = report["queue_vs_best_in_process"]
    return {**row, "status": "ok"}


def machine(device: str) -> str:
    """The machine in one line: the GPU, python, torch, transformers, redis-server."""
    import torch
    import transformers

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
    redis = subprocess.run(["redis-server", "--version"], capture_output=True, text=True)
    version = next((w for w in redis.stdout.split() if w.startswith("v=")), "v=?")[2:]
    whose = "carried" if ".gpu_check" in (shutil.which("redis-server") or "") else "the machine's"
    return (
        f"GPU {gpu}; python {platform.python_version()}, torch {torch.__version__}, "
        f"transformers {transformers.__version__}, redis-server {version} ({whose})"
    )


def markdown(rows: list[dict[str, Any]], header: str, device: str) -> str:
    """The check's one table, with what it did not run."""
    lines = [
        f"GPU check ({header}; device {device}).",
        "",
        "| model | engine | in-process tokens/s | through the queue tokens/s | queue ÷ in-process "
        "| s | status |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in (r for r in rows if r["engine"] != AdapterCase.engine):
        speed = [r.get(k) for k in ("in_process", "queue")]
        cells = ["-" if v is None else f"{v:,.0f}" for v in speed]
        ratio = "-" if r.get("ratio") is None else f"{r['ratio']:.3f}"
        lines.append(
            f"| {r['model']} | {r['engine']} | {cells[0]} | {cells[1]} | {ratio} | "
            f"{r.get('wall_s', '-')} | {r['status']} |"
        )
    for r in (r for r in rows if r["engine"] == AdapterCase.engine):
        title = f"LoRA adapters through the queue (`genq bench --scenario adapters`, {r['model']})"
        body = r.get("section") or f"{r['status']}."
        lines += ["", f"{title}, {r.get('wall_s', '-')} s:", "", body]
    lines += ["", *(f"- Not run: {what} ({why})." for what, why in SKIPPED)]
    return "\n".join(lines) + "\n"


def check(
    *, dry_run: bool, output: Path, limit_s: float = LIMIT_S, only: tuple[str, ...] = ()
) -> list[dict[str, Any]]:
    """Every case that fits in ``limit_s`` (with ``only``: those whose "model engine" holds
    one of its texts); the table written to ``output``."""
    device = "cpu" if dry_run else "cuda"
    deadline = time.monotonic() + limit_s
    rows = []
    cases = dry_cases() if dry_run else GPU_CASES
    for case in [c for c in cases if not only or any(o in f"{c.model} {c.engine}" for o in only)]:
        left = deadline - time.monotonic()
        if left < 20:
            rows.append({"model": case.model, "engine": case.engine, "status": "no time"})
            continue
        rows.append(run_case(case, device, left))
        click.echo(f"gpu check: {rows[-1]}", err=True)
    output.write_text(markdown(rows, machine(device), device))
    return rows


@click.command()
@click.option("--dry-run", is_flag=True, help="the cases on the CPU with the tiny model")
@click.option("--output", type=click.Path(path_type=Path), default=Path("gpu_check.md"))
@click.option("--limit-s", type=float, default=LIMIT_S, show_default=True)
@click.option(
    "--only",
    multiple=True,
    help='run only the cases whose "model engine" holds this text (again for more)',
)
def main(dry_run: bool, output: Path, limit_s: float, only: tuple[str, ...]) -> None:
    """Run the GPU check and write its table to OUTPUT."""
    rows = check(dry_run=dry_run, output=output, limit_s=limit_s, only=only)
    click.echo(output.read_text())
    if any(r["status"].startswith("failed") for r in rows):
        sys.exit(1)


if __name__ == "__main__":
    main()
