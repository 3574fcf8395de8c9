"""Tenants: every request belongs to one, through every door (client, async client, CLI, batch
files, the wire body, FCALL genq_submit), and every Result says which."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path

import pytest
import redis
from genq.common.errors import ConfigError, InvalidRequest
from genq.common.functions import library_code
from genq.common.keys import Keys
from genq.producer import AsyncClient, Client
from genq.producer.gateway.batches import read_batch, submit_batch

from tests.conftest import WorkerProcess, genq, submit_keys

BAD_NAMES = ["", "a b", "x" * 65, "tenant/1", "é", "a:b"]


@pytest.mark.parametrize("name", BAD_NAMES)
def test_a_bad_tenant_name_is_refused_before_anything_reaches_redis(
    redis_url: str, queue: str, r: redis.Redis, name: str
) -> None:
    client = Client.from_url(redis_url, queue)
    with pytest.raises(InvalidRequest, match=r"tenant .* is not allowed: use 1-64 letters"):
        client.submit("hi", tenant=name)
    with pytest.raises(InvalidRequest, match="tenant"):
        client.submit_many(["a", "b"], tenant=name)
    assert not r.keys(f"genq:{{{queue}}}*")


def test_results_carry_the_tenant_of_every_door(
    redis_url: str, queue: str, r: redis.Redis, start_worker: Callable[..., WorkerProcess]
) -> None:
    client = Client.from_url(redis_url, queue)
    ids = {
        "team-a": client.submit("one", tenant="team-a"),
        "b.2_x": client.submit_many(["two", {"prompt": "three"}], tenant="b.2_x")[1],
        "default": client.submit("four"),
    }

    async def submit_async() -> str:
        aio = AsyncClient.from_url(redis_url, queue)
        try:
            return await aio.submit("five", tenant="async-t")
        finally:
            await aio.close()

    ids["async-t"] = asyncio.run(submit_async())
    # Another language: FCALL genq_submit with a tenant in the body; and a plain XADD of an
    # older client (no tenant field): tenant default.
    r.function_load(library_code(), replace=True)
    keys = Keys(queue)
    body = json.dumps({"prompt": "six", "tenant": "node-app"})
    r.fcall("genq_submit", 5, *submit_keys(keys, ["f1" + queue]), 60, "f1" + queue, "low", body, "")
    ids["node-app"] = "f1" + queue
    r.xadd(keys.stream("normal"), {"id": "x1" + queue, "body": '{"prompt": "seven"}'})
    queued = json.loads(r.get(keys.result(ids["node-app"])) or b"{}")
    assert queued["status"] == "queued" and queued["tenant"] == "node-app"
    assert client.status(ids["team-a"]).tenant == "team-a"  # the queued state says it too

    start_worker(queue, "--engine", "echo")
    results = client.results([*ids.values(), "x1" + queue], timeout=60)
    assert [res.status for res in results] == ["succeeded"] * len(results)
    assert [res.tenant for res in results] == [*ids, "default"]


def test_an_entry_naming_a_bad_tenant_fails_saying_why(
    redis_url: str, queue: str, r: redis.Redis, start_worker: Callable[..., WorkerProcess]
) -> None:
    keys = Keys(queue)
    r.xadd(keys.stream("normal"), {"id": "bad" + queue, "body": '{"prompt": "x", "tenant": "a b"}'})
    r.function_load(library_code(), replace=True)
    with pytest.raises(redis.ResponseError, match="GENQ_INVALID request 1: the tenant must be"):
        body = '{"prompt": "x", "tenant": "a b"}'
        r.fcall("genq_submit", 5, *submit_keys(keys, ["g1"]), 60, "g1", "high", body, "")
    start_worker(queue, "--engine", "echo")
    res = Client.from_url(redis_url, queue).result("bad" + queue, timeout=60)
    assert res.status == "failed" and res.error is not None
    assert "tenant" in res.error.message and res.tenant == "default"


def test_genq_submit_and_batch_submit_take_a_tenant(
    redis_url: str,
    queue: str,
    tmp_path: Path,
    start_worker: Callable[..., WorkerProcess],
) -> None:
    start_worker(queue, "--engine", "echo")
    out = genq(
        "submit", "--redis-url", redis_url, "--queue", queue, "--tenant", "cli-t", "hi", "--json"
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["tenant"] == "cli-t"

    bad = genq("submit", "--redis-url", redis_url, "--queue", queue, "--tenant", "a b", "hi")
    assert bad.returncode == 2 and "tenant 'a b' is not allowed" in bad.stderr

    lines = tmp_path / "batch.jsonl"
    body = {"model": "echo", "prompt": "hello", "max_tokens": 4}
    line = {"custom_id": "c1", "method": "POST", "url": "/v1/completions", "body": body}
    lines.write_text(json.dumps(line) + "\n")
    args = ["batch", "submit", "--redis-url", redis_url, "--queue", queue]
    out = genq(*args, "--tenant", "batch-t", str(lines))
    assert out.returncode == 0, out.stderr
    client = Client.from_url(redis_url, queue)
    bid = out.stdout.strip()
    view = read_batch(client, bid)
    assert view.record["tenant"] == "batch-t"
    assert client.result(f"{bid}-1", timeout=60).tenant == "batch-t"  # its line 1's request
    # A line's body cannot name a tenant: the key (or the flag) decides.
    named = {**line, "body": {**body, "tenant": "other"}}
    done = submit_batch(client, [json.dumps(named)], source="x", tenant="batch-t")
    assert done.submitted == 0 and "unsupported body fields ['tenant']" in done.rejected[0].message
    with pytest.raises(InvalidRequest, match="tenant"):
        submit_batch(client, [json.dumps(line)], source="x", tenant="no way")


def test_genq_tenants_sets_lists_and_deletes_settings(redis_url: str, queue: str) -> None:
    common = ["--redis-url", redis_url, "--queue", queue]
    out = genq("tenants", "set", *common, "team-a", "--weight", "3", "--tokens-per-minute", "900")
    assert out.returncode == 0, out.stderr
    unset = {  # what a tenant has not set: the gateway's defaults, no webhook
        "max_files": 0,
        "max_stored_bytes": 0,
        "max_batches": 0,
        "max_responses": 0,
        "max_priority": "",
        "webhook_url": "",
        "webhook_secret": "",
    }
    assert json.loads(out.stdout) == {
        "name": "team-a",
        "weight": 3.0,
        "tokens_per_minute": 900,
        "max_queued": 0,
        **unset,
        "share_prefixes": False,
    }
    # Only what is given changes.
    assert genq("tenants", "set", *common, "team-a", "--max-queued", "5").returncode == 0
    assert (
        genq("tenants", "set", *common, "b", "--weight", "0.5", "--share-prefixes").returncode == 0
    )
    listed = json.loads(genq("tenants", "list", *common, "--json").stdout)
    assert listed == [
        {
            "name": "b",
            "weight": 0.5,
            "tokens_per_minute": 0,
            "max_queued": 0,
            **unset,
            "share_prefixes": True,
        },
        {
            "name": "team-a",
            "weight": 3.0,
            "tokens_per_minute": 900,
            "max_queued": 5,
            **unset,
            "share_prefixes": False,
        },
    ]
    table = genq("tenants", "list", *common)
    assert table.returncode == 0 and "team-a" in table.stdout and "900" in table.stdout
    out = genq("tenants", "delete", *common, "team-a")
    assert out.returncode == 0 and "back to the defaults" in out.stdout
    assert "had no settings" in genq("tenants", "delete", *common, "team-a").stdout
    assert [t["name"] for t in json.loads(genq("tenants", "list", *common, "--json").stdout)] == [
        "b"
    ]


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["a b", "--weight", "1"], "tenant 'a b' is not allowed"),
        (["t", "--weight", "0"], "weight must be above 0"),
        (["t", "--weight", "-2"], "weight must be above 0"),
        (["t", "--weight", "nan"], "weight must be a number above 0"),
        (["t", "--tokens-per-minute", "-1"], "tokens_per_minute must be a whole number >= 0"),
        (["t", "--max-queued", "-5"], "max_queued must be a whole number >= 0"),
    ],
)
def test_bad_tenant_settings_are_one_clear_line(
    redis_url: str, queue: str, r: redis.Redis, args: list[str], said: str
) -> None:
    out = genq("tenants", "set", "--redis-url", redis_url, "--queue", queue, *args)
    assert out.returncode == 2 and said in out.stderr, out.stderr
    assert "Traceback" not in out.stderr
    assert not r.exists(Keys(queue).tenants)  # nothing written


def test_a_tenants_webhook_secret_can_come_from_stdin_not_argv(redis_url: str, queue: str) -> None:
    """``--webhook-secret -`` reads it from stdin, so it never shows in ``ps``."""
    secret = "whsec_" + "B" * 32
    common = ["--redis-url", redis_url, "--queue", queue, "--webhook-url", "http://127.0.0.1:9/h"]
    done = genq("tenants", "set", "hooked", *common, "--webhook-secret", "-", stdin=secret + "\n")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["webhook_secret"] == "(set)"
    r = redis.Redis.from_url(redis_url)
    assert r.hget(Keys(queue).webhook_secrets, "hooked") == secret.encode()
    assert secret.encode() not in r.hget(Keys(queue).tenants, "hooked")


def test_a_webhook_secret_is_kept_apart_from_the_settings_and_goes_with_the_webhook(
    redis_url: str, queue: str
) -> None:
    """The secret lives outside ``genq:*`` (only gateways' ACL users read it); changing other
    settings leaves it alone, clearing the URL clears it, ``delete`` takes it, and one an older
    genq stored inside the settings moves out at the next change."""
    from genq.common import tenants

    r, keys = redis.Redis.from_url(redis_url), Keys(queue)
    url, secret = "http://127.0.0.1:9/h", "whsec_" + "C" * 32
    shown = tenants.update(r, keys, "t", webhook_url=url, webhook_secret=secret)
    assert secret not in repr(shown)  # a log line or a traceback shows no secret
    assert not keys.webhook_secrets.startswith("genq:")
    assert tenants.update(r, keys, "t", weight=2.0).webhook_url == url
    assert r.hget(keys.webhook_secrets, "t") == secret.encode()
    other = "http://127.0.0.1:9/other"  # a new URL keeps the stored secret
    assert tenants.update(r, keys, "t", webhook_url=other).webhook_secret == secret
    tenants.update(r, keys, "t", webhook_url="")
    assert r.hget(keys.webhook_secrets, "t") is None
    with pytest.raises(ConfigError, match="needs both"):
        tenants.update(r, keys, "t", webhook_url=url)
    tenants.update(r, keys, "t", webhook_url=url, webhook_secret=secret)
    assert tenants.delete(r, keys, "t") and not r.exists(keys.webhook_secrets)
    old = {"weight": 1.0, "webhook_url": url, "webhook_secret": secret}  # an older genq's
    r.hset(keys.tenants, "old", json.dumps(old))
    hook = tenants.read_all(r, keys)["old"].webhook("old", "")
    assert hook is not None and hook.secret == secret  # still signs
    tenants.update(r, keys, "old", weight=3.0)
    assert r.hget(keys.webhook_secrets, "old") == secret.encode()
    assert secret.encode() not in r.hget(keys.tenants, "old")
