"""``genq worker --gpus all | 0,1,3``: one worker process per GPU, supervised.

Each child is a plain ``genq worker`` pinned to its GPU with ``CUDA_VISIBLE_DEVICES`` (so it
sees it as ``cuda``), named ``CONSUMER-gpuN`` so that a restarted child resumes its own pending
entries. A child that dies is restarted after a backoff (1 s, doubling to 30 s; reset once it
has run for a minute). SIGTERM or Ctrl-C is forwarded to every child, which drains as usual;
the launcher exits 0 when all have exited 0. A second signal kills the children at once.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import FrameType

from genq.common.errors import EXIT_NO_PERMISSION, ConfigError
from genq.common.settings import WorkerSettings

log = logging.getLogger("genq.launcher")

POLL_S = 0.2
BACKOFF_START_S = 1.0
BACKOFF_MAX_S = 30.0
HEALTHY_AFTER_S = 60.0


def child_env(parent: Mapping[str, str], gpu: int) -> dict[str, str]:
    """A child's environment: the launcher's, pinned to one GPU, and without ``GENQ_GPUS``: a
    child that inherited it would be a launcher itself, and so on without end (compose files
    and Kubernetes set exactly this variable)."""
    gpus_env = WorkerSettings.env_var("gpus")
    env = {k: v for k, v in parent.items() if k != gpus_env}
    env["CUDA_VISIBLE_DEVICES"] = str(gpu)
    return env


def visible_gpus() -> int:
    """How many CUDA GPUs this process can see (0 without torch or CUDA)."""
    try:
        import torch
    except ImportError:
        return 0
    return int(torch.cuda.device_count()) if torch.cuda.is_available() else 0


def parse_gpus(spec: str, needs_cuda: bool) -> list[int]:
    """The GPU indices of ``--gpus``: ``all`` or a comma list. Raises ConfigError with what to
    do instead when the machine has no GPU (or not those)."""
    count = visible_gpus()
    if spec.strip() == "all":
        if count == 0:
            raise ConfigError(
                "--gpus all: no CUDA GPU is visible here (torch.cuda.device_count() is 0); "
                "run `genq worker` without --gpus for one CPU worker"
            )
        return list(range(count))
    try:
        gpus = [int(x) for x in spec.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"--gpus {spec!r}: give 'all' or indices like 0,1,3") from None
    if not gpus or len(set(gpus)) != len(gpus) or min(gpus) < 0:
        raise ConfigError(f"--gpus {spec!r}: give 'all' or distinct indices like 0,1,3")
    if needs_cuda and max(gpus) >= count:
        raise ConfigError(
            f"--gpus {spec}: this machine has {count} visible CUDA GPU(s); "
            + ("run without --gpus for one CPU worker" if count == 0 else f"use 0-{count - 1}")
        )
    return gpus


@dataclass(kw_only=True)
class Child:
    """One supervised worker process."""

    gpu: int
    consumer: str
    proc: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    backoff_s: float = BACKOFF_START_S
    restart_at: float = 0.0
    restarts: int = 0
    refused: bool = False
    """It exited for a Redis permission it lacks (``EXIT_NO_PERMISSION``): not restarted, as
    a restart would meet the same refusal."""


@dataclass
class Launcher:
    """Starts, watches and stops one worker per GPU."""

    gpus: Sequence[int]
    worker_args: list[str]
    """``genq worker`` flags every child gets (without --gpus, --consumer, --device)."""
    consumer_base: str = field(default_factory=socket.gethostname)
    device: str = "cuda"
    children: list[Child] = field(default_factory=list)
    _signals: int = 0

    def run(self) -> int:
        """Supervise until a signal; return the exit code."""
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        self.children = [Child(gpu=g, consumer=f"{self.consumer_base}-gpu{g}") for g in self.gpus]
        for c in self.children:
            self._start(c)
        log.info("supervising %d workers on GPUs %s", len(self.children), list(self.gpus))
        while not self._signals and not all(c.refused for c in self.children):
            time.sleep(POLL_S)
            self._watch()
        code = self._shutdown()
        return EXIT_NO_PERMISSION if all(c.refused for c in self.children) else code

    def _start(self, c: Child) -> None:
        env = child_env(os.environ, c.gpu)
        args = [
            sys.executable,
            "-m",
            "genq.worker",
            "worker",
            *self.worker_args,
            "--consumer",
            c.consumer,
            "--device",
            self.device,
        ]
        # A session of its own: a Ctrl-C at the terminal reaches only the launcher, which
        # forwards one SIGTERM (a child that got both would take it as the second signal).
        c.proc = subprocess.Popen(args, env=env, start_new_session=True)
        c.started = time.monotonic()

    def _watch(self) -> None:
        now = time.monotonic()
        for c in self.children:
            if c.proc is not None and c.proc.poll() == EXIT_NO_PERMISSION:
                log.error(
                    "worker %s lacks a Redis permission (its log says which): not restarted",
                    c.consumer,
                )
                c.proc, c.refused = None, True
                continue
            if c.proc is not None and c.proc.poll() is not None:
                if now - c.started > HEALTHY_AFTER_S:
                    c.backoff_s = BACKOFF_START_S
                log.warning(
                    "worker %s exited with %s; restarting in %.0f s",
                    c.consumer,
                    c.proc.returncode,
                    c.backoff_s,
                )
                c.proc, c.restart_at = None, now + c.backoff_s
                c.backoff_s = min(BACKOFF_MAX_S, c.backoff_s * 2)
            if c.proc is None and not c.refused and now >= c.restart_at and not self._signals:
                c.restarts += 1
                self._start(c)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._signals += 1
        live = [c.proc for c in self.children if c.proc is not None and c.proc.poll() is None]
        if self._signals == 1:
            log.info("signal %d: asking %d workers to drain", signum, len(live))
            for p in live:
                p.send_signal(signal.SIGTERM)
        else:
            log.warning("second signal: killing the workers now")
            for p in live:
                p.kill()

    def _shutdown(self) -> int:
        codes = []
        for c in self.children:
            if c.proc is not None:
                codes.append(c.proc.wait())
        restarts = sum(c.restarts for c in self.children)
        log.info(
            "launcher stopped: workers=%d restarts=%d exit_codes=%s",
            len(self.children),
            restarts,
            codes,
        )
        return 0 if all(code == 0 for code in codes) else 1
