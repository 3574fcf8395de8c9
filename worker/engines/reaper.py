"""A worker's reaper: a small process that outlives its worker by a moment, to end the processes
the worker's engine started (``start_reaper``; run as ``python -m genq.worker.engines.reaper
PID``).

vLLM runs its engine core (and its own workers) in child processes. A worker that exits
normally stops them; one killed with SIGKILL cannot, and they went on with parent 1, holding
their memory (on a GPU: the KV cache, so the next worker on that device could not start). The
reaper is the worker's child with ``PR_SET_PDEATHSIG``: the kernel signals it the moment the
worker dies, however it dies. Meanwhile it notes the worker's descendants every ``POLL_S``,
and less often (up to ``STEADY_POLL_S``) once they stayed the same for ``SETTLE_S``: each look
reads every process's stat in /proc (~3 ms with 65 processes on 2 shared cores; more on a busy
GPU host), which cost an idle vLLM worker ~1% of a core. When the worker is gone it SIGKILLs
each noted process that is still the same process (same start time: never a pid reused by
someone else), then exits. Linux only; elsewhere it is not started.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

POLL_S = 0.5
"""How often the reaper notes the worker's descendants while they change, and for
``SETTLE_S`` after the worker's start and after each change (a process started and orphaned
within the last poll is missed: an engine starts its processes at the worker's start)."""
SETTLE_S = 30.0
STEADY_POLL_S = 4.0
"""The longest pause between looks, reached by doubling once the descendants stayed the
same for ``SETTLE_S``."""
PR_SET_PDEATHSIG = 1


def start_reaper() -> subprocess.Popen[bytes] | None:
    """Start this process's reaper (None where /proc is not there to read)."""
    if not os.path.isdir("/proc/self"):
        return None
    return subprocess.Popen(
        [sys.executable, "-m", "genq.worker.engines.reaper", str(os.getpid())],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def stop_reaper(reaper: subprocess.Popen[bytes] | None) -> None:
    """End a reaper whose engine closed cleanly (its processes ended): it has nothing to do,
    and a pool of models starts one with each engine it loads."""
    if reaper is not None:
        reaper.kill()  # (it ignores SIGTERM: its worker's death is its cue)
        reaper.wait()


def _stat(pid: int | str) -> tuple[int, str] | None:
    """A process's parent and start time (None if it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2 :].split()  # after "pid (comm) "
    return int(fields[1]), fields[19]


def descendants(root: int) -> dict[int, str]:
    """Every process below ``root`` (pid -> start time), this one excepted."""
    children: dict[int, list[int]] = {}
    starts: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            found = _stat(entry)
            if found is not None:
                children.setdefault(found[0], []).append(int(entry))
                starts[int(entry)] = found[1]
    out: dict[int, str] = {}
    stack = [root]
    while stack:
        for child in children.get(stack.pop(), ()):
            if child != os.getpid() and child not in out:
                out[child] = starts[child]
                stack.append(child)
    return out


def reap(noted: dict[int, str]) -> list[int]:
    """SIGKILL each noted process that is still the one noted; the pids killed."""
    killed = []
    for pid, start in noted.items():
        found = _stat(pid)
        if found is not None and found[1] == start:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
    return killed


def main(worker: int) -> None:
    import ctypes

    signal.signal(signal.SIGTERM, lambda *_: None)  # the worker's death: noticed below
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C is the worker's to handle
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    noted: dict[int, str] = {}
    changed_s, pause_s = time.monotonic(), POLL_S
    while os.getppid() == worker:
        now = descendants(worker)
        if now.items() - noted.items():
            changed_s, pause_s = time.monotonic(), POLL_S
        noted = {pid: start for pid, start in {**noted, **now}.items() if _stat(pid)}
        _sleep_until_parent_dies(pause_s, worker)
        pause_s = next_pause_s(pause_s, time.monotonic() - changed_s)
    reap(noted)


def next_pause_s(pause_s: float, stable_s: float) -> float:
    """The pause before the next look, after ``pause_s`` and ``stable_s`` seconds without a
    change: ``POLL_S`` until ``SETTLE_S``, then doubling up to ``STEADY_POLL_S``."""
    return POLL_S if stable_s < SETTLE_S else min(STEADY_POLL_S, pause_s * 2)


def _sleep_until_parent_dies(pause_s: float, worker: int) -> None:
    """Sleep ``pause_s``, or less: the worker's death ends it, seen within ``POLL_S`` (the
    parent is checked that often; the SIGTERM of ``PR_SET_PDEATHSIG`` does not cut a sleep
    short, as Python resumes one after a handler returns)."""
    deadline = time.monotonic() + pause_s
    while os.getppid() == worker and time.monotonic() < deadline:
        time.sleep(min(POLL_S, max(0.0, deadline - time.monotonic())))


if __name__ == "__main__":
    main(int(sys.argv[1]))
