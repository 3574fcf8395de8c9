"""A pool of real models (``--model`` repeated on the transformers engines): one CPU worker
holding one model at a time swaps between the tiny model and SmolLM2-135M by what waits, and
each answer equals the same prompt run alone on its model's engine (greedy). Real
redis-server, real worker processes, real models; bad pools fail at start in one line."""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis
from genq.common.keys import Keys
from genq.producer import Client

from tests.conftest import WorkerProcess, refused_at_start, wait_until

MODELS = ("tiny", "smollm2-135m")
PROMPTS = ["The capital of France is", "Water boils at", "One, two, three,", "Hello, my name"]


def alone(model: str, prompts: list[str], max_new_tokens: int) -> list[str]:
    """Each prompt's greedy text on its model's engine, one request at a time."""
    from genq.worker.engines.base import GenerationInput
    from genq.worker.engines.static import StaticEngine

    engine = StaticEngine.load(model)
    texts = []
    for prompt in prompts:
        ids = engine.tokenize([prompt])[0]
        row = GenerationInput(prompt_ids=ids, max_new_tokens=max_new_tokens)
        texts.append(engine.generate([row]).outputs[0].text)
    return texts


@pytest.mark.parametrize("engine", ["static", "continuous"])
def test_a_pool_of_real_models_answers_each_request_as_its_model_alone(
    engine: str,
    redis_url: str,
    queue: str,
    r: redis.Redis,
    start_worker: Callable[..., WorkerProcess],
) -> None:
    """Requests of both models, mixed, one resident at a time: each succeeds, names its model
    and equals its prompt alone on that model; the worker swapped (loads measured) and its
    stats say what it holds."""
    pool = [a for m in MODELS for a in ("--model", m)]
    worker = start_worker(
        queue, "--engine", engine, *pool, "--resident-models", "1", "--min-resident-ms", "0"
    )
    keys = Keys(queue)
    wait_until(lambda: r.hget(keys.worker("w0"), "resident") == b"tiny", timeout_s=120)
    client = Client.from_url(redis_url, queue)
    asked = [(m, p) for p in PROMPTS for m in MODELS]
    ids = [client.submit(p, model=m, max_new_tokens=8) for m, p in asked]
    results = client.results(ids, timeout=180)
    assert [x.status for x in results] == ["succeeded"] * len(asked), [x.error for x in results]
    assert [x.model for x in results] == [m for m, _ in asked]
    expected = {m: dict(zip(PROMPTS, alone(m, PROMPTS, 8), strict=True)) for m in MODELS}
    for (model, prompt), result in zip(asked, results, strict=True):
        assert result.text == expected[model][prompt], (model, prompt)
    stats = r.hgetall(keys.worker("w0"))
    assert int(stats[b"model_loads"]) >= 2 and int(stats[b"model_evictions"]) >= 1, stats
    assert int(stats[b"model_load_ms"]) > 0, stats
    assert stats[b"resident"] in (b"tiny", b"smollm2-135m"), stats
    assert "model pool: loaded smollm2-135m" in worker.log()
    client.close()


def test_a_warm_model_comes_back_from_host_memory_and_answers_as_alone(
    redis_url: str, queue: str, r: redis.Redis, start_worker: Callable[..., WorkerProcess]
) -> None:
    """``--warm-models 1`` on the continuous engine: the model evicted stays warm, its next
    load comes from host memory (the log says so, ``model_swaps`` counts it), and its answers
    (its batching manager started again) still equal each prompt alone."""
    pool = [a for m in MODELS for a in ("--model", m)]
    args = ("--resident-models", "1", "--warm-models", "1", "--min-resident-ms", "0")
    worker = start_worker(queue, "--engine", "continuous", *pool, *args)
    keys = Keys(queue)
    wait_until(lambda: r.hget(keys.worker("w0"), "resident") == b"tiny", timeout_s=120)
    client = Client.from_url(redis_url, queue)
    expected = {m: alone(m, PROMPTS[:2], 8) for m in MODELS}
    for model in ("smollm2-135m", "tiny", "smollm2-135m", "tiny"):  # each one a swap
        ids = [client.submit(p, model=model, max_new_tokens=8) for p in PROMPTS[:2]]
        results = client.results(ids, timeout=180)
        assert [(x.status, x.model) for x in results] == [("succeeded", model)] * 2
        assert [x.text for x in results] == expected[model], model
    log = worker.log()
    assert "loaded tiny in" in log and "ms from host memory" in log, log
    swaps = json.loads(r.hget(keys.worker("w0"), "model_swaps") or "{}")
    assert swaps["tiny"]["warm_loads"] == 2 and swaps["smollm2-135m"]["warm_loads"] == 1, swaps
    client.close()


