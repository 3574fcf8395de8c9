"""A ``genq worker`` subprocess for the demo and the benchmarks: started with settings as
keyword arguments, waited for until it publishes its heartbeat."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import IO, Any

import redis
from genq.common.keys import Keys


def worker_args(**settings: object) -> list[str]:
    """``genq worker`` flags for these settings: ``max_batch_size=16`` is
    ``--max-batch-size 16``."""
    args = []
    for name, value in settings.items():
        args += [f"--{name.replace('_', '-')}", str(value)]
    return args


def start_worker(
    *,
    log: IO[bytes] | int = subprocess.DEVNULL,
    extra_args: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
    **settings: object,
) -> subprocess.Popen[bytes]:
    """Start ``genq worker`` with these settings (``python -m genq.worker``); ``extra_args``
    go last, so they win over the settings; ``env``: more environment variables."""
    command = [sys.executable, "-m", "genq.worker", "worker", *worker_args(**settings)]
    command += extra_args
    environ = {**os.environ, **env} if env else None
    return subprocess.Popen(command, stdout=log, stderr=log, env=environ)


def wait_until_serving(
    r: redis.Redis, queue: str, consumer: str, proc: subprocess.Popen[Any], timeout_s: float = 300
) -> None:
    """Wait until the worker's heartbeat key exists; raise RuntimeError if it exits or takes
    longer than ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    key = Keys(queue).worker(consumer)
    while not r.exists(key):
        if proc.poll() is not None:
            raise RuntimeError(f"the worker exited with status {proc.returncode}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"the worker did not start within {timeout_s} s")
        time.sleep(0.05)


def stop_worker(proc: subprocess.Popen[Any], timeout_s: float = 60) -> None:
    """Stop a worker started by ``start_worker``: SIGTERM (it finishes what it holds), then
    SIGKILL if it has not exited within ``timeout_s``."""
    proc.terminate()
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
