"""AUTH, an ACL user limited to genq's keys and commands, and TLS, each against a real
redis-server configured that way; and no prompt or output in the worker's log."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from genq.producer import Client
from genq.worker.devtools.redis_server import RedisServer

from tests.conftest import GENQ_ACL, GENQ_ACL_USERS, WorkerProcess, genq

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


def test_a_wrong_password_fails_at_once_in_one_line_for_commands_and_workers() -> None:
    import time

    with RedisServer(["--requirepass", "s3cret"]) as server:
        url = f"redis://:wrong@127.0.0.1:{server.port}/0"
        for args in (
            ("stats", "--redis-url", url),
            ("worker", "--engine", "echo", "--redis-url", url),
        ):
            t0 = time.monotonic()
            out = genq(*args)
            assert out.returncode == 1, out.stderr
            assert time.monotonic() - t0 < 5  # was ~9 s: authentication was retried as a drop
            assert "Traceback" not in out.stderr
            assert "Redis refused the credentials" in out.stderr and "--redis-url" in out.stderr


def test_a_port_with_nothing_on_it_is_one_line_saying_what_to_check() -> None:
    import time

    from genq.worker.devtools.redis_server import free_port

    t0 = time.monotonic()
    out = genq("stats", "--redis-url", f"redis://127.0.0.1:{free_port()}/0")
    assert time.monotonic() - t0 < 5  # was ~9 s: a refused connection was retried
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert "cannot reach Redis" in out.stderr and "redis-server runs there" in out.stderr


class _Hooks:
    """A webhook endpoint on loopback that keeps what it was sent (headers, body)."""

    def __init__(self) -> None:
        import http.server
        import threading

        got: list[tuple[dict[str, str], str]] = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["content-length"])).decode()
                got.append(({k.lower(): v for k, v in self.headers.items()}, body))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.got = got
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def test_each_part_works_under_its_own_documented_least_privilege_user(tmp_path: Path) -> None:
    """Everything a deployment runs, each part as its documented ACL user: the operator (as
    ``genq-gateway``) sets a rate-limited tenant and a tenant's webhook secret; a worker
    (``genq-worker``) serves them, holding the limited tenant's requests back and putting them
    back (LPUSH); the client, ``genq batch`` and ``genq stats`` (``genq-producer``) submit,
    stream, cancel and wait; ``genq serve`` (``genq-gateway``) serves chats, streams,
    responses, files, batches and the dashboard, and delivers the tenant's webhook signed with
    its secret. Every answer is a success and Redis logged no refusal (INFO and CONFIG, which
    genq reads only where it may, aside); producers and workers cannot read the secrets or the
    uploaded files, and producers cannot acknowledge or claim work."""
    from genq.common import webhooks
    from genq.common.keys import GROUP, Keys
    from genq.worker.devtools.gateway_process import GatewayProcess

    hooks, secret, q = _Hooks(), "whsec_" + "A" * 32, "acl"
    with RedisServer() as server:
        admin = redis.Redis(port=server.port)
        for name, acl in GENQ_ACL_USERS.items():
            admin.execute_command("ACL", "SETUSER", name, *acl.split())
        admin.execute_command("ACL", "SETUSER", "default", "resetpass", ">admin-secret")
        admin = redis.Redis(port=server.port, password="admin-secret")  # no part runs as it
        url = {u: f"redis://{u}:genq-secret@127.0.0.1:{server.port}/0" for u in GENQ_ACL_USERS}
        operator = ["--redis-url", url["genq-gateway"], "--queue", q]
        limited = genq("tenants", "set", "acme", *operator, "--tokens-per-minute", "60")
        assert limited.returncode == 0, limited.stderr
        hook = ["--webhook-url", hooks.url, "--webhook-secret", "-"]
        as_producer = ["--redis-url", url["genq-producer"], "--queue", q]
        refused = genq("tenants", "set", "beta", *as_producer, *hook, stdin=secret + "\n")
        assert refused.returncode == 77 and "Traceback" not in refused.stderr
        assert "refused this user" in refused.stderr and secret not in refused.stderr
        admin.acl_log_reset()  # that refusal was the point; none other may follow
        hooked = genq("tenants", "set", "beta", *operator, *hook, stdin=secret + "\n")
        assert hooked.returncode == 0, hooked.stderr
        worker = WorkerProcess(
            ["--redis-url", url["genq-worker"], "--queue", q, "--engine", "echo"],
            tmp_path / "worker.log",
        )
        keys = ["--api-key", "k=beta", "--admin-key", "boss"]
        gateway = GatewayProcess(url["genq-gateway"], q, tmp_path / "gateway.log", keys)
        try:
            with Client.from_url(url["genq-producer"], q) as client:
                held = client.submit_many(["x" * 40] * 6, max_new_tokens=8, tenant="acme")
                assert client.result(held[0], timeout=60).status == "succeeded"
                rid = client.submit("hello there", max_new_tokens=4, stream=True)
                assert list(client.stream(rid, timeout=30))[-1].status == "succeeded"
                slow = client.submit("x", max_new_tokens=4000)
                assert client.cancel(slow) in (True, False)
                assert client.result(slow, timeout=30).is_final
            _batch_and_stats_as(url["genq-producer"], q, tmp_path)
            statuses = _gateway_tour(gateway)
            assert set(statuses.values()) == {200}, statuses
            for _ in range(100):  # beta's batches end: batch.* events, to beta's endpoint
                if hooks.got:
                    break
                time.sleep(0.1)
            headers, body = hooks.got[0]
            ts = int(headers["webhook-timestamp"])
            signed = webhooks.signed_headers(secret, headers["webhook-id"], ts, body)
            assert headers["webhook-signature"] == signed["webhook-signature"]
            assert worker.proc.poll() is None, worker.log()[-2000:]
        finally:
            gateway.stop()
            assert worker.stop() == 0, worker.log()[-2000:]
            hooks.server.shutdown()
        refusals = {
            (e["username"], e["object"], e["reason"])
            for e in admin.acl_log(1000)
            if e["object"] not in ("info", "config|get")
        }
        assert refusals == set(), refusals
        stream = Keys(q).stream("normal")
        for user in ("genq-producer", "genq-worker"):
            r = redis.Redis.from_url(url[user])
            with pytest.raises(redis.exceptions.NoPermissionError):
                r.hgetall(Keys(q).webhook_secrets)
            with pytest.raises(redis.exceptions.NoPermissionError):
                r.get(Keys.file("file-anything"))
        producer = redis.Redis.from_url(url["genq-producer"])
        for refused_call in (
            lambda: producer.xack(stream, GROUP, "0-1"),
            lambda: producer.xclaim(stream, GROUP, "me", 0, ["0-1"]),
            lambda: producer.function_load(
                "#!lua name=x\nredis.register_function('x', function() return 1 end)"
            ),
        ):
            with pytest.raises(redis.exceptions.NoPermissionError):
                refused_call()


def _batch_and_stats_as(url: str, queue: str, tmp_path: Path) -> None:
    """``genq batch submit``, ``results`` and ``genq stats`` as the user of ``url``."""
    chat = {"model": "echo", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    line = {"custom_id": "c1", "method": "POST", "url": "/v1/chat/completions", "body": chat}
    (tmp_path / "in.jsonl").write_text(json.dumps(line) + "\nnot json\n")
    where = ["--redis-url", url, "--queue", queue]
    submitted = genq("batch", "submit", str(tmp_path / "in.jsonl"), *where)
    assert submitted.returncode == 0, submitted.stderr
    out = tmp_path / "out.jsonl"
    done = genq("batch", "results", submitted.stdout.strip(), *where, "-o", str(out))
    assert done.returncode == 0, done.stderr
    assert json.loads(out.read_text().splitlines()[0])["custom_id"] == "c1"
    stats = genq("stats", *where)
    assert stats.returncode == 0, stats.stderr


def _gateway_tour(gateway: object) -> dict[str, int]:
    """What a tenant and an operator do at a gateway; each call's HTTP status."""
    import httpx

    base = gateway.url
    tenant, boss = {"Authorization": "Bearer k"}, {"Authorization": "Bearer boss"}
    chat = {"model": "echo", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    for _ in range(100):
        if httpx.get(f"{base}/models", headers=tenant).json()["data"]:
            break
        time.sleep(0.1)
    out: dict[str, int] = {}

    def call(name: str, method: str, path: str, **kw: object) -> httpx.Response:
        r = httpx.request(method, base + path, timeout=60, **kw)  # type: ignore[arg-type]
        out[name] = r.status_code
        return r

    call("chat", "POST", "/chat/completions", json=chat, headers=tenant)
    call("stream", "POST", "/chat/completions", json={**chat, "stream": True}, headers=tenant)
    rid = call(
        "response", "POST", "/responses", json={"model": "echo", "input": "x"}, headers=tenant
    ).json()["id"]
    call("retrieve", "GET", f"/responses/{rid}", headers=tenant)
    call(
        "follow-up",
        "POST",
        "/responses",
        headers=tenant,
        json={"model": "echo", "input": "y", "previous_response_id": rid},
    )
    call("delete response", "DELETE", f"/responses/{rid}", headers=tenant)
    line = json.dumps(
        {"custom_id": "c1", "method": "POST", "url": "/v1/chat/completions", "body": chat}
    )
    upload = {"file": ("in.jsonl", f"{line}\nnot json\n".encode())}
    fid = call(
        "upload", "POST", "/files", files=upload, data={"purpose": "batch"}, headers=tenant
    ).json()["id"]
    call("file", "GET", f"/files/{fid}", headers=tenant)
    call("file content", "GET", f"/files/{fid}/content", headers=tenant)
    create = {"input_file_id": fid, "endpoint": "/v1/chat/completions", "completion_window": "24h"}
    bid = call("batch", "POST", "/batches", json=create, headers=tenant).json()["id"]
    for _ in range(200):
        if httpx.get(f"{base}/batches/{bid}", headers=tenant).json()["status"] == "completed":
            break
        time.sleep(0.1)
    call("batches", "GET", "/batches", headers=tenant)
    call("output", "GET", f"/files/{bid}-output/content", headers=tenant)
    call("errors", "GET", f"/files/{bid}-errors/content", headers=tenant)
    other = call("batch 2", "POST", "/batches", json=create, headers=tenant).json()["id"]
    call("cancel batch", "POST", f"/batches/{other}/cancel", headers=tenant)
    call("delete file", "DELETE", f"/files/{fid}", headers=tenant)
    board = {**boss, "X-Genq-Dashboard": "1"}
    dashboard = gateway.dashboard + "/api"
    for page in ("snapshot", "batches", "dead-letters"):
        r = httpx.get(f"{dashboard}/{page}", headers=board, timeout=60)
        out[f"dashboard {page}"] = r.status_code
    time.sleep(1.0)  # a webhook delivery or two (to nowhere: retried, then given up)
    return out


def test_a_worker_refused_a_permission_says_so_in_one_line_and_is_not_restarted() -> None:
    """An ACL user without HSET (the heartbeat): the worker exits with one line naming the
    refusal and status 77 (EX_NOPERM), and ``--gpus`` does not restart it (it would only meet
    the same refusal, forever)."""
    from genq.common.errors import EXIT_NO_PERMISSION

    with RedisServer() as server:
        admin = redis.Redis(port=server.port)
        admin.execute_command("ACL", "SETUSER", "genq", *GENQ_ACL.replace(" +hset ", " ").split())
        url = f"redis://genq:genq-secret@127.0.0.1:{server.port}/0"
        base = [sys.executable, "-m", "genq.worker", "worker", "--redis-url", url]
        alone = subprocess.run(
            [*base, "--engine", "echo"], capture_output=True, text=True, timeout=120
        )
        assert alone.returncode == EXIT_NO_PERMISSION, alone.stderr[-2000:]
        assert "Traceback" not in alone.stderr
        [line] = [x for x in alone.stderr.splitlines() if x.startswith("genq worker: Redis")]
        assert "refused this user a command" in line
        supervised = subprocess.run(
            [*base, "--engine", "echo", "--gpus", "0,1"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert supervised.returncode == EXIT_NO_PERMISSION, supervised.stderr[-2000:]
        assert "restarting" not in supervised.stderr and "not restarted" in supervised.stderr