def huge_model(folder: Path) -> Path:
    """A model folder whose one weight (its safetensors header says) takes 400 GB as float32."""
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))
    header = json.dumps(
        {"w": {"dtype": "F32", "shape": [100_000, 1_000_000], "data_offsets": [0, 0]}}
    )
    (folder / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header.encode())
    return folder


def test_a_real_pool_that_cannot_work_is_one_clear_line_at_start(
    redis_url: str, tmp_path: Path
) -> None:
    """A model among others that is no model folder, the same model twice, and a pool whose
    largest model cannot fit in memory (a folder whose weights, its safetensors header says,
    take 400 GB): one line, a non-zero exit, no traceback, before any model loads."""
    huge = str(huge_model(tmp_path / "huge"))
    cases = {
        ("--engine", "static", "--model", "tiny", "--model", huge): "cannot fit one model",
        ("--engine", "static", "--model", "tiny", "--model", "no-such-model-folder"): (
            "no-such-model-folder"
        ),
        ("--engine", "static", "--model", "tiny", "--model", "tiny"): "given twice",
        ("--engine", "static", "--model", "tiny", "--warm-models", "1"): "--warm-models keeps",
        ("--engine", "echo", "--model", "a", "--model", "b", "--warm-models", "1"): (
            "--warm-models keeps"
        ),
    }
    refused_at_start(redis_url, cases)


def test_a_pool_admits_with_each_models_own_engine_and_hands_back_what_it_does_not_hold() -> None:
    """The intake of a pool holding only the tiny model: a request of it is tokenized by its
    engine (its byte tokenizer: one id a byte) and held; one of the other model is not
    tokenized but handed back as it is (``Admitted.elsewhere``); one naming no model is the
    default model's."""
    from genq.common.models import Request
    from genq.common.wire import encode_request
    from genq.worker.engines.pool import EnginePool
    from genq.worker.engines.static import StaticEngine
    from genq.worker.policy.admission import Limits
    from genq.worker.policy.sizing import batch_limits
    from genq.worker.runtime.intake import Intake
    from genq.worker.runtime.outcomes import Outcomes

    keys = Keys("q")
    limits = batch_limits(tokens=4096, size=8, device=None)
    pool = EnginePool("static", lambda m: StaticEngine.load(m), "tiny", limits)
    pool.load("tiny")
    outcomes = Outcomes(worker="w", keys=keys, model="tiny", reads_tool_calls=pool.reads_tool_calls)
    served = frozenset(MODELS)
    admission = Limits(
        max_new_tokens=64,
        max_prompt_tokens=None,
        max_context_tokens=None,
        max_batch_tokens=4096,
        models=served,
    )
    intake = Intake(engine=pool, limits=admission, outcomes=outcomes, keys=keys, consumer="w")
    bodies = [
        Request(id="a", prompt="hello", model="tiny"),
        Request(id="b", prompt="hello", model="smollm2-135m"),
        Request(id="c", prompt="hey"),
    ]
    stream = keys.streams()[0]
    entries = [(f"{i + 1}-0", encode_request(b)) for i, b in enumerate(bodies)]
    admitted = intake.admit([(stream, entries)], now_ms=10, held=[])
    assert [h.request.model for h in admitted.held] == ["tiny", None]
    tiny = pool.engines["tiny"]
    assert [h.prompt_ids for h in admitted.held] == tiny.tokenize(["hello", "hey"])
    assert [h.request.model for h in admitted.elsewhere] == ["smollm2-135m"]
    assert admitted.elsewhere[0].prompt_ids == [] and not admitted.outcomes


