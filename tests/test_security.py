"""AUTH, an ACL user limited to genq's keys and commands, and TLS, each against a real
redis-server configured that way; and no prompt or output in the worker's log."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from genq.producer import Client
from genq.worker.devtools.redis_server import RedisServer

from tests.conftest import GENQ_ACL, WorkerProcess

SECRET_PROMPT = "the secret prompt 7f3a"


def round_trip(url: str, tmp_path: Path, queue: str = "sec") -> str:
    """A worker and a client on ``url``: submit, generate (echo), read back, and `genq stats`."""
    worker = WorkerProcess(
        ["--redis-url", url, "--queue", queue, "--engine", "echo", "--consumer", "sec"],
        tmp_path / f"{queue}.log",
    )
    try:
        with Client.from_url(url, queue) as client:
            result = client.generate(SECRET_PROMPT, max_new_tokens=64, timeout=30)
            assert result.status == "succeeded" and result.text == SECRET_PROMPT
            assert client.cancel(client.submit("x", max_new_tokens=1)) in (True, False)
        stats = subprocess.run(
            [sys.executable, "-m", "genq.worker", "stats", "--redis-url", url, "--queue", queue],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert stats.returncode == 0, stats.stderr
    finally:
        assert worker.stop() == 0
    log = worker.log()
    assert SECRET_PROMPT not in log  # prompts and outputs are not logged
    return log


def test_an_acl_user_that_may_not_read_redis_time_still_works(tmp_path: Path) -> None:
    """Without +time the worker times by its own clock, and says so once."""
    with RedisServer() as server:
        admin = redis.Redis(port=server.port)
        admin.execute_command("ACL", "SETUSER", "genq", *GENQ_ACL.replace(" +time", "").split())
        url = f"redis://genq:genq-secret@127.0.0.1:{server.port}/0"
        log = round_trip(url, tmp_path)
        assert log.count("may not run TIME") == 1


def test_password_auth(tmp_path: Path) -> None:
    with RedisServer(["--requirepass", "s3cret"]) as server:
        url = f"redis://:s3cret@127.0.0.1:{server.port}/0"
        round_trip(url, tmp_path)
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(port=server.port).ping()


def test_an_acl_user_limited_to_genq_keys_and_commands(tmp_path: Path) -> None:
    with RedisServer() as server:
        admin = redis.Redis(port=server.port)
        admin.execute_command("ACL", "SETUSER", "genq", *GENQ_ACL.split())
        admin.execute_command("ACL", "SETUSER", "default", "off")
        url = f"redis://genq:genq-secret@127.0.0.1:{server.port}/0"
        round_trip(url, tmp_path)
        limited = redis.Redis.from_url(url)
        # The worker loaded genq's Redis Functions as this user.
        assert limited.execute_command("FCALL", "genq_version", 0) >= 1
        with pytest.raises(redis.exceptions.NoPermissionError):
            limited.get("not-genq")
        with pytest.raises(redis.exceptions.NoPermissionError):
            limited.flushall()


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    trustme = pytest.importorskip("trustme")
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    d = tmp_path_factory.mktemp("tls")
    files = {"ca": d / "ca.pem", "cert": d / "server.pem", "key": d / "server.key"}
    ca.cert_pem.write_to_path(str(files["ca"]))
    cert.cert_chain_pems[0].write_to_path(str(files["cert"]))
    cert.private_key_pem.write_to_path(str(files["key"]))
    yield files


def test_tls_rediss_url(tmp_path: Path, tls_files: dict[str, Path]) -> None:
    from genq.worker.devtools.redis_server import free_port

    tls_port = free_port()
    args = [
        "--port",
        "0",
        "--tls-port",
        str(tls_port),
        "--tls-cert-file",
        str(tls_files["cert"]),
        "--tls-key-file",
        str(tls_files["key"]),
        "--tls-ca-cert-file",
        str(tls_files["ca"]),
        "--tls-auth-clients",
        "no",
    ]
    server = RedisServer(args, port=tls_port)
    try:
        server.start(tls_ca_certs=str(tls_files["ca"]))
    except RuntimeError as err:
        pytest.skip(f"this redis-server cannot serve TLS: {err}")
    try:
        url = f"rediss://127.0.0.1:{tls_port}/0?ssl_ca_certs={tls_files['ca']}"
        round_trip(url, tmp_path)
        with pytest.raises(redis.ConnectionError):  # plain text is refused
            redis.Redis(port=tls_port, socket_timeout=2).ping()
    finally:
        server.stop()


def genq_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "genq.worker", *args], capture_output=True, text=True, timeout=60
    )


def test_a_wrong_password_fails_at_once_in_one_line_for_commands_and_workers() -> None:
    import time

    with RedisServer(["--requirepass", "s3cret"]) as server:
        url = f"redis://:wrong@127.0.0.1:{server.port}/0"
        for args in (
            ("stats", "--redis-url", url),
            ("worker", "--engine", "echo", "--redis-url", url),
        ):
            t0 = time.monotonic()
            out = genq_cli(*args)
            assert out.returncode == 1, out.stderr
            assert time.monotonic() - t0 < 5  # was ~9 s: authentication was retried as a drop
            assert "Traceback" not in out.stderr
            assert "Redis refused the credentials" in out.stderr and "--redis-url" in out.stderr


def test_a_port_with_nothing_on_it_is_one_line_saying_what_to_check() -> None:
    import time

    from genq.worker.devtools.redis_server import free_port

    t0 = time.monotonic()
    out = genq_cli("stats", "--redis-url", f"redis://127.0.0.1:{free_port()}/0")
    assert time.monotonic() - t0 < 5  # was ~9 s: a refused connection was retried
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert "cannot reach Redis" in out.stderr and "redis-server runs there" in out.stderr
