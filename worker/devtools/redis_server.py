"""A private redis-server on a free loopback port: for ``genq demo`` and the test suite.

Runs the real ``redis-server`` binary (Debian: ``apt-get install redis-server``) in a temporary
directory and stops it (and removes the directory) on ``stop()``.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import redis
from genq.common.errors import ConfigError

T = TypeVar("T")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class RedisServer:
    """A redis-server process of our own. Use as a context manager, or start()/stop()."""

    def __init__(self, extra_args: Sequence[str] = (), port: int | None = None) -> None:
        self.extra_args = list(extra_args)
        self.port = port or free_port()
        self.dir: Path | None = None
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The redis:// URL of this server."""
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 10.0, tls_ca_certs: str | None = None) -> RedisServer:
        """Start the server and wait until it answers PING (over TLS, trusting
        ``tls_ca_certs``, when ``port`` is the server's TLS port)."""
        binary = shutil.which("redis-server")
        if binary is None:
            raise ConfigError(
                "redis-server is not installed: install it (Debian/Ubuntu: "
                "apt-get install -y redis-server) or pass --redis-url of a running Redis"
            )
        if self.dir is None:
            self.dir = Path(tempfile.mkdtemp(prefix="genq-redis-"))
        args = [
            binary,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(self.dir),
            "--save",
            "",
            "--appendonly",
            "no",
            "--daemonize",
            "no",
            "--loglevel",
            "warning",
        ]
        self.process = subprocess.Popen(
            [*args, *self.extra_args],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        deadline = time.monotonic() + timeout_s
        tls: dict[str, Any] = {"ssl": True, "ssl_ca_certs": tls_ca_certs} if tls_ca_certs else {}
        client = redis.Redis(host="127.0.0.1", port=self.port, socket_connect_timeout=0.5, **tls)
        try:
            while True:
                if self.process.poll() is not None:
                    err = self.process.stderr.read().decode() if self.process.stderr else ""
                    raise RuntimeError(f"redis-server exited at start: {err.strip()}")
                try:
                    client.ping()
                    return self
                except redis.AuthenticationError:
                    return self  # a server that asks for a password is up
                except redis.ConnectionError:
                    if time.monotonic() > deadline:
                        raise RuntimeError(
                            f"redis-server did not answer within {timeout_s} s"
                        ) from None
                    time.sleep(0.02)
                except redis.ResponseError as err:
                    if "NOAUTH" in str(err):
                        return self
                    raise
        finally:
            client.close()

    def stop(self, remove_dir: bool = True) -> None:
        """Stop the server (SIGTERM, then SIGKILL) and remove its directory. Idempotent."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.process is not None and self.process.stderr:
            self.process.stderr.close()
        self.process = None
        if remove_dir and self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def on_redis(redis_url: str | None, run: Callable[[str], T]) -> T:
    """``run(url)`` on ``redis_url``, or on a private redis-server started for it (and stopped
    after)."""
    server = None if redis_url else RedisServer().start()
    try:
        return run(server.url if server else str(redis_url))
    finally:
        if server is not None:
            server.stop()
