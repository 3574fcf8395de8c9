"""``genq serve`` with the official openai SDK, unmodified, and with curl: against a real
redis-server, real worker processes and a real gateway process."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import openai
import pytest
import redis
from genq.producer import Client
from genq.worker.devtools.gateway_process import GatewayProcess
from openai.types import Batch

from tests.conftest import WorkerProcess, wait_until

KEY = "test-key"


@pytest.fixture()
def gateway(redis_url: str, queue: str, tmp_path: Path) -> Iterator[GatewayProcess]:
    g = GatewayProcess(redis_url, queue, tmp_path / "gateway.log", ["--api-key", KEY])
    yield g
    g.stop()


def sdk(gateway: GatewayProcess, key: str = KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.url, api_key=key, max_retries=0, timeout=60)


@pytest.fixture()
def echo_worker(queue: str, start_worker: Callable[..., WorkerProcess]) -> WorkerProcess:
    return start_worker(queue, "--engine", "echo", "--max-queue-depth", "1000")


def test_models_completions_and_chat_through_the_sdk(
    gateway: GatewayProcess, echo_worker: WorkerProcess
) -> None:
    client = sdk(gateway)
    wait_until(lambda: [m.id for m in client.models.list()] == ["echo"], timeout_s=10)
    done = client.completions.create(model="echo", prompt="Hello there", max_tokens=5)
    assert done.choices[0].text == "Hello" and done.choices[0].finish_reason == "length"
    assert done.model == "echo" and done.usage is not None and done.usage.completion_tokens == 5
    # Without max_tokens a completion gets OpenAI's default of 16.
    long = client.completions.create(model="echo", prompt="x" * 40)
    assert long.choices[0].text == "x" * 16
    chat = client.chat.completions.create(
        model="echo",
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=64,
        extra_body={"priority": "high", "deadline_in_s": 60},
    )
    assert chat.choices[0].message.role == "assistant"
    assert chat.choices[0].message.content == "user: hi\nassistant:"


def test_streaming_chat_and_completions_add_up_to_the_text(
    gateway: GatewayProcess, echo_worker: WorkerProcess
) -> None:
    client = sdk(gateway)
    wait_until(lambda: bool(client.models.list().data), timeout_s=10)
    chunks = list(
        client.chat.completions.create(
            model="echo",
            messages=[{"role": "user", "content": "stream me"}],
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "user: stream me\nassistant:"
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
    pieces = list(
        client.completions.create(model="echo", prompt="abcdef", max_tokens=3, stream=True)
    )
    assert "".join(p.choices[0].text for p in pieces) == "abc"


def test_errors_are_openai_errors_with_the_codes_the_sdk_maps(
    gateway: GatewayProcess, echo_worker: WorkerProcess
) -> None:
    client = sdk(gateway)
    wait_until(lambda: bool(client.models.list().data), timeout_s=10)
    with pytest.raises(openai.AuthenticationError):
        sdk(gateway, key="wrong").models.list()
    with pytest.raises(openai.BadRequestError, match="max_new_tokens"):
        client.completions.create(model="echo", prompt="x", max_tokens=100_000)
    with pytest.raises(openai.BadRequestError, match="unsupported body fields"):
        client.completions.create(model="echo", prompt="x", suffix="!")
    with pytest.raises(openai.NotFoundError, match="not served"):
        client.completions.create(model="gpt-4o", prompt="x")
    with pytest.raises(openai.NotFoundError):
        client.batches.retrieve("batch_nothing")


def test_a_full_queue_is_429(
    gateway: GatewayProcess, queue: str, redis_url: str, start_worker: Callable[..., WorkerProcess]
) -> None:
    quick_exit = ["--shutdown-grace-s", "0"]  # its 20 s requests need not finish
    start_worker(
        queue, "--engine", "echo", "--echo-step-ms", "500", "--max-queue-depth", "2", *quick_exit
    )
    client = sdk(gateway)
    wait_until(lambda: bool(client.models.list().data), timeout_s=10)
    with Client.from_url(redis_url, queue) as producer:
        producer.submit_many(["z" * 50] * 2, max_new_tokens=40)  # 20 s each: the queue is full
    with pytest.raises(openai.RateLimitError, match="queue is full"):
        client.completions.create(model="echo", prompt="x")


def test_a_worker_serves_its_model_under_the_name_it_is_given(
    gateway: GatewayProcess, queue: str, start_worker: Callable[..., WorkerProcess]
) -> None:
    """``--served-model-name``: clients see and send that name (``/v1/models``, the result's
    ``model``), not the worker's ``--model``; the old name is then a 404."""
    start_worker(queue, "--engine", "echo", "--served-model-name", "acme/chat-8b")
    client = sdk(gateway)
    wait_until(lambda: bool(client.models.list().data), timeout_s=10)
    assert [m.id for m in client.models.list().data] == ["acme/chat-8b"]
    done = client.chat.completions.create(
        model="acme/chat-8b", messages=[{"role": "user", "content": "hi"}], max_tokens=4
    )
    assert done.model == "acme/chat-8b" and done.choices[0].message.content
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(
            model="echo", messages=[{"role": "user", "content": "hi"}], max_tokens=4
        )


