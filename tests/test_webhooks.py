"""Webhooks: a response that becomes final is one event in the queue's
outbox, added by the script that decides the state, and gateways deliver it signed per
Standard Webhooks, at least once, retried with the same ``webhook-id``, to the gateway's
endpoint and the tenant's; deliveries that give up are dead letters (``genq webhooks``).
Checked with the openai SDK's ``webhooks.unwrap`` and the ``standardwebhooks`` package, and
with a gateway killed with -9 while the receiver fails 30% of the deliveries."""

from __future__ import annotations

import base64
import json
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
import redis
import standardwebhooks
from genq.common import scripts, states, webhooks
from genq.common.errors import ConfigError
from genq.common.keys import Keys
from genq.worker.devtools.gateway_process import GatewayProcess
from genq.worker.devtools.webhook_receiver import Delivery, Receiver

from tests.conftest import WorkerProcess, wait_until

SECRET = "whsec_" + base64.b64encode(b"genq webhook test secret!").decode()
TENANT_SECRET = "whsec_" + base64.b64encode(b"team-a's own webhook secret").decode()
FAST = ["--webhook-timeout-s", "1", "--webhook-first-retry-s", "0.3"]


def verified(d: Delivery, secret: str = SECRET) -> dict[str, object]:
    """The event of a delivery, its signature checked by both verifiers."""
    event = openai.OpenAI(api_key="x").webhooks.unwrap(d.body, d.headers, secret=secret)
    doc = standardwebhooks.Webhook(secret).verify(d.body, d.headers)
    assert doc["id"] == event.id == d.headers["webhook-id"]
    return dict(doc)


@pytest.fixture()
def receiver() -> Iterator[Receiver]:
    rec = Receiver()
    yield rec
    rec.close()


def gateway(redis_url: str, queue: str, log: Path, url: str, *extra: str) -> GatewayProcess:
    args = ["--webhook-url", url, "--webhook-secret", SECRET, *FAST, *extra]
    return GatewayProcess(redis_url, queue, log, args)


def sdk(g: GatewayProcess, key: str = "x") -> openai.OpenAI:
    return openai.OpenAI(base_url=g.url, api_key=key, max_retries=0, timeout=60)


# -- without Redis -------------------------------------------------------------------------------


def test_a_signature_verifies_with_the_sdk_and_standard_webhooks() -> None:
    body = webhooks.payload("evt_1-0", "response.completed", "resp_x", 1_700_000_000)
    import time

    headers = webhooks.signed_headers(SECRET, "evt_1-0", int(time.time()), body)
    event = verified(Delivery(headers, body, True))
    assert event == {
        "object": "event",
        "id": "evt_1-0",
        "type": "response.completed",
        "created_at": 1_700_000_000,
        "data": {"id": "resp_x"},
    }
    tampered = body.replace("resp_x", "resp_y")
    with pytest.raises(standardwebhooks.WebhookVerificationError):
        standardwebhooks.Webhook(SECRET).verify(tampered, headers)
    with pytest.raises(openai.InvalidWebhookSignatureError):
        openai.OpenAI(api_key="x").webhooks.unwrap(tampered, headers, secret=SECRET)


@pytest.mark.parametrize(
    "secret", ["plain", "whsec_***", "whsec_" + base64.b64encode(b"short").decode()]
)
def test_a_bad_secret_is_refused_without_being_repeated(secret: str) -> None:
    with pytest.raises(ConfigError) as caught:
        webhooks.endpoint("*", "https://example.com/hook", secret)
    assert secret not in str(caught.value)
    assert "secret" not in repr(webhooks.Endpoint("*", "https://x", SECRET)).lower()


def test_retries_back_off_doubling_to_a_limit() -> None:
    waits = [webhooks.retry_after_s(n, first_s=5, most_s=600) for n in range(1, 10)]
    assert waits == [5, 10, 20, 40, 80, 160, 320, 600, 600]


