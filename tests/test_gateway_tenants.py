"""Isolation at ``genq serve``: each API key stands for a tenant, its requests belong to that
tenant, and it sees only that tenant's files and batches; another tenant's id answers exactly
as an unknown one does. Tested with the unmodified openai SDK for Python and for Node.js."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import openai
import pytest
from genq.producer import Client
from genq.worker.devtools.gateway_process import GatewayProcess

from tests.conftest import ROOT, WorkerProcess, wait_until

KEYS = ["--api-key", "key-a=team-a", "--api-key", "key-b=team-b", "--api-key", "plain"]
ADMIN = "boss-key"
NODE_SCRIPT = ROOT / "tests" / "node" / "tenants.mjs"


@pytest.fixture()
def gateway(redis_url: str, queue: str, tmp_path: Path) -> Iterator[GatewayProcess]:
    g = GatewayProcess(redis_url, queue, tmp_path / "gateway.log", [*KEYS, "--admin-key", ADMIN])
    yield g
    g.stop()


def sdk(gateway: GatewayProcess, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.url, api_key=key, max_retries=0, timeout=60)


def upload(client: openai.OpenAI, prompt: str) -> str:
    line = {
        "custom_id": "c1",
        "url": "/v1/completions",
        "body": {"prompt": prompt, "max_tokens": 2},
    }
    return client.files.create(file=("in.jsonl", json.dumps(line).encode()), purpose="batch").id


def not_found(call: Callable[[], object]) -> dict[str, object]:
    """The 404 body ``call`` gets (it must get one)."""
    with pytest.raises(openai.NotFoundError) as caught:
        call()
    body = caught.value.body
    assert isinstance(body, dict)
    return body


def test_a_key_submits_as_its_tenant_and_a_body_cannot_name_another(
    gateway: GatewayProcess,
    redis_url: str,
    queue: str,
    start_worker: Callable[..., WorkerProcess],
) -> None:
    start_worker(queue, "--engine", "echo")
    a, plain = sdk(gateway, "key-a"), sdk(gateway, "plain")
    wait_until(lambda: bool(a.models.list().data), timeout_s=15)
    done = a.chat.completions.create(model="echo", messages=[{"role": "user", "content": "hi"}])
    bare = plain.completions.create(model="echo", prompt="hello", max_tokens=2)
    client = Client.from_url(redis_url, queue)
    assert client.status(done.id).tenant == "team-a"
    assert client.status(bare.id).tenant == "default"  # a bare key: tenant default
    with pytest.raises(openai.BadRequestError, match=r"unsupported body fields \['tenant'\]"):
        a.completions.create(model="echo", prompt="x", extra_body={"tenant": "team-b"})
    with pytest.raises(openai.AuthenticationError):
        sdk(gateway, "team-a").models.list()  # a tenant's name is not a key


def test_a_key_sees_only_its_tenants_files_and_batches(gateway: GatewayProcess) -> None:
    a, b, boss = sdk(gateway, "key-a"), sdk(gateway, "key-b"), sdk(gateway, ADMIN)
    file_a = upload(a, "from a")
    batch_a = a.batches.create(
        input_file_id=file_a, endpoint="/v1/completions", completion_window="24h"
    ).id
    batch_b = b.batches.create(
        input_file_id=upload(b, "from b"), endpoint="/v1/completions", completion_window="24h"
    ).id

    # Another tenant's id answers exactly as an unknown id does.
    def same_as_unknown(call: Callable[[str], object], real: str, unknown: str) -> None:
        theirs, nobodys = not_found(lambda: call(real)), not_found(lambda: call(unknown))
        assert json.dumps(theirs).replace(real, "ID") == json.dumps(nobodys).replace(unknown, "ID")

    same_as_unknown(b.files.retrieve, file_a, "file-" + "0" * 24)
    same_as_unknown(b.files.content, file_a, "file-" + "0" * 24)
    same_as_unknown(b.files.delete, file_a, "file-" + "0" * 24)
    same_as_unknown(b.batches.retrieve, batch_a, "batch_" + "0" * 20)
    same_as_unknown(b.batches.cancel, batch_a, "batch_" + "0" * 20)
    same_as_unknown(b.files.content, batch_a + "-output", "batch_" + "0" * 20 + "-output")
    not_found(
        lambda: b.batches.create(
            input_file_id=file_a, endpoint="/v1/completions", completion_window="24h"
        )
    )
    not_found(lambda: b.batches.list(after=batch_a))
    # Lists show only one's own; the admin key sees every tenant's.
    assert [x.id for x in b.batches.list(limit=100)] == [batch_b]
    assert [x.id for x in a.batches.list(limit=100)] == [batch_a]
    assert {x.id for x in boss.batches.list(limit=100)} == {batch_a, batch_b}
    assert boss.files.retrieve(file_a).id == file_a
    # Nothing another key tried changed A's things.
    assert a.files.retrieve(file_a).id == file_a
    assert a.batches.retrieve(batch_a).status == "in_progress"
    assert a.batches.cancel(batch_a).status == "cancelled"
    a.files.delete(file_a)
    not_found(lambda: a.files.retrieve(file_a))


def test_the_openai_package_for_node_is_isolated_too(gateway: GatewayProcess) -> None:
    if not (NODE_SCRIPT.parent / "node_modules" / "openai").exists() or not shutil.which("node"):
        pytest.skip("the openai package for Node.js is not installed: npm ci --prefix tests/node")
    a = sdk(gateway, "key-a")
    file_a = upload(a, "from a")
    batch_a = a.batches.create(
        input_file_id=file_a, endpoint="/v1/completions", completion_window="24h"
    ).id
    out = subprocess.run(
        ["node", str(NODE_SCRIPT), gateway.url, "key-b", batch_a, file_a],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report == {"batch": 404, "file": 404, "cancel": 404, "listed": [], "own": "in_progress"}


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--api-key", "k=bad name"], "tenant 'bad name' is not allowed"),
        (["--api-key", "=team"], "the key is empty"),
    ],
)
def test_a_bad_api_key_spec_is_one_line(
    redis_url: str, queue: str, args: list[str], said: str
) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "genq.worker", "serve", "--redis-url", redis_url, *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert out.returncode == 2 and said in out.stderr and "Traceback" not in out.stderr
