"""The queue's own speed, one tree of genq against another, taking turns (#39's "at least the
last round's main, on the same machine, taking turns").

Each revision's ``common/``, ``producer/`` and ``worker/`` are copied out of git (``git
archive``; ``worktree``: this checkout as it is, uncommitted changes included) into a
``genq`` package of their own, and ``benchmarks/queue_speed.py`` (this checkout's) runs once
per round per tree with that package first on ``PYTHONPATH``: its client and its worker
process are the tree's. Each run is one echo worker and ``--jobs`` no-op jobs end to end; the
table gives per round the jobs/s and the CPU seconds of the worker, redis-server and the
client (the machine has few cores: a second of CPU anywhere shows end to end), then the
medians and each tree's median ÷ the first tree's.

    python benchmarks/queue_speed_turns.py --revs debcfa9,HEAD --rounds 3
    python benchmarks/queue_speed_turns.py --revs HEAD,worktree --rounds 5 --jobs 20000
    python benchmarks/queue_speed_turns.py --revs HEAD~1,HEAD --jobs 5000 --prompt-bytes 8000

``--prompt-bytes``: each prompt carries that many bytes more (a chat's history), for costs that
grow with a body's size.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ("common", "producer", "worker")
"""The folders that install as ``genq.common``, ``genq.producer`` and ``genq.worker``."""
WORKTREE = "worktree"
COLUMNS = ("jobs_per_s", "worker_cpu_s", "redis_cpu_s", "client_cpu_s")


def tree(rev: str, into: Path) -> Path:
    """A directory holding ``genq/{common,producer,worker}`` as ``rev`` has them; returns the
    directory to put on ``PYTHONPATH``."""
    package = into / "genq"
    package.mkdir(parents=True)
    if rev == WORKTREE:
        for folder in FOLDERS:
            shutil.copytree(ROOT / folder, package / folder)
        return into
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "--format=tar", rev, *FOLDERS],
        capture_output=True,
        check=True,
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(package, filter="data")
    return into


def run_once(path: Path, jobs: int, prompt_bytes: int = 0) -> dict[str, float]:
    """One run of queue_speed.py's genq case with the tree at ``path`` first on the path."""
    env = {**os.environ, "PYTHONPATH": str(path)}
    script = [str(ROOT / "benchmarks" / "queue_speed.py"), "--jobs", str(jobs), "--repeats", "1"]
    script += ["--prompt-bytes", str(prompt_bytes)]
    done = subprocess.run(
        [sys.executable, *script, "--systems", "genq", "--json"],
        capture_output=True,
        text=True,
        env=env,
        cwd=path,  # not this checkout: its folders must not shadow the tree's package
        check=True,
    )
    genq = json.loads(done.stdout.strip().splitlines()[-1])["genq"]
    return {
        "jobs_per_s": jobs / genq["total_s"],
        "worker_cpu_s": genq["worker_cpu_s"],
        "redis_cpu_s": genq["redis_cpu_s"],
        "client_cpu_s": genq["client_cpu_s"],
    }


def table(
    revs: list[str], runs: dict[str, list[dict[str, float]]], jobs: int, prompt_bytes: int = 0
) -> str:
    """The rounds, the medians and the ratios to the first tree, in markdown."""
    padded = f" --prompt-bytes {prompt_bytes}" if prompt_bytes else ""
    lines = [
        f"Command: `python benchmarks/queue_speed_turns.py --revs {','.join(revs)} "
        f"--rounds {len(runs[revs[0]])} --jobs {jobs}{padded}`",
        "",
        "| round | tree | jobs/s | worker CPU s | redis-server CPU s | client CPU s "
        "| CPU µs a job |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for i in range(len(runs[revs[0]])):
        for rev in revs:
            r = runs[rev][i]
            lines.append(
                f"| {i + 1} | {rev} | {r['jobs_per_s']:,.0f} | {r['worker_cpu_s']:.2f} | "
                f"{r['redis_cpu_s']:.2f} | {r['client_cpu_s']:.2f} | {cpu_us(r, jobs):.0f} |"
            )
    base = statistics.median(r["jobs_per_s"] for r in runs[revs[0]])
    base_cpu = statistics.median(cpu_us(r, jobs) for r in runs[revs[0]])
    for rev in revs:
        med = {c: statistics.median(r[c] for r in runs[rev]) for c in COLUMNS}
        cpu = statistics.median(cpu_us(r, jobs) for r in runs[rev])
        lines.append(
            f"| median | {rev} | {med['jobs_per_s']:,.0f} ({med['jobs_per_s'] / base:.2f}x) | "
            f"{med['worker_cpu_s']:.2f} | {med['redis_cpu_s']:.2f} | {med['client_cpu_s']:.2f} | "
            f"{cpu:.0f} ({cpu / base_cpu:.2f}x) |"
        )
    return "\n".join(lines)


def cpu_us(run: dict[str, float], jobs: int) -> float:
    """The CPU a job of one run: worker, Redis and client together. On a machine whose cores
    are full it sets the jobs/s, and it moves less than they do with what else runs there."""
    return (run["worker_cpu_s"] + run["redis_cpu_s"] + run["client_cpu_s"]) * 1e6 / jobs


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--revs", default="debcfa9,HEAD", help=f"git revisions, or {WORKTREE!r}")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--jobs", type=int, default=20000)
    p.add_argument("--prompt-bytes", type=int, default=0, help="more in each job's prompt")
    a = p.parse_args()
    revs = a.revs.split(",")
    runs = take_turns(revs, a.rounds, lambda path: run_once(path, a.jobs, a.prompt_bytes))
    print(table(revs, runs, a.jobs, a.prompt_bytes))


def take_turns(
    revs: list[str], rounds: int, run: Callable[[Path], dict[str, float]]
) -> dict[str, list[dict[str, float]]]:
    """``run`` once per round per tree, the trees taking turns; each tree's runs."""
    with tempfile.TemporaryDirectory(prefix="genq-turns-") as tmp:
        paths = {rev: tree(rev, Path(tmp) / str(i)) for i, rev in enumerate(revs)}
        runs: dict[str, list[dict[str, float]]] = {rev: [] for rev in revs}
        for i in range(rounds):
            for rev in revs:
                runs[rev].append(run(paths[rev]))
                print(f"round {i + 1} {rev}: {runs[rev][-1]}", file=sys.stderr)
    return runs


if __name__ == "__main__":
    main()
