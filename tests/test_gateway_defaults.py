"""Safe defaults at ``genq serve``: an open gateway (no keys) binds loopback only unless told, and
answers loopback host names only; no browser page of another site can make it do anything;
no schema pages for strangers; an operator's work is not the bare key's tenant. The guards'
rules are a pure function, tested alone; then on a real gateway."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from genq.producer import Client
from genq.producer.gateway.guards import is_loopback, problem
from genq.worker.devtools.gateway_process import GatewayProcess

from tests.conftest import WorkerProcess, genq, wait_until

JSON = {b"content-type": b"application/json", b"content-length": b"10"}


def _h(**more: bytes) -> dict[bytes, bytes]:
    return {
        b"host": b"127.0.0.1:8000",
        **JSON,
        **{k.replace("_", "-").encode(): v for k, v in more.items()},
    }


def test_the_guards_rules() -> None:
    post = "/v1/chat/completions"
    assert problem("POST", post, _h(), open_gateway=True) is None
    assert problem("POST", post, {**_h(), b"host": b"localhost"}, open_gateway=True) is None
    rebinding = problem("GET", "/v1/models", {b"host": b"evil.example:8000"}, open_gateway=True)
    assert rebinding is not None and rebinding[0] == 403
    assert problem("GET", "/v1/models", {b"host": b"evil.example"}, open_gateway=False) is None
    cross = problem("POST", post, _h(sec_fetch_site=b"cross-site"), open_gateway=False)
    assert cross is not None and cross[0] == 403
    foreign = problem("POST", post, _h(origin=b"https://evil.example"), open_gateway=False)
    assert foreign is not None and foreign[0] == 403
    same = problem("POST", post, _h(origin=b"http://127.0.0.1:8000"), open_gateway=False)
    assert same is None
    plain = {**_h(), b"content-type": b"text/plain"}
    assert (problem("POST", post, plain, open_gateway=False) or (0,))[0] == 415
    charset = {**_h(), b"content-type": b"application/json; charset=utf-8"}
    assert problem("POST", post, charset, open_gateway=False) is None
    upload = {**_h(), b"content-type": b"multipart/form-data; boundary=x"}
    assert problem("POST", "/v1/files", upload, open_gateway=False) is None
    no_body = {b"host": b"127.0.0.1:8000"}  # a cancel: nothing to be JSON
    assert problem("POST", "/v1/batches/b/cancel", no_body, open_gateway=False) is None
    assert all(is_loopback(h) for h in ("127.0.0.1", "localhost", "::1", "[::1]", "127.0.0.2"))
    assert not any(is_loopback(h) for h in ("0.0.0.0", "10.0.0.1", "example.com", "::"))


def test_an_open_gateway_refuses_a_public_bind_unless_told(redis_url: str) -> None:
    done = genq("serve", "--redis-url", redis_url, "--host", "0.0.0.0")
    assert done.returncode != 0 and "--insecure-open" in done.stderr, done.stderr[-500:]
    refused = genq("serve", "--api-key", "k=operators")
    assert refused.returncode != 0 and "reserved" in refused.stderr


def test_a_browser_page_cannot_use_an_open_gateway(
    redis_url: str, queue: str, tmp_path: Path, start_worker: Callable[..., WorkerProcess]
) -> None:
    gateway = GatewayProcess(redis_url, queue, tmp_path / "gateway.log")
    try:
        start_worker(queue, "--engine", "echo")
        wait_until(lambda: httpx.get(f"{gateway.url}/models").json()["data"])
        url = f"{gateway.url}/chat/completions"
        body = '{"model": "echo", "messages": [{"role": "user", "content": "hi"}]}'
        # What a page of another site can send without asking: text/plain, its own Origin.
        simple = httpx.post(url, content=body, headers={"content-type": "text/plain"})
        assert simple.status_code == 415
        cross = httpx.post(
            url,
            content=body,
            headers={"content-type": "application/json", "origin": "https://evil.example"},
        )
        assert cross.status_code == 403
        # DNS rebinding: the page's own name, resolved to 127.0.0.1.
        rebound = httpx.get(f"{gateway.url}/models", headers={"host": "evil.example"})
        assert rebound.status_code == 403
        for path in ("/openapi.json", "/docs", "/redoc"):
            assert httpx.get(gateway.url.removesuffix("/v1") + path).status_code == 404
        ok = httpx.post(url, content=body, headers={"content-type": "application/json"})
        assert ok.status_code == 200, ok.text
    finally:
        gateway.stop()


def test_an_operators_work_is_not_the_bare_keys_tenant(
    redis_url: str, queue: str, tmp_path: Path, start_worker: Callable[..., WorkerProcess]
) -> None:
    args = ["--api-key", "bare", "--admin-key", "boss"]
    gateway = GatewayProcess(redis_url, queue, tmp_path / "gateway.log", args)
    try:
        start_worker(queue, "--engine", "echo")
        auth = {"Authorization": "Bearer boss"}
        wait_until(lambda: httpx.get(f"{gateway.url}/models", headers=auth).json()["data"])
        body = {"model": "echo", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        done = httpx.post(f"{gateway.url}/chat/completions", json=body, headers=auth).json()
        assert Client.from_url(redis_url, queue).status(done["id"]).tenant == "operators"
        stored = httpx.post(
            f"{gateway.url}/responses", json={"model": "echo", "input": "x"}, headers=auth
        ).json()
        bare = httpx.get(
            f"{gateway.url}/responses/{stored['id']}", headers={"Authorization": "Bearer bare"}
        )
        assert bare.status_code == 404  # the bare key is tenant default: not an operator
    finally:
        gateway.stop()


def test_a_503_for_redis_names_no_address(tmp_path: Path) -> None:
    """The gateway's Redis goes away: tenants learn it is away, not where it lives."""
    from genq.worker.devtools.redis_server import RedisServer

    server = RedisServer().start()
    gateway = GatewayProcess(server.url, "q503", tmp_path / "gateway.log", ["--api-key", "k"])
    try:
        server.stop()
        time.sleep(1.5)  # the served models' list, read at start, is stale
        body = {"model": "echo", "messages": [{"role": "user", "content": "hi"}]}
        answer = httpx.post(
            f"{gateway.url}/chat/completions",
            json=body,
            headers={"Authorization": "Bearer k"},
            timeout=60,
        )
        assert answer.status_code == 503
        assert "127.0.0.1" not in answer.text and str(server.port) not in answer.text, answer.text
    finally:
        gateway.stop()


