"""OpenAI batch files: submit, status, results and cancel, round trip on the tiny model."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from tests.conftest import WorkerProcess

LINES = [
    {"custom_id": "c1", "method": "POST", "url": "/v1/completions",
     "body": {"model": "any", "prompt": "Once upon a time", "max_tokens": 8}},
    {"custom_id": "c2", "method": "POST", "url": "/v1/chat/completions",
     "body": {"model": "any", "messages": [{"role": "user", "content": "Hello"}],
              "max_tokens": 6, "temperature": 0.7, "seed": 3}},
    {"custom_id": "c3", "method": "POST", "url": "/v1/embeddings", "body": {"input": "x"}},
    {"custom_id": "c4", "method": "POST", "url": "/v1/completions",
     "body": {"prompt": "fine", "max_tokens": 4, "logprobs": 3}},
    {"custom_id": "c5", "method": "POST", "url": "/v1/completions",
     "body": {"prompt": "too long", "max_tokens": 5000}},
]  # fmt: skip


def genq(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "genq.worker", "batch", *args],
                          capture_output=True, text=True, timeout=180)  # fmt: skip


def test_a_batch_file_round_trip_on_the_tiny_model(
    redis_url: str, queue: str, tmp_path: Path, start_worker: Callable[..., WorkerProcess]
) -> None:
    src = tmp_path / "input.jsonl"
    src.write_text("\n".join(json.dumps(x) for x in LINES) + "\n{broken\n")
    where = ["--redis-url", redis_url, "--queue", queue]
    sub = genq("submit", *where, str(src))
    assert sub.returncode == 0, sub.stderr
    info = json.loads(sub.stdout)
    assert info["submitted"] == 3 and info["invalid_lines"] == [3, 4, 6]
    assert "line 3: 'url' must be one of" in sub.stderr
    assert "line 4: unsupported body fields ['logprobs']" in sub.stderr
    assert "line 6: not valid JSON" in sub.stderr
    start_worker(queue, "--model", "tiny", "--engine", "static", "--max-new-tokens-limit", "256")
    out, errs = tmp_path / "out.jsonl", tmp_path / "errors.jsonl"
    res = genq("results", *where, info["id"], "-o", str(out), "--errors", str(errs),
               "--timeout-s", "120")  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout) == {"id": info["id"], "completed": 2, "failed": 1}
    done = [json.loads(x) for x in out.read_text().splitlines()]
    assert [d["custom_id"] for d in done] == ["c1", "c2"]
    completion, chat = (d["response"]["body"] for d in done)
    assert completion["object"] == "text_completion" and completion["choices"][0]["text"]
    assert chat["object"] == "chat.completion"
    assert chat["choices"][0]["message"]["role"] == "assistant"
    assert completion["usage"]["completion_tokens"] <= 8
    (failed,) = [json.loads(x) for x in errs.read_text().splitlines()]
    assert failed["custom_id"] == "c5" and failed["error"]["code"] == "max_new_tokens_too_large"
    status = json.loads(genq("status", *where, info["id"]).stdout)
    assert status["status"] == "completed"
    assert status["request_counts"] == {"total": 3, "completed": 2, "failed": 1}
    # The same file again under the same id enqueues nothing twice.
    again = genq("submit", *where, str(src), "--batch-id", info["id"])
    assert json.loads(again.stdout)["submitted"] == 3
    assert json.loads(genq("status", *where, info["id"]).stdout)["status"] == "completed"


def test_a_batch_can_be_cancelled(redis_url: str, queue: str, tmp_path: Path) -> None:
    src = tmp_path / "input.jsonl"
    src.write_text("\n".join(json.dumps(x) for x in LINES[:2]))
    where = ["--redis-url", redis_url, "--queue", queue]
    bid = json.loads(genq("submit", *where, str(src)).stdout)["id"]
    assert json.loads(genq("status", *where, bid).stdout)["status"] == "in_progress"
    assert json.loads(genq("cancel", *where, bid).stdout)["cancelled"] == 2
    status = json.loads(genq("status", *where, bid).stdout)
    assert status["status"] == "cancelled" and status["request_counts"]["failed"] == 2
    out = tmp_path / "out.jsonl"
    genq("results", *where, bid, "-o", str(out), "--timeout-s", "10")
    assert {json.loads(x)["error"]["code"] for x in out.read_text().splitlines()} == {"cancelled"}
