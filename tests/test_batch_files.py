"""OpenAI batch files: submit, status, results and cancel, round trip on the tiny model."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import redis
from genq.common.keys import Keys
from openai.types import Batch

from tests.conftest import WorkerProcess

LINES = [
    {
        "custom_id": "c1",
        "method": "POST",
        "url": "/v1/completions",
        "body": {"model": "tiny", "prompt": "Once upon a time", "max_tokens": 8},
    },
    {
        "custom_id": "c2",
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {
            "model": "tiny",
            "messages": [{"role": "user", "content": "Hello"}],
            "max_tokens": 6,
            "temperature": 0.7,
            "seed": 3,
        },
    },
    {"custom_id": "c3", "method": "POST", "url": "/v1/moderations", "body": {"input": "x"}},
    {
        "custom_id": "c4",
        "method": "POST",
        "url": "/v1/completions",
        "body": {"prompt": "fine", "max_tokens": 4, "suffix": "!"},
    },
    {
        "custom_id": "c5",
        "method": "POST",
        "url": "/v1/completions",
        "body": {"prompt": "too long", "max_tokens": 5000},
    },
]


def genq(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "genq.worker", "batch", *args],
        capture_output=True,
        text=True,
        timeout=180,
    )


def test_a_batch_file_round_trip_on_the_tiny_model(
    redis_url: str, queue: str, tmp_path: Path, start_worker: Callable[..., WorkerProcess]
) -> None:
    src = tmp_path / "input.jsonl"
    src.write_text("\n".join(json.dumps(x) for x in LINES) + "\n{broken\n")
    where = ["--redis-url", redis_url, "--queue", queue]
    sub = genq("submit", *where, str(src))
    assert sub.returncode == 0, sub.stderr
    bid = sub.stdout.strip()  # only the batch id on stdout
    assert bid.startswith("batch_") and "\n" not in bid
    assert "3 submitted, 3 refused (lines 3, 4, 6: genq batch results --errors)" in sub.stderr
    assert len(sub.stderr.strip().splitlines()) == 1, sub.stderr
    start_worker(queue, "--model", "tiny", "--engine", "static", "--max-new-tokens-limit", "256")
    out, errs = tmp_path / "out.jsonl", tmp_path / "errors.jsonl"
    res = genq("results", *where, bid, "-o", str(out), "--errors", str(errs), "--timeout-s", "120")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout) == {"id": bid, "completed": 2, "failed": 4}
    done = [json.loads(x) for x in out.read_text().splitlines()]
    assert [d["custom_id"] for d in done] == ["c1", "c2"]
    completion, chat = (d["response"]["body"] for d in done)
    assert completion["object"] == "text_completion" and completion["choices"][0]["text"]
    assert completion["model"] == chat["model"] == "tiny"  # the model, not the worker's name
    assert chat["object"] == "chat.completion"
    assert chat["choices"][0]["message"]["role"] == "assistant"
    assert completion["usage"]["completion_tokens"] <= 8
    # The error file in the order lines ended (refused lines first), as OpenAI's may be.
    failed = {f["custom_id"]: f for f in map(json.loads, errs.read_text().splitlines())}
    assert set(failed) == {"c5", "c3", "c4", None}
    assert failed["c5"]["error"]["code"] == "max_new_tokens_too_large"
    assert failed["c3"]["error"]["code"] == "invalid_request"
    assert "line 3: 'url' must be one of" in failed["c3"]["error"]["message"]
    status = json.loads(genq("status", *where, bid).stdout)
    Batch.model_validate(status)
    assert status["status"] == "completed" and status["endpoint"] == "/v1/completions"
    assert status["request_counts"] == {"total": 6, "completed": 2, "failed": 4}
    assert status["input_file_id"] == "input.jsonl"
    assert status["output_file_id"] and status["error_file_id"] and status["completed_at"]
    # The same file again under the same id enqueues nothing twice.
    again = genq("submit", *where, str(src), "--batch-id", bid)
    assert again.stdout.strip() == bid
    assert json.loads(genq("status", *where, bid).stdout)["status"] == "completed"


def test_a_file_that_is_not_a_batch_file_is_one_line_exit_2_and_no_batch(
    redis_url: str, queue: str, tmp_path: Path, files_dir: Path
) -> None:
    r = redis.Redis.from_url(redis_url)
    where = ["--redis-url", redis_url, "--queue", queue]
    prose = tmp_path / "notes.txt"
    prose.write_text("".join(f"a line of notes, number {n}\n" for n in range(4003)))
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    stored_before = sorted(p.name for p in files_dir.rglob("*"))
    for path, says in [
        (prose, "notes.txt is not a batch input file: line 1: not valid JSON"),
        (empty, "empty.jsonl has no lines"),
    ]:
        sub = genq("submit", *where, str(path))
        assert sub.returncode == 2, sub.stderr
        (line,) = [x for x in sub.stderr.splitlines() if x.strip()]
        assert says in line and "no batch was created" in line, line
        assert "Traceback" not in sub.stderr and not sub.stdout
    assert "(and 4002 more lines like it)" in genq("submit", *where, str(prose)).stderr
    assert not r.keys(f"*{queue}*")  # no batch, no request, nothing of the queue
    assert sorted(p.name for p in files_dir.rglob("*")) == stored_before


def test_a_completion_without_max_tokens_gets_openais_default_of_16(
    redis_url: str, queue: str, tmp_path: Path
) -> None:
    src = tmp_path / "input.jsonl"
    line = {"custom_id": "a", "url": "/v1/completions", "body": {"prompt": "x"}}
    src.write_text(json.dumps(line) + "\n")
    where = ["--redis-url", redis_url, "--queue", queue]
    bid = genq("submit", *where, str(src)).stdout.strip()
    entry = redis.Redis.from_url(redis_url).xrange(Keys(queue).stream("normal"))[0][1]
    assert json.loads(entry[b"body"])["max_new_tokens"] == 16
    assert bid


def test_results_on_timeout_write_what_is_final_and_say_what_is_not(
    redis_url: str, queue: str, tmp_path: Path
) -> None:
    src = tmp_path / "input.jsonl"
    src.write_text("\n".join(json.dumps(x) for x in LINES[:2]) + "\n{broken\n")
    where = ["--redis-url", redis_url, "--queue", queue]
    bid = genq("submit", *where, str(src)).stdout.strip()
    out = tmp_path / "out.jsonl"
    res = genq("results", *where, bid, "-o", str(out), "--timeout-s", "1")
    assert res.returncode == 1
    assert "2 of 3 requests not final after 1.0 s" in res.stderr
    (refused,) = [json.loads(x) for x in out.read_text().splitlines()]
    assert refused["error"]["code"] == "invalid_request" and refused["custom_id"] is None
    status = json.loads(genq("status", *where, bid).stdout)
    Batch.model_validate(status)
    assert status["status"] == "in_progress" and status["output_file_id"] is None


def test_a_batch_can_be_cancelled(redis_url: str, queue: str, tmp_path: Path) -> None:
    src = tmp_path / "input.jsonl"
    src.write_text("\n".join(json.dumps(x) for x in LINES[:2]))
    where = ["--redis-url", redis_url, "--queue", queue]
    bid = genq("submit", *where, str(src)).stdout.strip()
    assert json.loads(genq("status", *where, bid).stdout)["status"] == "in_progress"
    assert json.loads(genq("cancel", *where, bid).stdout)["cancelled"] == 2
    status = json.loads(genq("status", *where, bid).stdout)
    Batch.model_validate(status)
    assert status["status"] == "cancelled" and status["request_counts"]["failed"] == 2
    assert status["cancelling_at"] and status["cancelled_at"]
    out = tmp_path / "out.jsonl"
    genq("results", *where, bid, "-o", str(out), "--timeout-s", "10")
    assert {json.loads(x)["error"]["code"] for x in out.read_text().splitlines()} == {"cancelled"}


def test_a_batchs_status_reads_its_counters_the_same_at_any_size(
    redis_url: str, queue: str, r: redis.Redis, start_worker: Callable[..., WorkerProcess]
) -> None:
    """Where each request of a batch ends, its batch's record counts it (completed, failed,
    cancelled, tokens), so a status read is one hash at 4 lines and at 300: no request's state
    read. The counters equal what the requests' states say, and the Batch object carries
    ``usage`` and ``model``."""
    from genq.producer import Client
    from genq.producer.gateway.batches import batch_status, read_batch, submit_batch

    def line(i: int, max_tokens: int = 6) -> str:
        body = {"model": "echo", "prompt": f"line {i} " * (1 + i % 3), "max_tokens": max_tokens}
        return json.dumps({"custom_id": f"c{i}", "url": "/v1/completions", "body": body})

    worker = start_worker(queue, "--engine", "echo", "--max-new-tokens-limit", "64")
    client = Client.from_url(redis_url, queue)
    big = [line(i) for i in range(300)] + [line(900 + i, 500) for i in range(4)] + ["{broken"]
    ids = {
        size: submit_batch(client, lines, source=f"{size}.jsonl").id
        for size, lines in (("small", [line(i) for i in range(4)]), ("big", big))
    }
    for bid in ids.values():
        for rid, _ in read_batch(client, bid).items:
            client.result(rid, timeout=60)
    worker.stop()  # (its idle commands would blur the count)
    reads: dict[str, dict[str, int]] = {}
    for size, bid in ids.items():
        r.config_resetstat()
        status = batch_status(client, bid)
        stats = r.info("commandstats")
        reads[size] = {k: int(v["calls"]) for k, v in stats.items() if "config" not in k}
        Batch.model_validate(status)
        assert status["model"] == "echo" and status["status"] == "completed"
        whole = read_batch(client, bid)  # the same, counted from every request's state
        assert whole.counts is None and whole.items
        counted = read_batch(client, bid, states=False)
        assert counted.counts is not None and not counted.items
        for field in ("completed", "failed", "total", "usage", "ended_ms", "finished"):
            assert getattr(counted, field) == getattr(whole, field), field
        prompt, cached, generated = whole.usage
        assert status["usage"]["input_tokens"] == prompt > 0
        assert status["usage"]["output_tokens"] == generated > 0
        assert status["usage"]["total_tokens"] == prompt + generated
        assert status["usage"]["input_tokens_details"]["cached_tokens"] == cached
    assert status["request_counts"] == {"total": 305, "completed": 300, "failed": 5}
    assert reads["small"] == reads["big"], reads  # one HGETALL, one LRANGE (refused lines)
    assert "cmdstat_mget" not in reads["big"] and reads["big"]["cmdstat_hgetall"] == 1


def _succeeded(**over: object) -> str:
    from genq.common import states

    args: dict[str, object] = {
        "request_id": "batch_x-7",
        "priority": "normal",
        "tenant": "default",
        "metadata": {"custom_id": 'c ✓ "7"', "batch": "batch_x"},
        "text": 'ünïcode and "quotes"\n',
        "finish_reason": "length",
        "prompt_tokens": 5,
        "completion_tokens": 3,
        "cached_tokens": 2,
        "queued_ms": 1_700_000_000_000,
        "started_ms": 1_700_000_000_100,
        "finished_ms": 1_700_000_001_999,
        "generation_ms": 50,
        "worker": "w0",
        "model": "org/chat-8b",
        "batch_size": 4,
    }
    return states.succeeded(**{**args, **over})  # type: ignore[arg-type]


CALL = {"name": "f", "arguments": "{}"}


@pytest.mark.parametrize("url", ["/v1/completions", "/v1/chat/completions"])
@pytest.mark.parametrize(
    "over", [{}, {"text": "", "finish_reason": "stop", "cached_tokens": 0}, {"model": ""}]
)
def test_an_output_line_read_as_json_equals_the_one_built_from_the_result(
    url: str, over: dict[str, object]
) -> None:
    """A wave batch writes its usual output lines from the state's JSON (no ``Result``
    built): the same line as ``output_line``; anything unusual takes ``output_line``."""
    from genq.common import states
    from genq.producer.gateway.batch_lines import output_line, plain_output_line
    from genq.producer.waiting import parse_stored

    raw = _succeeded(**over)
    res = parse_stored(raw)
    assert res is not None
    assert plain_output_line("batch_x-7", url, raw) == output_line("batch_x-7", url, res)
    unusual = [
        _succeeded(logprobs=[{"token": "a", "logprob": -0.1, "top_logprobs": []}]),
        _succeeded(choices=[{"index": 0, "text": "a", "finish_reason": "stop"}]),
        _succeeded(
            tool_calls=[
                {"id": "t", "type": "function", "function": {"name": "f", "arguments": "{}"}}
            ]
        ),
        states.cancelled(res, finished_ms=1),
    ]
    assert [plain_output_line("batch_x-7", url, u) for u in unusual] == [None] * 4