def test_a_tenant_may_not_go_above_its_highest_priority(
    redis_url: str, queue: str, tmp_path: Path, start_worker: Callable[..., WorkerProcess]
) -> None:
    """``genq tenants set --max-priority``: the SUBMIT script refuses a request above it, for
    every producer (the client here, and the gateway: 403); at or below it, served."""
    from genq.common.errors import PriorityDenied

    common = ["--redis-url", redis_url, "--queue", queue]
    done = genq("tenants", "set", "alice", *common, "--max-priority", "normal")
    assert done.returncode == 0 and '"max_priority": "normal"' in done.stdout, done.stderr
    client = Client.from_url(redis_url, queue)
    with pytest.raises(PriorityDenied, match="its highest is 'normal'"):
        client.submit("x", priority="high", tenant="alice")
    client.submit("x", priority="high", tenant="bob")  # another tenant: no limit
    gateway = GatewayProcess(redis_url, queue, tmp_path / "gateway.log", ["--api-key", "ka=alice"])
    try:
        start_worker(queue, "--engine", "echo")
        auth = {"Authorization": "Bearer ka"}
        wait_until(lambda: httpx.get(f"{gateway.url}/models", headers=auth).json()["data"])
        body = {"model": "echo", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        high = httpx.post(
            f"{gateway.url}/chat/completions", json={**body, "priority": "high"}, headers=auth
        )
        assert high.status_code == 403 and high.json()["error"]["code"] == "priority_denied"
        normal = httpx.post(
            f"{gateway.url}/chat/completions", json={**body, "priority": "normal"}, headers=auth
        )
        assert normal.status_code == 200, normal.text
    finally:
        gateway.stop()


def test_files_batches_and_responses_belong_to_their_queue(
    redis_url: str, queue: str, tmp_path: Path, start_worker: Callable[..., WorkerProcess]
) -> None:
    """Two gateways of two queues on one Redis, a tenant of the same name on each: what one
    made is 404 on the other, given its id."""
    keys = ["--api-key", "k=acme"]
    here = GatewayProcess(redis_url, queue, tmp_path / "a.log", keys)
    there = GatewayProcess(redis_url, queue + "-other", tmp_path / "b.log", keys)
    try:
        start_worker(queue, "--engine", "echo")
        auth = {"Authorization": "Bearer k"}
        wait_until(lambda: httpx.get(f"{here.url}/models", headers=auth).json()["data"])
        chat = {"model": "echo", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        line = '{"custom_id": "c", "method": "POST", "url": "/v1/chat/completions", "body": %s}'
        upload = {"file": ("in.jsonl", (line % json.dumps(chat)).encode())}
        fid = httpx.post(
            f"{here.url}/files", files=upload, data={"purpose": "batch"}, headers=auth
        ).json()["id"]
        create = {
            "input_file_id": fid,
            "endpoint": "/v1/chat/completions",
            "completion_window": "24h",
        }
        bid = httpx.post(f"{here.url}/batches", json=create, headers=auth).json()["id"]
        rid = httpx.post(
            f"{here.url}/responses", json={"model": "echo", "input": "x"}, headers=auth
        ).json()["id"]
        for path in (
            f"/files/{fid}",
            f"/files/{fid}/content",
            f"/batches/{bid}",
            f"/responses/{rid}",
        ):
            assert httpx.get(here.url + path, headers=auth).status_code == 200, path
            assert httpx.get(there.url + path, headers=auth).status_code == 404, path
    finally:
        here.stop()
        there.stop()
