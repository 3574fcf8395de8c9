"""Operating genq: the Prometheus endpoint scraped from a real worker, `genq stats` and
`genq top` on a live queue."""

from __future__ import annotations

import re
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis
from genq.common.keys import Keys
from genq.producer import Client
from genq.worker.devtools.redis_server import free_port

from tests.conftest import WorkerProcess, genq, genq_stats, wait_until


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text: str = resp.read().decode()
        return text


def metric(text: str, name: str, **labels: str) -> float:
    """The value of one sample of ``name`` whose labels include ``labels``."""
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', line.split(" ")[0]))
        if all(found.get(k) == v for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no sample {name} {labels} in:\n{text}")


def test_the_metrics_endpoint_counts_requests_batches_and_waits(
    redis_url: str, queue: str, start_worker: Callable[..., WorkerProcess]
) -> None:
    port = free_port()
    start_worker(queue, "--engine", "echo", "--metrics-port", str(port))
    client = Client.from_url(redis_url, queue)
    ok = client.submit_many([f"m{i}" for i in range(10)], max_new_tokens=4, priority="high")
    bad = client.submit("too many", max_new_tokens=5000)
    client.results([*ok, bad], timeout=30)
    wait_until(lambda: _ready(port))
    text = scrape(port)
    assert metric(text, "genq_requests_total", status="succeeded", priority="high") == 10
    assert metric(text, "genq_requests_total", status="succeeded", tenant="default") == 10
    assert metric(text, "genq_requests_total", status="failed", priority="normal") == 1
    assert metric(text, "genq_queue_wait_seconds_count", priority="high") == 10
    assert metric(text, "genq_generated_tokens_total", queue=queue, model="echo") == 10 * 2  # mN
    assert metric(text, "genq_batch_size_count", queue=queue) >= 1
    assert metric(text, "genq_batch_size_sum", queue=queue) == 10
    wait_until(lambda: metric(scrape(port), "genq_in_flight_requests", queue=queue) == 0)
    assert "genq_generation_seconds_bucket" in text and "genq_padding_ratio" in text


def test_a_pool_workers_metrics_count_each_models_loads_evictions_and_load_time(
    redis_url: str, queue: str, start_worker: Callable[..., WorkerProcess]
) -> None:
    """The ``model`` label of a pool's metrics is the model loaded or evicted."""
    port = free_port()
    pool = ("--model", "alpha", "--model", "beta", "--resident-models", "1")
    start_worker(
        queue,
        "--engine",
        "echo",
        *pool,
        "--echo-load-ms",
        "200",
        "--min-resident-ms",
        "0",
        "--metrics-port",
        str(port),
    )
    client = Client.from_url(redis_url, queue)
    for model in ("beta", "alpha"):
        client.results(client.submit_many([{"prompt": "p", "model": model}] * 3), timeout=60)
    wait_until(lambda: _ready(port))

    def sample(name: str, model: str) -> float:
        return metric(scrape(port), name, queue=queue, model=model)

    wait_until(lambda: sample("genq_model_loads_total", "alpha") == 2)
    assert sample("genq_model_loads_total", "beta") == 1
    assert sample("genq_model_evictions_total", "alpha") == 1
    assert sample("genq_model_evictions_total", "beta") == 1
    assert sample("genq_model_load_seconds_count", "alpha") == 2
    assert sample("genq_model_load_seconds_sum", "beta") >= 0.2
    assert sample("genq_model_loading", "beta") == 0


def _ready(port: int) -> bool:
    try:
        return "genq_requests_total" in scrape(port)
    except OSError:
        return False


def test_stats_and_top_show_streams_workers_and_waits(
    redis_url: str, queue: str, start_worker: Callable[..., WorkerProcess]
) -> None:
    import subprocess
    import sys

    start_worker(queue, "--engine", "echo")
    client = Client.from_url(redis_url, queue)
    client.results(client.submit_many([f"s{i}" for i in range(20)]), timeout=30)
    client.submit("waiting", priority="low", deadline_in_s=3600)
    genq = [sys.executable, "-m", "genq.worker"]
    where = ["--redis-url", redis_url, "--queue", queue]

    def snapshot() -> dict[str, Any]:
        return genq_stats(redis_url, queue)

    wait_until(lambda: snapshot()["workers"][0].get("succeeded", 0) >= 21)  # type: ignore[index]
    (worker,) = snapshot()["workers"]  # type: ignore[misc]
    for field in (
        "last_seen_unix_ms",
        "in_flight",
        "in_flight_tokens",
        "wait_p50_ms",
        "wait_p99_ms",
        "recent_batch_sizes",
    ):
        assert field in worker, field
    top = subprocess.run(
        [*genq, "top", *where, "--iterations", "2", "--interval-s", "0.2"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert f"queue '{queue}'" in top.stdout and "wait p50/p99 ms" in top.stdout
    assert "w0" in top.stdout


def test_submit_a_file_of_prompts_refuses_bad_lines_whole_and_prints_results(
    redis_url: str,
    queue: str,
    r: redis.Redis,
    tmp_path: Path,
    start_worker: Callable[..., WorkerProcess],
) -> None:
    import json

    start_worker(queue, "--engine", "echo")
    good = (
        "first prompt\n"
        "\n"
        '{"prompt": "second", "max_new_tokens": 3, "priority": "high"}\n'
        "third prompt\n"
    )
    src = tmp_path / "prompts.txt"
    src.write_text(good + "{not json\n" + '{"prompt": "x", "max_new_tokens": -1}\n')
    where = ("--redis-url", redis_url, "--queue", queue, "--max-new-tokens", "5")
    out = genq("submit", *where, "--file", str(src), "--timeout-s", "60", timeout_s=120)
    assert out.returncode == 2, out.stderr  # the file is refused whole
    (line,) = [x for x in out.stderr.splitlines() if x.strip()]
    assert "line 5: not valid JSON" in line and "(and 1 more: line 6)" in line
    assert "nothing was submitted" in line and not out.stdout
    streams = [s for s in Keys(queue).streams() if r.exists(s)]  # (none: nothing added)
    assert all(r.xinfo_stream(s)["entries-added"] == 0 for s in streams)
    src.write_text(good)
    out = genq("submit", *where, "--file", str(src), "--timeout-s", "60", timeout_s=120)
    assert out.returncode == 0, out.stderr
    results = [json.loads(line) for line in out.stdout.splitlines()]
    assert [(r["line"], r["status"], r["text"]) for r in results] == [
        (1, "succeeded", "first"),
        (3, "succeeded", "sec"),
        (4, "succeeded", "third"),
    ]
    assert results[1]["priority"] == "high"


def test_the_metrics_endpoint_listens_where_it_is_told(
    redis_url: str, queue: str, start_worker: Callable[..., WorkerProcess]
) -> None:
    port = free_port()
    start_worker(
        queue, "--engine", "echo", "--metrics-port", str(port), "--metrics-host", "127.0.0.2"
    )
    Client.from_url(redis_url, queue).generate("hi", max_new_tokens=2, timeout=30)

    def scrape_at(host: str) -> str:
        with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=5) as resp:
            return str(resp.read().decode())

    wait_until(lambda: _answers(lambda: scrape_at("127.0.0.2")))
    with pytest.raises(OSError):
        scrape_at("127.0.0.1")


def _answers(get: Callable[[], str]) -> bool:
    try:
        return "genq_requests_total" in get()
    except OSError:
        return False


def test_a_cpu_worker_logs_no_transformers_error_about_psutil(
    redis_url: str, queue: str, start_worker: Callable[..., WorkerProcess]
) -> None:
    worker = start_worker(queue, "--model", "tiny", "--engine", "continuous")
    Client.from_url(redis_url, queue).generate("hello", max_new_tokens=4, timeout=120)
    worker.stop()
    assert "psutil" not in worker.log()


def test_stats_count_requests_waiting_in_a_workers_look_ahead_as_waiting(
    redis_url: str, queue: str, start_worker: Callable[..., WorkerProcess]
) -> None:
    """Read into a busy worker's look-ahead is still waiting: ``oldest_waiting_ms`` says so
    (it used to read 0 once every entry was delivered)."""
    import json
    import subprocess
    import sys

    client = Client.from_url(redis_url, queue)
    start_worker(
        queue,
        "--engine",
        "echo",
        "--echo-step-ms",
        "500",
        "--max-batch-size",
        "2",
        "--hand-back-after-ms",
        "600000",
        "--shutdown-grace-s",
        "0",
    )  # (holds what it read; need not finish it)
    client.submit_many([f"w{i}" for i in range(10)], max_new_tokens=8)  # 4 s a batch

    def normal() -> dict[str, int]:
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "genq.worker",
                "stats",
                "--redis-url",
                redis_url,
                "--queue",
                queue,
                "--json",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        row: dict[str, int] = json.loads(out.stdout)["streams"]["normal"]
        return row

    wait_until(lambda: normal()["lag"] == 0, timeout_s=20)  # every entry delivered
    # Published with the worker's stats (at the latest when its first batch is written).
    wait_until(lambda: normal()["oldest_waiting_ms"] >= 1000, timeout_s=15)
