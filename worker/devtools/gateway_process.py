"""A ``genq serve`` process on a free loopback port: for the tests and ``genq bench``."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from genq.worker.devtools.redis_server import free_port


class GatewayProcess:
    """``genq serve`` (or ``command="dashboard"``: ``genq dashboard``) for one queue; ``url``
    is its OpenAI base URL (``.../v1``), ``dashboard`` its dashboard's. ``wrapper``: a command
    that runs it (``prlimit --fsize=...``)."""

    def __init__(
        self,
        redis_url: str,
        queue: str,
        log: Path | None,
        extra_args: Sequence[str] = (),
        command: str = "serve",
        wrapper: Sequence[str] = (),
    ) -> None:
        self.port, self.command = free_port(), command
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self.dashboard = f"http://127.0.0.1:{self.port}/dashboard"
        self._log = open(log or os.devnull, "w")  # noqa: SIM115 (closed in stop)
        args = ["--redis-url", redis_url, "--queue", queue, "--port", str(self.port)]
        self.proc = subprocess.Popen(
            [*wrapper, sys.executable, "-m", "genq.worker", command, *args, *extra_args],
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        self._wait_until_serving()

    def _wait_until_serving(self, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"genq {self.command} exited with status {self.proc.returncode}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=1):
                    return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"genq {self.command} did not answer within {timeout_s} s")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._log.close()