@pytest.mark.slow
@pytest.mark.timeout(600)  # (three vLLM engine starts on 2 cores, beside another test)
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed")
def test_a_vllm_pool_swaps_engines_and_leaves_no_engine_process(
    redis_url: str, queue: str, r: redis.Redis, start_worker: Callable[..., WorkerProcess]
) -> None:
    """``--engine vllm`` with two models, one resident: each swap shuts one vLLM engine (its
    engine-core process) down and starts the other's; a model loaded again answers as it did
    the first time (greedy), and a stopped worker leaves no process of any engine behind."""
    import psutil

    worker = start_worker(
        queue,
        "--engine",
        "vllm",
        "--model",
        "smollm2-135m",
        "--model",
        "tiny",
        "--resident-models",
        "1",
        "--min-resident-ms",
        "0",
        "--vllm-args",
        '{"enforce_eager": true}',
        "--max-batch-tokens",
        "4096",
        "--max-batch-size",
        "8",
    )
    keys = Keys(queue)
    wait_until(lambda: r.hget(keys.worker("w0"), "resident") == b"smollm2-135m", timeout_s=300)
    client = Client.from_url(redis_url, queue)
    rounds, processes = [], []
    for model in ("smollm2-135m", "tiny", "smollm2-135m"):
        ids = [client.submit(p, model=model, max_new_tokens=8) for p in PROMPTS[:2]]
        results = client.results(ids, timeout=300)
        assert [(x.status, x.model) for x in results] == [("succeeded", model)] * 2, results
        rounds.append([x.text for x in results])
        processes.append(len(psutil.Process(worker.proc.pid).children(True)))
    assert rounds[2] == rounds[0] and rounds[0] != rounds[1]
    assert processes[2] == processes[0], processes  # (an engine's reaper goes with it too)
    stats = r.hgetall(keys.worker("w0"))
    assert int(stats[b"model_loads"]) == 3 and int(stats[b"model_evictions"]) == 2, stats
    family = [worker.proc.pid, *(c.pid for c in psutil.Process(worker.proc.pid).children(True))]
    client.close()
    assert worker.stop() == 0
    wait_until(
        lambda: (
            not any(psutil.pid_exists(p) and psutil.Process(p).status() != "zombie" for p in family)
        ),
        timeout_s=60,
    )


def test_a_pool_holds_a_chat_model_and_an_embedding_model_and_serves_each_through_the_gateway(
    queue: str, openai_client: Any, start_worker: Callable[..., WorkerProcess]
) -> None:
    """``--model tiny --model all-minilm-l6-v2``, one resident at a time (auto: the static
    engine, one model's batch at a time): ``GET /v1/models`` says which embeds before either is
    loaded, a chat gets tiny's greedy text and an embedding MiniLM's vectors, swapping between
    them, and each kind's request to the other model is a 400."""
    import openai
    from genq.worker.engines.embedding import EmbeddingEngine
    from genq.worker.engines.static import resolve_model

    start_worker(queue, "--model", "tiny", "--model", "all-minilm-l6-v2", "--resident-models", "1")
    wait_until(lambda: len(openai_client.models.list().data) == 2, timeout_s=120)
    kinds = {m["id"]: m["kind"] for m in openai_client.models.list().model_dump()["data"]}
    assert kinds == {"tiny": "generation", "all-minilm-l6-v2": "embedding"}
    texts = ["The weather is lovely today.", "It's so sunny outside!"]
    embedder = EmbeddingEngine.load(resolve_model("all-minilm-l6-v2"))
    from genq.common.embeddings import pack, unpack
    from genq.worker.engines.base import GenerationInput

    want_vectors = [
        unpack(pack(v))
        for v in embedder.generate(
            [GenerationInput(prompt_ids=[], max_new_tokens=0, inputs=embedder.tokenize(texts))]
        )
        .outputs[0]
        .vectors
    ]
    (want_text,) = alone("tiny", PROMPTS[:1], 8)
    for _ in range(2):  # a swap each way, twice
        got = openai_client.completions.create(
            model="tiny", prompt=PROMPTS[0], max_tokens=8, temperature=0
        )
        assert got.choices[0].text == want_text
        vectors = openai_client.embeddings.create(
            model="all-minilm-l6-v2", input=texts, encoding_format="float"
        )
        for d, want in zip(vectors.data, want_vectors, strict=True):
            assert max(abs(a - b) for a, b in zip(d.embedding, want, strict=True)) < 1e-5
    with pytest.raises(openai.BadRequestError, match="generates text"):
        openai_client.embeddings.create(model="tiny", input=texts)
    with pytest.raises(openai.BadRequestError, match="makes embeddings"):
        openai_client.completions.create(model="all-minilm-l6-v2", prompt="hi", max_tokens=2)