def test_a_torn_request_is_no_delivery() -> None:
    """A sender killed while writing its body (headers sent, body short of its content-length)
    leaves the test receiver with no delivery, not an accepted empty one."""
    import socket
    from urllib.parse import urlsplit

    rec = Receiver()
    try:
        where = urlsplit(rec.url)
        with socket.create_connection((where.hostname, where.port)) as conn:
            conn.sendall(b'POST /hooks HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{"id"')
        whole = b'{"id": 1}'
        with socket.create_connection((where.hostname, where.port)) as conn:
            head = f"POST /hooks HTTP/1.1\r\nHost: x\r\nContent-Length: {len(whole)}\r\n\r\n"
            conn.sendall(head.encode() + whole)
            assert conn.recv(100).startswith(b"HTTP/1.0 200")
        wait_until(lambda: len(rec.deliveries) == 1, timeout_s=10)
        assert [d.body for d in rec.deliveries] == ['{"id": 1}']
    finally:
        rec.close()


# -- through the queue -------------------------------------------------------------------------


def test_one_write_adds_the_events_of_its_responses_and_no_others(
    queue: str, r: redis.Redis
) -> None:
    # APPLY asks once whether any request it ends has a record (a response's, a batch's):
    # a write of plain requests looks for none; one that ends a response among them adds
    # that response's event, once.
    keys = Keys(queue)

    def done(request_id: str) -> tuple[str, None, str, str]:
        state = states.succeeded(
            request_id=request_id,
            priority="normal",
            tenant="t",
            metadata={},
            text="x",
            finish_reason="stop",
            prompt_tokens=1,
            completion_tokens=1,
            queued_ms=1,
            started_ms=2,
            finished_ms=3,
            generation_ms=1,
            worker="w",
            model="m",
            batch_size=3,
        )
        return (request_id, None, "", state)

    plain = [done(f"plain-{i}") for i in range(3)]
    assert scripts.apply(r, keys, 60, "final", plain) == [scripts.Applied.WRITTEN] * 3
    assert r.xlen(keys.webhook_events) == 0
    assert all(r.xlen(Keys.request_keys(i)[1]) == 1 for i, *_ in plain)  # each final event
    r.set(
        Keys.response("mixed-1"),
        json.dumps({"id": "resp_mixed-1", "tenant": "t"}, separators=(",", ":")),
    )
    mixed = [done("mixed-0"), done("mixed-1"), done("mixed-2")]
    assert scripts.apply(r, keys, 60, "final", mixed) == [scripts.Applied.WRITTEN] * 3
    events: Any = r.xrange(keys.webhook_events)
    assert [e[1][b"id"] for e in events] == [b"resp_mixed-1"]
    assert events[0][1][b"type"] == b"response.completed"


def test_each_final_response_is_one_signed_event_of_its_kind(
    redis_url: str,
    queue: str,
    tmp_path: Path,
    receiver: Receiver,
    start_worker: Callable[..., WorkerProcess],
) -> None:
    g = gateway(redis_url, queue, tmp_path / "g.log", receiver.url)
    try:
        start_worker(queue, "--engine", "echo", "--echo-step-ms", "20", "--max-batch-size", "1")
        client = sdk(g)
        wait_until(lambda: len(client.models.list().data) == 1, timeout_s=60)
        done = client.responses.create(model="echo", input="hi", background=True)
        slow = client.responses.create(model="echo", input="x" * 40, background=True)
        cut = client.responses.create(
            model="echo", input="long", max_output_tokens=2, background=True
        )
        bad = client.responses.create(
            model="echo", input="x", text={"format": {"type": "json_object"}}, background=True
        )
        client.responses.cancel(slow.id)
        wait_until(lambda: len(receiver.accepted()) >= 4, timeout_s=30)
        events = {str(e["data"]["id"]): e["type"] for e in map(verified, receiver.accepted())}  # type: ignore[index]
        assert events == {
            done.id: "response.completed",
            slow.id: "response.cancelled",
            cut.id: "response.incomplete",
            bad.id: "response.failed",
        }
        chat = client.chat.completions.create(
            model="echo", messages=[{"role": "user", "content": "x"}]
        )
        assert chat.choices  # a chat is no response: no event
        wait_until(lambda: redis.Redis.from_url(redis_url).xlen(Keys(queue).webhook_events) == 0)
        assert len(receiver.deliveries) == 4  # once each: no retry of a delivered event
    finally:
        g.stop()
    assert SECRET not in (tmp_path / "g.log").read_text()