def test_no_live_worker_is_503(gateway: GatewayProcess) -> None:
    with pytest.raises(openai.InternalServerError) as err:
        sdk(gateway).completions.create(model="echo", prompt="x")
    assert err.value.status_code == 503 and "no live worker" in str(err.value)


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl not installed")
def test_curl(gateway: GatewayProcess, echo_worker: WorkerProcess) -> None:
    def curl(path: str, *args: str) -> tuple[int, dict]:  # type: ignore[type-arg]
        out = subprocess.run(
            [
                "curl",
                "-s",
                "-w",
                "\n%{http_code}",
                "-H",
                f"Authorization: Bearer {KEY}",
                "-H",
                "Content-Type: application/json",
                *args,
                gateway.url + path,
            ],
            capture_output=True,
            text=True,
            timeout=30,
        )
        body, code = out.stdout.rsplit("\n", 1)
        return int(code), json.loads(body)

    wait_until(lambda: curl("/models")[1]["data"] != [], timeout_s=10)
    code, body = curl(
        "/completions", "-d", '{"model": "echo", "prompt": "curl me", "max_tokens": 4}'
    )
    assert code == 200 and body["choices"][0]["text"] == "curl"
    code, body = curl("/completions", "-d", "{not json")
    assert code == 400 and body["error"]["type"] == "invalid_request_error"
    code, body = curl("/chat/completions", "-d", '{"model": "echo", "messages": "hi"}')
    assert code == 400 and "'messages' as a list" in body["error"]["message"]


def test_a_client_that_disconnects_cancels_its_request(
    gateway: GatewayProcess,
    queue: str,
    redis_url: str,
    start_worker: Callable[..., WorkerProcess],
) -> None:
    start_worker(queue, "--engine", "echo", "--echo-step-ms", "100")
    client = sdk(gateway)
    wait_until(lambda: bool(client.models.list().data), timeout_s=10)
    impatient = openai.OpenAI(base_url=gateway.url, api_key=KEY, max_retries=0, timeout=1.0)
    tag = f"{queue}-gone"
    with pytest.raises(openai.APITimeoutError):
        impatient.completions.create(
            model="echo", prompt="y" * 200, max_tokens=100, extra_body={"metadata": {"t": tag}}
        )
    r = redis.Redis.from_url(redis_url)

    def status() -> str | None:
        for key in r.scan_iter(match="genq:res:*", count=1000):
            doc = json.loads(r.get(key) or "{}")
            if doc.get("metadata", {}).get("t") == tag:
                return str(doc["status"])
        return None

    wait_until(lambda: status() == "cancelled", timeout_s=15)
    # The same for a stream closed before its first chunk (which comes with the first text:
    # the echo engine's comes after 10 s), once the response's headers are in.
    tag = f"{queue}-gone-streaming"
    body = {
        "model": "echo",
        "messages": [{"role": "user", "content": "z" * 200}],
        "max_tokens": 100,
        "stream": True,
        "metadata": {"t": tag},
    }
    headers = {"Authorization": f"Bearer {KEY}"}
    url = f"{gateway.url}/chat/completions"
    with httpx.stream("POST", url, json=body, headers=headers, timeout=30) as response:
        assert response.status_code == 200
    wait_until(lambda: status() == "cancelled", timeout_s=15)


