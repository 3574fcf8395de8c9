"""Where the queue's own speed goes, one tree of genq against another, taking turns (#39's
"find where it goes"). ``queue_speed_turns.py`` says how fast each tree is; this says where
each spends its CPU, per job, on the same run shape (one echo worker, ``--jobs`` no-op jobs,
batches of 256):

- **Redis**, counted by Redis: its CPU (INFO cpu) and its scripts' time (INFO commandstats,
  the commands a script calls included) for the submission alone (the jobs submitted while no
  worker runs), then for the drain (a worker reads, marks running and writes every job); and
  the drain's claims and reads (XCLAIM, XREADGROUP: inside scripts or not).
- **The worker**, by thread CPU time: its loop (the CPU of its turns, ``Worker.turn``, timed
  in the worker process: read from ``/proc`` after the worker is serving, a short run's drain
  could be over before the first reading, and ``/proc`` counts in 10 ms ticks), its other
  threads (from ``/proc``), and the loop's steps that every tree has (``Worker.admit`` with
  ``Intake.admit`` and its tokenizing inside, ``Worker.plan``, ``Worker.start`` with its
  ``running`` write, and ``Outcomes.succeeded``: wrapped in the worker process, which adds the
  same small cost to each tree).

    python benchmarks/queue_speed_stages.py --revs debcfa9,HEAD --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
from queue_speed_turns import take_turns  # noqa: E402

STAGES = (
    "Worker.admit",
    "Intake.admit",
    "Intake._tokenize",
    "Worker.plan",
    "Worker.start",
    "Outcomes.succeeded",
)
"""The loop's steps timed (``Class.method``), where the tree has them."""
LOOP = "Worker.turn"
"""Timed as well: the loop's CPU (``loop_us``), its turns'."""

WORKER = """
import atexit, collections, json, os, sys, time
from genq.worker.runtime import intake, outcomes, worker
spent = collections.Counter()
def timed(cls, name):
    inner = getattr(cls, name, None)
    if inner is None:
        return
    label = f"{cls.__name__}.{name}"
    def wrapper(*args, **kwargs):
        t0 = time.thread_time()
        try:
            return inner(*args, **kwargs)
        finally:
            spent[label] += time.thread_time() - t0
    setattr(cls, name, wrapper)
for label in json.loads(os.environ["STAGES_WANTED"]):
    owner, name = label.split(".")
    cls = {"Worker": worker.Worker, "Intake": intake.Intake, "Outcomes": outcomes.Outcomes}[owner]
    timed(cls, name)
atexit.register(lambda: open(os.environ["STAGES_OUT"], "w").write(json.dumps(spent)))
sys.argv = ["genq", *sys.argv[1:]]
from genq.worker.commands import main
main()
"""


def thread_cpu_s(pid: int) -> dict[int, float]:
    """CPU seconds of each thread of process ``pid`` (Linux ``/proc``)."""
    out = {}
    tick = os.sysconf("SC_CLK_TCK")
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        out[int(tid)] = (int(fields[11]) + int(fields[12])) / tick
    return out


def redis_usec(r: object) -> dict[str, float]:
    """Redis' own microseconds per command (scripts include what they call), and its CPU
    (``cpu``)."""
    stats = r.info("commandstats")  # type: ignore[attr-defined]
    out = {name.removeprefix("cmdstat_"): float(v["usec"]) for name, v in stats.items()}
    cpu = r.info("cpu")  # type: ignore[attr-defined]
    out["cpu"] = (cpu["used_cpu_user"] + cpu["used_cpu_sys"]) * 1e6
    return out


