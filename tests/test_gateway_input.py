"""Bounded input at ``genq serve``: every malformed body is a 400 naming what is wrong (never a
500), a body over its limit is a 413 before it is held whole, tool schemas are bounded in all
and checked off the event loop, and what a chat's tool calls carry counts against the prompt
limit. Real redis-server, ``genq serve`` and an echo worker."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from genq.common.errors import InvalidRequest
from genq.producer import build_request
from genq.worker.devtools.gateway_process import GatewayProcess

from tests.conftest import WorkerProcess, genq, wait_until

M = [{"role": "user", "content": "hi"}]
MALFORMED_CHATS: dict[str, bytes | str] = {
    "nested too deeply": "[" * 100_000 + "]" * 100_000,
    "'model' must be a string": json.dumps({"model": ["echo"], "messages": M}),
    "'text' must be a string": json.dumps(
        {"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]}
    ),
    "messages.0.content": json.dumps({"messages": [{"role": "user", "content": 5}]}),
    "stop": json.dumps({"messages": M, "stop": {"a": 1}}),
    "metadata": json.dumps({"messages": M, "metadata": {"k" * 100: "v"}}),
    "'stream_options' must be an object": json.dumps(
        {"messages": M, "stream": True, "stream_options": [1]}
    ),
    "tools": json.dumps({"messages": M, "tools": "x"}),
    "tools.0.function.name": json.dumps(
        {"messages": M, "tools": [{"type": "function", "function": {"name": 5}}]}
    ),
    "parallel_tool_calls": json.dumps({"messages": M, "parallel_tool_calls": "yes"}),
    "not valid JSON": b'{"messages": "\xff"}',
    "finite": '{"messages": [{"role": "user", "content": "x"}], "temperature": NaN}',
}


@pytest.fixture()
def gateway(
    redis_url: str, queue: str, tmp_path: Path, start_worker: Callable[..., WorkerProcess]
) -> Iterator[GatewayProcess]:
    g = GatewayProcess(redis_url, queue, tmp_path / "gateway.log", ["--max-body-bytes", "1000000"])
    start_worker(queue, "--engine", "echo")
    wait_until(lambda: httpx.get(f"{g.url}/models").json()["data"])
    yield g
    g.stop()


def _post(gateway: GatewayProcess, path: str, body: Any, **kw: Any) -> httpx.Response:
    headers = {"content-type": "application/json"}
    return httpx.post(f"{gateway.url}{path}", content=body, headers=headers, timeout=60, **kw)


def test_every_malformed_body_is_a_400_naming_what_is_wrong(gateway: GatewayProcess) -> None:
    for why, body in MALFORMED_CHATS.items():
        response = _post(gateway, "/chat/completions", body)
        assert response.status_code == 400, (why, response.text)
        assert why in response.json()["error"]["message"], (why, response.text)
    responses = {
        "'model' must be a string": {"input": "x", "model": ["a"]},
        "'text' must be a string": {
            "input": [{"role": "user", "content": [{"type": "input_text", "text": 5}]}]
        },
    }
    for why, doc in responses.items():
        response = _post(gateway, "/responses", json.dumps(doc))
        assert response.status_code == 400 and why in response.text, (why, response.text)
    # Still serving.
    ok = _post(gateway, "/chat/completions", json.dumps({"messages": M, "max_tokens": 2}))
    assert ok.status_code == 200, ok.text


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def test_a_body_over_the_limit_is_413_before_it_is_held_whole(gateway: GatewayProcess) -> None:
    before = _rss_mb(gateway.proc.pid)
    big = json.dumps({"messages": [{"role": "user", "content": "x" * 50_000_000}]}).encode()
    declared = _post(gateway, "/chat/completions", big)  # with its Content-Length
    assert declared.status_code == 413, declared.text
    assert "--max-body-bytes" in declared.json()["error"]["message"]

    def chunks() -> Iterator[bytes]:  # no Content-Length: counted as it arrives
        for i in range(0, len(big), 1 << 20):
            yield big[i : i + (1 << 20)]

    try:
        chunked = _post(gateway, "/chat/completions", chunks())
        assert chunked.status_code == 413, chunked.text
    except httpx.WriteError:  # the gateway answered and closed while we still sent: refused
        pass
    assert _rss_mb(gateway.proc.pid) - before < 30  # never held 50 MB
    ok = _post(gateway, "/chat/completions", json.dumps({"messages": M, "max_tokens": 2}))
    assert ok.status_code == 200, ok.text


def _tool(i: int, fields: int) -> dict[str, Any]:
    props = {f"f{j}": {"type": "string", "description": "d" * 40} for j in range(fields)}
    params = {"type": "object", "properties": props, "required": list(props)}
    return {"type": "function", "function": {"name": f"t{i}", "parameters": params}}


def test_tool_schemas_are_bounded_in_all_and_checked_off_the_event_loop(
    gateway: GatewayProcess,
) -> None:
    too_many = {"messages": M, "tools": [_tool(i, 60) for i in range(16)]}  # ~100 KB
    t0 = time.perf_counter()
    refused = _post(gateway, "/chat/completions", json.dumps(too_many))
    assert refused.status_code == 400 and "at most 65536 in all" in refused.text
    assert time.perf_counter() - t0 < 2  # refused by size, before any schema is checked
    fits = {"messages": M, "tools": [_tool(i, 20) for i in range(8)], "max_tokens": 2}
    first = _post(gateway, "/chat/completions", json.dumps(fits))
    assert first.status_code == 200, first.text
    # The same tools again: checked once (cached by hash), answered as fast as a plain chat.
    t0 = time.perf_counter()
    assert _post(gateway, "/chat/completions", json.dumps(fits)).status_code == 200
    assert time.perf_counter() - t0 < 2


def test_tool_calls_count_against_the_prompt_limit() -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    big_call = {**call, "function": {"name": "f", "arguments": "x" * 150_000}}
    messages = [
        {"role": "user", "content": "y" * 60_000},
        {"role": "assistant", "content": None, "tool_calls": [big_call]},
        {"role": "tool", "tool_call_id": "c1", "content": "ok"},
    ]
    with pytest.raises(InvalidRequest, match="characters in all"):
        build_request(messages=messages)
    messages[1] = {"role": "assistant", "content": None, "tool_calls": [call]}
    assert build_request(messages=messages).messages is not None


def test_a_file_of_junk_lines_costs_redis_little_and_lists_every_refused_line(
    gateway: GatewayProcess, redis_url: str
) -> None:
    """20,000 junk lines and one good one: each junk line is in the error file with its number
    (written to the file store as the batch runs, never a record each in Redis), and Redis is
    back to what it held before once the batch is done."""
    import redis

    r = redis.Redis.from_url(redis_url)
    good = json.dumps(
        {
            "custom_id": "ok",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": "echo", "messages": M, "max_tokens": 2},
        }
    )
    junk = "\n".join(f"junk line {i} " + "x" * 40 for i in range(20_000))
    files = {"file": ("in.jsonl", f"{good}\n{junk}\n".encode())}
    upload = httpx.post(f"{gateway.url}/files", files=files, data={"purpose": "batch"}, timeout=60)
    assert upload.status_code == 200, upload.text
    before = int(r.info("memory")["used_memory"])
    create = {
        "input_file_id": upload.json()["id"],
        "endpoint": "/v1/chat/completions",
        "completion_window": "24h",
    }
    batch = httpx.post(f"{gateway.url}/batches", json=create, timeout=120).json()

    def done() -> dict[str, Any]:
        return httpx.get(f"{gateway.url}/batches/{batch['id']}", timeout=60).json()

    wait_until(lambda: done()["status"] == "completed", timeout_s=60)
    assert done()["request_counts"] == {"total": 20_001, "completed": 1, "failed": 20_000}
    grown = int(r.info("memory")["used_memory"]) - before
    assert grown < 2_000_000, grown  # its record; no line of it left (20,000 records: 4.4 MB+)
    errors = httpx.get(f"{gateway.url}/files/{batch['id']}-errors/content", timeout=60).text
    lines = [json.loads(x) for x in errors.splitlines()]
    assert len(lines) == 20_000
    numbers = sorted(int(x["error"]["message"].split(":")[0].split()[1]) for x in lines)
    assert numbers == list(range(2, 20_002))


def test_uploads_cost_redis_nothing_and_a_batch_waits_for_redis_room(
    gateway: GatewayProcess, redis_url: str, queue: str, tmp_path: Path
) -> None:
    """An upload's bytes go to the file store: a 3 MB file uploads into a Redis with 4 MB to
    spare, and Redis' memory does not grow by it. A batch of its 30,000 lines is taken, chats
    go on beside it while Redis is full, and once Redis has room again every line runs."""
    import redis

    r = redis.Redis.from_url(redis_url)
    chat = {"model": "echo", "messages": M, "max_tokens": 2}
    line = {"custom_id": "c", "method": "POST", "url": "/v1/chat/completions", "body": chat}
    content = b"".join(
        json.dumps({**line, "custom_id": f"c{i}"}).encode() + b"\n" for i in range(30_000)
    )
    assert len(content) > 3_000_000
    used = int(r.info("memory")["used_memory"])
    r.config_set("maxmemory", used + 4_000_000)
    try:
        files = {"file": ("in.jsonl", content)}
        up = httpx.post(f"{gateway.url}/files", files=files, data={"purpose": "batch"}, timeout=60)
        assert up.status_code == 200, up.text
        assert int(r.info("memory")["used_memory"]) < used + 500_000  # the bytes are not in Redis
        made = {"input_file_id": up.json()["id"], "endpoint": "/v1/chat/completions"}
        batch = httpx.post(f"{gateway.url}/batches", json=made, timeout=60)
        assert batch.status_code == 200, batch.text
        for _ in range(3):
            answer = httpx.post(f"{gateway.url}/chat/completions", json=chat, timeout=60)
            assert answer.is_success, answer.text
    finally:
        r.config_set("maxmemory", 0)
    bid = batch.json()["id"]

    def status() -> dict[str, Any]:
        return httpx.get(f"{gateway.url}/batches/{bid}", timeout=60).json()

    wait_until(lambda: status()["status"] == "completed", timeout_s=120)
    assert status()["request_counts"] == {"total": 30_000, "completed": 30_000, "failed": 0}


def test_what_a_tenant_keeps_is_bounded_and_another_tenant_is_untouched(
    redis_url: str, queue: str, tmp_path: Path, start_worker: Callable[..., WorkerProcess]
) -> None:
    """Quotas: files (count and bytes), batches, stored responses; past one, 429
    ``tenant_quota`` naming the limit; a delete gives its place back; the other tenant's own
    uploads and responses go on. A tenant's own limit overrides the gateway's default."""
    args = [
        "--api-key",
        "ka=alice",
        "--api-key",
        "kb=bob",
        "--tenant-max-files",
        "2",
        "--tenant-max-responses",
        "2",
        "--tenant-max-batches",
        "1",
    ]
    g = GatewayProcess(redis_url, queue, tmp_path / "gateway.log", args)
    try:
        start_worker(queue, "--engine", "echo")
        alice, bob = {"Authorization": "Bearer ka"}, {"Authorization": "Bearer kb"}
        wait_until(lambda: httpx.get(f"{g.url}/models", headers=alice).json()["data"])
        chat = {"model": "echo", "messages": M, "max_tokens": 2}
        line = json.dumps(
            {"custom_id": "c", "method": "POST", "url": "/v1/chat/completions", "body": chat}
        ).encode()

        def upload(who: dict[str, str], content: bytes = line) -> httpx.Response:
            files = {"file": ("in.jsonl", content)}
            return httpx.post(f"{g.url}/files", files=files, data={"purpose": "batch"}, headers=who)

        first, second = upload(alice), upload(alice)
        assert first.status_code == second.status_code == 200
        third = upload(alice)
        assert third.status_code == 429 and third.json()["error"]["code"] == "tenant_quota"
        assert "keeps 2 files" in third.json()["error"]["message"]
        assert upload(bob).status_code == 200  # bob's own quota
        fid = first.json()["id"]
        assert httpx.delete(f"{g.url}/files/{fid}", headers=alice).status_code == 200
        assert upload(alice).status_code == 200  # the delete gave its place back
        create = {
            "input_file_id": second.json()["id"],
            "endpoint": "/v1/chat/completions",
            "completion_window": "24h",
        }
        assert httpx.post(f"{g.url}/batches", json=create, headers=alice).status_code == 200
        assert httpx.post(f"{g.url}/batches", json=create, headers=alice).status_code == 429
        ask = {"model": "echo", "input": "x"}
        made = [httpx.post(f"{g.url}/responses", json=ask, headers=alice) for _ in range(3)]
        assert [m.status_code for m in made] == [200, 200, 429]
        unstored = httpx.post(f"{g.url}/responses", json={**ask, "store": False}, headers=alice)
        assert unstored.status_code == 200  # nothing kept: no quota
        rid = made[0].json()["id"]
        assert httpx.delete(f"{g.url}/responses/{rid}", headers=alice).status_code == 200
        assert httpx.post(f"{g.url}/responses", json=ask, headers=alice).status_code == 200
        # Her own limit: bytes. 2 files of the line's size would pass it.
        where = ["--redis-url", redis_url, "--queue", queue]
        limit = ["--max-files", "10", "--max-stored-bytes", str(len(line) + 10)]
        assert genq("tenants", "set", "bob", *where, *limit).returncode == 0
        time.sleep(5.5)  # the gateway reads a tenant's own limits every 5 s
        over = upload(bob)
        assert over.status_code == 429 and "--max-stored-bytes" in over.text, over.text
    finally:
        g.stop()