def test_files_and_batches_flow_through_the_sdk(
    gateway: GatewayProcess, echo_worker: WorkerProcess
) -> None:
    client = sdk(gateway)
    lines = [
        {
            "custom_id": "a",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": "echo", "messages": [{"role": "user", "content": "one"}]},
        },
        {
            "custom_id": "b",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {
                "model": "echo",
                "messages": [{"role": "user", "content": "two"}],
                "max_tokens": 5,
            },
        },
        {"custom_id": "c", "method": "POST", "url": "/v1/completions", "body": {"prompt": "x"}},
    ]
    content = "\n".join(json.dumps(x) for x in lines).encode() + b"\n{broken\n"
    uploaded = client.files.create(file=("input.jsonl", content), purpose="batch")
    assert uploaded.bytes == len(content) and uploaded.purpose == "batch"
    assert client.files.retrieve(uploaded.id).filename == "input.jsonl"
    assert client.files.content(uploaded.id).content == content
    batch = client.batches.create(
        input_file_id=uploaded.id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        metadata={"job": "nightly"},
    )
    assert batch.endpoint == "/v1/chat/completions" and batch.metadata == {"job": "nightly"}
    deadline = time.monotonic() + 30
    while batch.status not in ("completed", "failed") and time.monotonic() < deadline:
        time.sleep(0.2)
        batch = client.batches.retrieve(batch.id)
    assert batch.status == "completed"
    Batch.model_validate(batch.model_dump())
    assert batch.request_counts is not None
    assert (batch.request_counts.total, batch.request_counts.completed) == (4, 2)
    assert batch.output_file_id and batch.error_file_id
    out = [json.loads(x) for x in client.files.content(batch.output_file_id).text.splitlines()]
    assert [o["custom_id"] for o in out] == ["a", "b"]
    assert out[1]["response"]["body"]["choices"][0]["message"]["content"] == "user:"
    assert out[0]["response"]["body"]["model"] == "echo"
    errors = [json.loads(x) for x in client.files.content(batch.error_file_id).text.splitlines()]
    assert [e["custom_id"] for e in errors] == ["c", None]  # another endpoint; not JSON
    assert "this batch's endpoint" in errors[0]["error"]["message"]
    assert batch.id in [b.id for b in client.batches.list(limit=10)]
    # A batch nobody serves yet can be cancelled.
    client.files.delete(uploaded.id)
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(uploaded.id)


def test_a_batch_is_cancelled_over_http(gateway: GatewayProcess) -> None:
    client = sdk(gateway)
    line = {"custom_id": "a", "url": "/v1/completions", "body": {"prompt": "x", "max_tokens": 2}}
    uploaded = client.files.create(file=("in.jsonl", json.dumps(line).encode()), purpose="batch")
    batch = client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/completions", completion_window="24h"
    )
    assert batch.status == "in_progress"  # no worker serves this queue
    cancelled = client.batches.cancel(batch.id)
    assert cancelled.status == "cancelled" and cancelled.cancelled_at


def test_the_openai_package_for_node_works_unmodified(
    gateway: GatewayProcess, echo_worker: WorkerProcess
) -> None:
    script = Path(__file__).resolve().parent / "node" / "openai.mjs"
    if not (script.parent / "node_modules" / "openai").exists():
        pytest.skip("the openai package for Node.js is not installed: npm ci --prefix tests/node")
    wait_until(lambda: bool(sdk(gateway).models.list().data), timeout_s=10)
    out = subprocess.run(
        ["node", str(script), gateway.url, KEY], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stdout + out.stderr
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["models"] == ["echo"]
    assert report["chat"] == "user: hello from node\nassistant:"
    assert report["finish_reason"] == "stop"
    assert report["streamed"] == "user: stream to node\nassistant:"
    assert report["error"] == "400 BadRequestError"