def run_once(path: Path, jobs: int) -> dict[str, float]:
    """One run with the tree at ``path``: submit ``jobs`` with no worker, then drain them."""
    code = f"""
import json, sys
sys.path.insert(0, {str(ROOT)!r})
import queue_speed_stages as s
print(json.dumps(s.measure({jobs})))
"""
    env = {**os.environ, "PYTHONPATH": str(path)}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=path, check=True
    )
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def measure(jobs: int) -> dict[str, float]:
    """(In the tree's own process.) The run itself: see the module's docstring."""
    import redis
    from genq.producer import Client
    from genq.worker.devtools.redis_server import RedisServer
    from genq.worker.devtools.worker_process import wait_until_serving

    out: dict[str, float] = {}
    with RedisServer() as server, tempfile.TemporaryDirectory() as tmp:
        r = redis.Redis(port=server.port)
        client = Client.from_url(server.url, "stages")
        before = redis_usec(r)
        ids = client.submit_many([f"job {i} " for i in range(jobs)], max_new_tokens=16)
        submitted = redis_usec(r)
        out["redis_submit_cpu_us"] = submitted["cpu"] - before["cpu"]
        out["redis_submit_scripts_us"] = _scripts(submitted) - _scripts(before)
        wanted = json.dumps([*STAGES, LOOP])
        env = {**os.environ, "STAGES_WANTED": wanted, "STAGES_OUT": f"{tmp}/s.json"}
        args = ["worker", "--redis-url", server.url, "--queue", "stages", "--engine", "echo"]
        args += ["--consumer", "w0", "--max-batch-size", "256", "--max-lookahead", "512"]
        proc = subprocess.Popen(
            [sys.executable, "-c", WORKER, *args],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            wait_until_serving(r, "stages", "w0", proc)
            cpu0, start = thread_cpu_s(proc.pid), redis_usec(r)
            client.results(ids, timeout=600)
            cpu1, end = thread_cpu_s(proc.pid), redis_usec(r)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
        spent = json.loads(Path(f"{tmp}/s.json").read_text())
    out["redis_drain_cpu_us"] = end["cpu"] - start["cpu"]
    out["redis_drain_scripts_us"] = _scripts(end) - _scripts(start)
    for name in ("xclaim", "xreadgroup"):
        out[f"redis_{name}_us"] = end.get(name, 0) - start.get(name, 0)
    loop = spent.get(LOOP, cpu1.get(proc.pid, 0.0) - cpu0.get(proc.pid, 0.0))
    threads = [cpu1[t] - cpu0.get(t, 0.0) for t in cpu1 if t != proc.pid]
    out["loop_us"], out["other_threads_us"] = loop * 1e6, sum(threads) * 1e6
    for label in STAGES:
        if label in spent:
            out[label] = spent[label] * 1e6
    return {k: v / jobs for k, v in out.items()}


def _scripts(usec: dict[str, float]) -> float:
    return usec.get("eval", 0) + usec.get("evalsha", 0) + usec.get("fcall", 0)


def table(revs: list[str], runs: dict[str, list[dict[str, float]]], jobs: int) -> str:
    """Each tree's medians per job, and the difference to the first tree's, in markdown."""
    keys = [f"redis_{a}_{b}_us" for a in ("submit", "drain") for b in ("cpu", "scripts")]
    keys += ["redis_xclaim_us", "redis_xreadgroup_us", "loop_us", "other_threads_us", *STAGES]
    med = {
        rev: {k: statistics.median(r.get(k, 0.0) for r in runs[rev]) for k in keys} for rev in revs
    }
    lines = [
        f"Command: `python benchmarks/queue_speed_stages.py --revs {','.join(revs)} "
        f"--rounds {len(runs[revs[0]])} --jobs {jobs}` (µs per job, medians)",
        "",
        "| what | " + " | ".join(revs) + " | difference |",
        "|---|" + "---:|" * (len(revs) + 1),
    ]
    for k in keys:
        cells = [f"{med[rev][k]:.1f}" for rev in revs]
        diff = med[revs[-1]][k] - med[revs[0]][k]
        lines.append(f"| {k.removesuffix('_us')} | " + " | ".join(cells) + f" | {diff:+.1f} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--revs", default="debcfa9,HEAD", help="git revisions, or 'worktree'")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--jobs", type=int, default=20000)
    a = p.parse_args()
    revs = a.revs.split(",")
    runs = take_turns(revs, a.rounds, lambda path: run_once(path, a.jobs))
    print(table(revs, runs, a.jobs))


if __name__ == "__main__":
    main()