def test_a_tenants_endpoint_gets_its_events_and_no_others(
    redis_url: str,
    queue: str,
    tmp_path: Path,
    receiver: Receiver,
    start_worker: Callable[..., WorkerProcess],
) -> None:
    own = Receiver()
    keys = ["--api-key", "key-a=team-a", "--api-key", "key-b=team-b"]
    g = gateway(redis_url, queue, tmp_path / "g.log", receiver.url, *keys)
    try:
        base = [sys.executable, "-m", "genq.worker", "tenants", "set", "team-a"]
        flags = ["--redis-url", redis_url, "--queue", queue, "--webhook-url", own.url]
        shown = subprocess.run(
            [*base, *flags, "--webhook-secret", TENANT_SECRET],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        assert TENANT_SECRET not in shown and json.loads(shown)["webhook_secret"] == "(set)"
        start_worker(queue, "--engine", "echo")
        a, b = sdk(g, "key-a"), sdk(g, "key-b")
        wait_until(lambda: len(a.models.list().data) == 1, timeout_s=60)
        ra = a.responses.create(model="echo", input="from a")
        rb = b.responses.create(model="echo", input="from b")
        wait_until(lambda: len(receiver.accepted()) == 2 and len(own.accepted()) == 1)
        assert [verified(d, TENANT_SECRET)["data"] for d in own.accepted()] == [{"id": ra.id}]
        assert {verified(d)["data"]["id"] for d in receiver.accepted()} == {ra.id, rb.id}  # type: ignore[index]
    finally:
        g.stop()
        own.close()


def test_every_event_arrives_though_deliveries_fail_and_a_gateway_is_killed(
    redis_url: str,
    queue: str,
    tmp_path: Path,
    start_worker: Callable[..., WorkerProcess],
) -> None:
    """200 background responses; the receiver fails the first 30% of the deliveries; one of two
    gateways is killed with -9 midway. Every event arrives, validly signed; a duplicate is only
    ever a retry (the same webhook-id, the same event)."""
    receiver = Receiver(fail_first=60)
    first = gateway(redis_url, queue, tmp_path / "g1.log", receiver.url)
    second = gateway(redis_url, queue, tmp_path / "g2.log", receiver.url)
    try:
        start_worker(queue, "--engine", "echo", "--echo-step-ms", "5")
        one, two = sdk(first), sdk(second)
        wait_until(lambda: len(one.models.list().data) == 1, timeout_s=60)
        ids = [
            one.responses.create(model="echo", input=f"n{i}", background=True).id
            for i in range(100)
        ]
        first.proc.send_signal(signal.SIGKILL)
        first.proc.wait()
        wait_until(lambda: len(two.models.list().data) == 1, timeout_s=60)  # sees the worker
        ids += [
            two.responses.create(model="echo", input=f"m{i}", background=True).id
            for i in range(100)
        ]
        wait_until(
            lambda: {verified(d)["data"]["id"] for d in receiver.accepted()} >= set(ids),  # type: ignore[index]
            timeout_s=120,
        )
        by_webhook: dict[str, set[str]] = {}
        for d in receiver.deliveries:
            event = verified(d)
            by_webhook.setdefault(str(event["id"]), set()).add(json.dumps(event, sort_keys=True))
        assert all(len(bodies) == 1 for bodies in by_webhook.values())  # retries: same event
        assert len(by_webhook) == 200  # one webhook-id per response
        assert len(receiver.deliveries) > 200  # the failures were retried
    finally:
        second.stop()
        first.stop()
        receiver.close()


def test_deliveries_that_give_up_are_dead_letters_sent_again_with_the_same_id(
    redis_url: str,
    queue: str,
    tmp_path: Path,
    receiver: Receiver,
    start_worker: Callable[..., WorkerProcess],
) -> None:
    receiver.failing = True
    g = gateway(redis_url, queue, tmp_path / "g.log", receiver.url, "--webhook-retry-for-s", "3")
    cli = [sys.executable, "-m", "genq.worker", "webhooks"]
    where = ["--redis-url", redis_url, "--queue", queue]
    try:
        start_worker(queue, "--engine", "echo")
        client = sdk(g)
        wait_until(lambda: len(client.models.list().data) == 1, timeout_s=60)
        r = client.responses.create(model="echo", input="x")

        def dead() -> list[dict[str, object]]:
            out = subprocess.run([*cli, "list", "--json", *where], capture_output=True, text=True)
            return list(json.loads(out.stdout))

        wait_until(lambda: len(dead()) == 1, timeout_s=30)
        [letter] = dead()
        assert letter["object_id"] == r.id and letter["error"] == "HTTP 500"
        tried = {d.headers["webhook-id"] for d in receiver.deliveries}
        assert len(receiver.deliveries) >= 2 and tried == {letter["webhook_id"]}
        receiver.failing = False
        subprocess.run([*cli, "retry", "--all", *where], check=True, capture_output=True)
        wait_until(lambda: len(receiver.accepted()) == 1, timeout_s=30)
        assert receiver.accepted()[0].headers["webhook-id"] == letter["webhook_id"]
        assert dead() == []
    finally:
        g.stop()


def test_a_batch_is_one_event_when_its_last_request_ends(
    redis_url: str,
    queue: str,
    tmp_path: Path,
    receiver: Receiver,
    start_worker: Callable[..., WorkerProcess],
) -> None:
    """batch.completed once the last line ends; batch.cancelled for a cancelled one (its last
    request cancelled); batch.failed for a file with no valid line."""
    g = gateway(redis_url, queue, tmp_path / "g.log", receiver.url)
    try:
        client = sdk(g)

        def batch_of(prompts: list[str]) -> str:
            lines = [
                {"custom_id": f"c{i}", "url": "/v1/completions", "body": {"prompt": p}}
                for i, p in enumerate(prompts)
            ]
            data = "\n".join(json.dumps(line) for line in lines).encode()
            file = client.files.create(file=("in.jsonl", data), purpose="batch")
            created = client.batches.create(
                input_file_id=file.id, endpoint="/v1/completions", completion_window="24h"
            )
            return created.id

        start_worker(queue, "--engine", "echo", "--echo-step-ms", "20", "--max-batch-size", "2")
        wait_until(lambda: len(client.models.list().data) == 1, timeout_s=60)
        done = batch_of([f"line {i}" for i in range(10)])
        cancelled = batch_of([f"later {i}" for i in range(10)])
        client.batches.cancel(cancelled)
        bad = {"custom_id": "x", "url": "/v1/nothing", "body": {}}
        file = client.files.create(file=("bad.jsonl", json.dumps(bad).encode()), purpose="batch")
        failed = client.batches.create(
            input_file_id=file.id, endpoint="/v1/completions", completion_window="24h"
        ).id
        wait_until(lambda: len(receiver.accepted()) >= 3, timeout_s=60)
        events = {str(e["data"]["id"]): e["type"] for e in map(verified, receiver.accepted())}  # type: ignore[index]
        assert events == {
            done: "batch.completed",
            cancelled: "batch.cancelled",
            failed: "batch.failed",
        }
        assert client.batches.retrieve(done).status == "completed"
        assert len(receiver.deliveries) == 3  # one each
    finally:
        g.stop()


def test_a_dead_endpoint_delays_neither_other_endpoints_nor_the_queue(
    redis_url: str,
    queue: str,
    tmp_path: Path,
    receiver: Receiver,
    start_worker: Callable[..., WorkerProcess],
) -> None:
    """team-a's own endpoint answers after 5 s (past the 1 s timeout): every event still
    reaches the gateway's endpoint at once, every response completes, and team-a's endpoint
    has its deliveries retried, not dropped."""
    stuck = Receiver(delay_s=5.0)
    keys = ["--api-key", "key-a=team-a", "--api-key", "key-b=team-b"]
    g = gateway(redis_url, queue, tmp_path / "g.log", receiver.url, *keys)
    try:
        base = [sys.executable, "-m", "genq.worker", "tenants", "set", "team-a"]
        flags = ["--redis-url", redis_url, "--queue", queue, "--webhook-url", stuck.url]
        subprocess.run([*base, *flags, "--webhook-secret", TENANT_SECRET], check=True)
        start_worker(queue, "--engine", "echo")
        a, b = sdk(g, "key-a"), sdk(g, "key-b")
        wait_until(lambda: len(a.models.list().data) == 1, timeout_s=60)
        ids = [a.responses.create(model="echo", input=f"a{i}").id for i in range(30)]
        ids.append(b.responses.create(model="echo", input="b").id)  # answered when final
        wait_until(lambda: len(receiver.accepted()) == 31, timeout_s=15)
        assert {verified(d)["data"]["id"] for d in receiver.accepted()} == set(ids)  # type: ignore[index]
        wait_until(lambda: len(stuck.deliveries) > 30, timeout_s=30)  # tried, and tried again
    finally:
        g.stop()
        stuck.close()
