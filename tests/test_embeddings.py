"""Embeddings through the queue on a real model (all-MiniLM-L6-v2, from its package): the
vectors sentence-transformers publishes for it, batched equal to alone, each input's rules
(truncate, token ids, dimensions) and a request of the wrong kind for its model failing alone
with a clear error while the rest succeed."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from genq.common.embeddings import cut_by_length, pack, unpack
from genq.common.errors import ConfigError, InvalidRequest, RequestFailed
from genq.producer import Client
from genq.producer.building import build_embedding, embeddings_of
from genq.worker.engines.base import GenerationInput
from genq.worker.engines.embedding import EmbeddingEngine
from genq.worker.engines.static import StaticEngine, resolve_model

from tests.conftest import (
    WorkerProcess,
    genq,
    genq_stats,
    varied_prompts,
    wait_until,
    worker_thread,
)

pytestmark = pytest.mark.slow

MODEL = "all-minilm-l6-v2"


@pytest.fixture(scope="module")
def engine() -> EmbeddingEngine:
    try:
        return EmbeddingEngine.load(resolve_model(MODEL))
    except ConfigError as err:  # CI installs it (scripts/setup.sh); say so where it is not
        pytest.skip(str(err))


@pytest.fixture()
def client(redis_url: str, queue: str) -> Iterator[Client]:
    c = Client.from_url(redis_url, queue)
    yield c
    c.close()


def cosine(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    return dot / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


def test_the_vectors_are_the_ones_sentence_transformers_publishes(
    redis_url: str, queue: str, engine: EmbeddingEngine, client: Client
) -> None:
    # The model card's quickstart: these three sentences' similarities, to 4 places.
    texts = ["The weather is lovely today.", "It's so sunny outside!", "He drove to the stadium."]
    with worker_thread(redis_url, queue, engine, served_model_name=MODEL, max_wait_ms=0):
        got = client.embed(texts, model=MODEL, timeout=60)
    a, b, c = got.vectors
    assert len(a) == 384 and got.model == MODEL
    assert [round(cosine(a, b), 4), round(cosine(a, c), 4), round(cosine(b, c), 4)] == [
        0.6660,
        0.1046,
        0.1411,
    ]
    assert abs(math.sqrt(sum(x * x for x in a)) - 1) < 1e-5  # the folder's Normalize module
    assert got.prompt_tokens == sum(len(ids) for ids in engine.tokenize(texts))


def test_batched_vectors_equal_each_input_alone(
    redis_url: str, queue: str, engine: EmbeddingEngine, client: Client
) -> None:
    texts = varied_prompts(40)
    texts[7] = texts[3]  # a repeat: computed once, given to both
    ids = client.submit_requests(
        [build_embedding(texts[i : i + 4], model=MODEL) for i in range(0, 40, 4)]
    )
    saved = engine.saved_inputs
    with worker_thread(redis_url, queue, engine, served_model_name=MODEL, max_wait_ms=0):
        results = client.results(ids, timeout=120)
    assert max(r.batch_size or 0 for r in results) > 1  # they did share a batch
    assert engine.saved_inputs > saved
    batched = [v for r in results for v in r.vectors()]
    for text, vector in zip(texts, batched, strict=True):
        row = GenerationInput(prompt_ids=[], max_new_tokens=0, inputs=engine.tokenize([text]))
        alone = unpack(pack(engine.generate([row]).outputs[0].vectors[0]))
        assert cosine(vector, alone) > 1 - 1e-5


def test_embed_many_sends_like_lengths_together_and_answers_in_the_inputs_order(
    redis_url: str, queue: str, engine: EmbeddingEngine, client: Client
) -> None:
    texts = [("word " * n).strip() for n in (90, 3, 60, 1, 120, 7, 2, 45, 9, 30)]
    parts = cut_by_length(texts, most_inputs=3, most_chars=700)
    assert sorted(i for p in parts for i in p) == list(range(10))  # each input once
    assert [len(p) for p in parts] == [3, 3, 2, 1, 1]  # 700 chars: the 600-char one is alone
    assert parts[0] == [3, 6, 1]  # the shortest first
    assert cut_by_length([[1] * 200, "x"], most_inputs=2, most_chars=700) == [[1], [0]]
    with worker_thread(redis_url, queue, engine, served_model_name=MODEL, max_wait_ms=0):
        vectors = client.embed_many(texts, model=MODEL, per_request=3, timeout=120)
    for text, vector in zip(texts, vectors, strict=True):
        row = GenerationInput(prompt_ids=[], max_new_tokens=0, inputs=engine.tokenize([text]))
        assert cosine(vector, unpack(pack(engine.generate([row]).outputs[0].vectors[0]))) > 0.9999


def test_stats_and_prometheus_count_each_models_inputs_and_the_repeats_it_saved(
    redis_url: str, queue: str, engine: EmbeddingEngine, client: Client
) -> None:
    import re
    import urllib.request

    from genq.worker.devtools.redis_server import free_port

    port = free_port()
    texts = ["stats one", "stats another", "stats one", "stats third", "stats another", "last"]
    settings = {"served_model_name": MODEL, "max_wait_ms": 0, "metrics_port": port}
    with worker_thread(redis_url, queue, engine, **settings, metrics_host="127.0.0.1"):
        got = client.embed(texts, model=MODEL, timeout=60)

        def row() -> dict[str, Any]:
            rows = genq_stats(redis_url, queue)["models"]
            return next(m for m in rows if MODEL in (m["model"], m["served_by"]))

        wait_until(lambda: row()["embedded_inputs"] == 6, timeout_s=30)
        done = row()
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
        table = genq("stats", "--redis-url", redis_url, "--queue", queue).stdout
    computed = sum(len(ids) for ids in engine.tokenize(sorted(set(texts))))
    assert (done["saved_inputs"], done["embedded_tokens"]) == (2, computed)
    assert got.prompt_tokens > computed  # each request pays for its own inputs
    assert done["inputs_per_s"] > 0 and done["input_tokens_per_s"] > 0
    assert 0 <= done["embedding_padding"] < 1
    counted = {
        name: float(value)
        for name, value in re.findall(r"^(genq_\w+_total)\{[^}]*\} (\S+)$", text, re.M)
    }
    assert counted["genq_embedded_inputs_total"] == 6
    assert counted["genq_embedding_saved_inputs_total"] == 2
    assert counted["genq_embedded_tokens_total"] == computed
    assert "embeddings (by the live workers" in table and "saved (repeats)" in table


def test_a_repeat_is_computed_once_for_one_tenant_and_never_across_tenants_that_do_not_share(
    redis_url: str, queue: str, engine: EmbeddingEngine, client: Client
) -> None:
    text = "a sentence only this test sends"
    tokens = len(engine.tokenize([text])[0])
    where = ("--redis-url", redis_url, "--queue", queue)

    def cached(tenant: str, sent: str = text) -> int:
        got = client.embed([sent], model=MODEL, tenant=tenant, timeout=60)
        return got.result.usage.cached_tokens

    fresh = itertools.count()

    def met(first: str, then: str) -> bool:  # a new text each time: only a shared scope meets
        sent = f"{text} {next(fresh)}"
        return cached(first, sent) == 0 and cached(then, sent) > 0

    with worker_thread(redis_url, queue, engine, served_model_name=MODEL, max_wait_ms=0):
        assert cached("acme") == 0  # computed
        assert cached("acme") == tokens  # the same tenant's repeat: from the recent vectors
        assert cached("globex") == 0  # another tenant: computed again, nothing shared
        for tenant in ("acme", "initech"):
            done = genq("tenants", "set", tenant, "--share-prefixes", *where)
            assert done.returncode == 0, done.stderr
        wait_until(lambda: met("acme", "initech"), timeout_s=15)  # once the worker reads it
        assert not met("acme", "globex") and not met("globex", "initech")
    mine = GenerationInput(prompt_ids=[], max_new_tokens=0, inputs=[[5, 6, 7]], scope="x")
    theirs = GenerationInput(prompt_ids=[], max_new_tokens=0, inputs=[[5, 6, 7]], scope="y")
    report = engine.generate([mine, theirs, mine])
    assert report.saved_inputs == 1 and [o.cached_tokens for o in report.outputs] == [0, 0, 3]
    assert report.padded_prompt_tokens == 3 + 3 + 3 and report.prompt_tokens == 9


def test_a_batch_stopped_between_passes_keeps_what_they_made_for_its_rerun(
    engine: EmbeddingEngine,
) -> None:
    import threading

    from genq.worker.engines.base import StoppedEarly

    texts = [f"stop test {i} " + "word " * (i % 50) for i in range(120)]  # several passes
    rows = [
        GenerationInput(prompt_ids=[], max_new_tokens=0, inputs=engine.tokenize([t]), scope="s")
        for t in texts
    ]

    class AfterOnePass(threading.Event):  # set once the first pass has been looked at
        looks = 0

        def is_set(self) -> bool:
            self.looks += 1
            return self.looks > 1

    with pytest.raises(StoppedEarly):
        engine.generate(rows, stop=AfterOnePass())
    first = set(engine._made)
    assert 0 < len(first) < len(texts)  # the first pass's vectors wait
    with pytest.raises(StoppedEarly):  # stopped again in its rerun: nothing made is lost
        engine.generate(rows, stop=AfterOnePass())
    assert first < set(engine._made) and len(engine._made) < len(texts)
    report = engine.generate(rows, stop=threading.Event())
    assert not engine._made and report.saved_inputs == 0  # made before, not repeats: computed
    assert all(o.cached_tokens == 0 for o in report.outputs)
    for text, out in zip(texts, report.outputs, strict=True):
        alone = GenerationInput(prompt_ids=[], max_new_tokens=0, inputs=engine.tokenize([text]))
        vector = unpack(pack(engine.generate([alone]).outputs[0].vectors[0]))
        assert cosine(unpack(pack(out.vectors[0])), vector) > 1 - 1e-5


def test_each_inputs_rules_and_the_wrong_kind_of_request_fail_alone(
    redis_url: str, queue: str, engine: EmbeddingEngine, client: Client
) -> None:
    long_text = "head " + "word " * 400 + "tail"  # ~400 tokens, over the model's 256
    token_ids = engine.tokenize(["The weather is lovely today."])[0]
    requests = {
        "plain": build_embedding("The weather is lovely today.", model=MODEL),
        "ids": build_embedding([token_ids], model=MODEL),
        "end": build_embedding(long_text, model=MODEL),
        "start": build_embedding(long_text, model=MODEL, truncate="start"),
        "none": build_embedding(long_text, model=MODEL, truncate="none"),
        "own size": build_embedding("x", model=MODEL, dimensions=384),
        "other size": build_embedding("x", model=MODEL, dimensions=100),
        "bad ids": build_embedding([[1, 2, 10**6]], model=MODEL),
        "unnormalized": build_embedding(
            "The weather is lovely today.", model=MODEL, normalize=False
        ),
    }
    ids = client.submit_requests(list(requests.values()))
    prompt_id = client.submit("Hello", model=MODEL)
    with worker_thread(redis_url, queue, engine, served_model_name=MODEL, max_wait_ms=0):
        results = dict(zip(requests, client.results(ids, timeout=120), strict=True))
        generation = client.result(prompt_id, timeout=60)
    status = {name: r.status for name, r in results.items()}
    assert status == {
        **dict.fromkeys(requests, "succeeded"),
        "none": "failed",
        "other size": "failed",
        "bad ids": "failed",
    }
    assert results["none"].error is not None and "input 0 has" in results["none"].error.message
    assert generation.status == "failed" and generation.error is not None
    assert "makes embeddings and generates no text" in generation.error.message
    plain = results["plain"].vectors()[0]
    assert cosine(results["ids"].vectors()[0], plain) > 1 - 1e-6  # ids are the text's
    assert results["end"].usage.prompt_tokens == 256 == results["start"].usage.prompt_tokens
    assert results["end"].vectors() != results["start"].vectors()
    raw = results["unnormalized"].vectors()[0]
    norm = math.sqrt(sum(x * x for x in raw))
    assert norm > 1.5 and cosine(raw, plain) > 1 - 1e-6
    with pytest.raises(RequestFailed, match="384 dimensions"):
        embeddings_of(results["other size"])


def test_an_embedding_request_to_a_generating_model_fails_alone(
    redis_url: str, queue: str, client: Client
) -> None:
    embed_id = client.submit_requests([build_embedding("a text")])[0]
    prompt_id = client.submit("Hello", max_new_tokens=2)
    with worker_thread(redis_url, queue, StaticEngine.load("tiny"), max_wait_ms=0):
        embedding, generation = client.results([embed_id, prompt_id], timeout=60)
    assert generation.status == "succeeded"
    assert embedding.status == "failed" and embedding.error is not None
    assert "makes no embeddings" in embedding.error.message


@pytest.mark.parametrize(
    ("inputs", "options", "says"),
    [
        ([], {}, "input"),
        ([""], {}, "input"),
        (["x"] * 2049, {}, "input"),
        (["x"], {"truncate": "middle"}, "truncate"),
        (["x"], {"dimensions": 0}, "dimensions"),
        ([[]], {}, "input"),
        ([[-1]], {}, "input"),
        (["x"], {"tenant": "a b"}, "tenant"),
    ],
)
def test_a_bad_embedding_request_is_refused_before_redis(
    r: redis.Redis, client: Client, inputs: list[str], options: dict[str, object], says: str
) -> None:
    before = r.dbsize()
    with pytest.raises(InvalidRequest, match=says):
        client.embed(inputs, **options)  # type: ignore[arg-type]
    assert r.dbsize() == before


def test_genq_worker_serves_an_embedding_model_by_its_name(
    queue: str, client: Client, start_worker: Callable[..., WorkerProcess]
) -> None:
    worker = start_worker(queue, "--model", MODEL)
    got = client.embed(["one", "two"], model=MODEL, timeout=120)
    assert len(got.vectors) == 2 and len(got.vectors[0]) == 384
    log = worker.log()
    assert "engine embedding: an embedding model" in log
    assert "256 requests, 4096 tokens" in log  # its own batch limits where they are auto
    assert worker.stop() == 0


def test_any_redis_client_can_ask_for_embeddings_and_read_them(
    redis_url: str, queue: str, engine: EmbeddingEngine, r: redis.Redis
) -> None:
    # The wire format's example, by redis-cli (the queue's default model: its first worker's):
    # a plain XADD on the unnamed lane, the packed vectors back.
    import base64
    import json
    import struct
    import subprocess

    from genq.common.keys import Keys

    body = json.dumps(
        {
            "input": ["The weather is lovely today.", "It's so sunny outside!"],
            "max_new_tokens": 0,
            "model": MODEL,
        }
    )
    port = redis_url.rsplit(":", 1)[1].split("/")[0]
    with worker_thread(redis_url, queue, engine, served_model_name=MODEL, max_wait_ms=0):
        subprocess.run(
            [
                "redis-cli",
                "-p",
                port,
                "XADD",
                Keys(queue).stream("normal"),
                "*",
                "id",
                "e1",
                "body",
                body,
            ],
            check=True,
            capture_output=True,
        )
        wait_until(lambda: b'"succeeded"' in (r.get(Keys.result("e1")) or b""), 60)
    result = json.loads(r.get(Keys.result("e1")))  # type: ignore[arg-type]
    a, b = (struct.unpack("<384f", base64.b64decode(e)) for e in result["embeddings"])
    assert round(cosine(list(a), list(b)), 4) == 0.6660
    assert result["usage"]["prompt_tokens"] > 0 and result["text"] == ""


def test_the_openai_sdk_embeds_through_the_gateway_in_float_and_base64(
    sdk_serving: Callable[[str], Any], engine: EmbeddingEngine
) -> None:
    import base64

    import numpy as np
    import openai

    client = sdk_serving(MODEL)
    texts = ["The weather is lovely today.", "It's so sunny outside!", "He drove to the stadium."]
    floats = client.embeddings.create(model=MODEL, input=texts, encoding_format="float")
    assert [d.index for d in floats.data] == [0, 1, 2]
    a, b, c = (d.embedding for d in floats.data)
    assert [round(cosine(a, b), 4), round(cosine(a, c), 4)] == [0.6660, 0.1046]
    assert (
        floats.usage.prompt_tokens
        == floats.usage.total_tokens
        == sum(len(ids) for ids in engine.tokenize(texts))
    )
    # The SDK's default asks for base64 and decodes it itself: the same vectors.
    default = client.embeddings.create(model=MODEL, input=texts)
    assert [d.embedding for d in default.data] == [d.embedding for d in floats.data]
    raw = client.embeddings.with_raw_response.create(
        model=MODEL, input="one text", encoding_format="base64"
    ).http_response.json()
    vector = np.frombuffer(base64.b64decode(raw["data"][0]["embedding"]), "<f4")
    assert vector.shape == (384,) and abs(float(np.linalg.norm(vector)) - 1) < 1e-5
    ids = client.embeddings.create(model=MODEL, input=engine.tokenize(["one text"])[0])
    assert cosine(ids.data[0].embedding, vector.tolist()) > 1 - 1e-6  # token ids: the same
    models = client.models.list().model_dump()["data"]
    assert [(m["id"], m["kind"]) for m in models] == [(MODEL, "embedding")]
    for bad, says in [
        ({"input": ""}, "input"),
        ({"input": ["x"] * 2049}, "input"),
        ({"input": "word " * 400, "extra_body": {"truncate": "none"}}, "over the model"),
        ({"input": "x", "dimensions": 100}, "384 dimensions"),
        ({"input": "x", "encoding_format": "binary"}, "encoding_format"),
    ]:
        with pytest.raises(openai.BadRequestError, match=says):
            client.embeddings.create(model=MODEL, **bad)
    with pytest.raises(openai.BadRequestError, match="makes embeddings and generates no text"):
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}])


def test_langchains_openai_embeddings_work_unmodified(
    sdk_serving: Callable[[str], Any], engine: EmbeddingEngine
) -> None:
    from langchain_openai import OpenAIEmbeddings

    client = sdk_serving(MODEL)
    # check_embedding_ctx_length=False: LangChain would otherwise count tokens with OpenAI's
    # tiktoken (and fetch its tables); a server of another model tokenizes for itself.
    lc = OpenAIEmbeddings(
        model=MODEL,
        base_url=str(client.base_url),
        api_key=client.api_key,
        check_embedding_ctx_length=False,
        max_retries=0,
    )
    texts = ["The weather is lovely today.", "It's so sunny outside!", "He drove to the stadium."]
    a, b, c = lc.embed_documents(texts)
    assert [round(cosine(a, b), 4), round(cosine(a, c), 4)] == [0.6660, 0.1046]
    assert cosine(lc.embed_query(texts[0]), a) > 1 - 1e-6


def test_the_openai_package_for_node_embeds_unmodified(
    sdk_serving: Callable[[str], Any], openai_client: Any
) -> None:
    import json
    import subprocess
    from pathlib import Path

    script = Path(__file__).resolve().parent / "node" / "embeddings.mjs"
    if not (script.parent / "node_modules" / "openai").exists():
        pytest.skip("the openai package for Node.js is not installed: npm ci --prefix tests/node")
    sdk_serving(MODEL)
    url, key = str(openai_client.base_url).rstrip("/"), openai_client.api_key
    out = subprocess.run(
        ["node", str(script), url, key, MODEL], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stdout + out.stderr
    report = json.loads(out.stdout.strip().splitlines()[-1])
    (a, b), floats = report["base64"], report["float"]
    assert len(a) == 384 and round(cosine(a, b), 4) == 0.6660
    assert all(cosine(x, y) > 1 - 1e-6 for x, y in zip(report["base64"], floats, strict=True))
    assert report["usage"]["prompt_tokens"] > 0


def test_a_batch_file_of_embedding_lines_comes_back_base64_unless_a_line_asks_for_floats(
    sdk_serving: Callable[[str], Any], engine: EmbeddingEngine
) -> None:
    import base64
    import json
    import time

    import numpy as np

    client = sdk_serving(MODEL)
    texts = varied_prompts(24)
    body = {"model": MODEL}
    lines: list[dict[str, Any]] = [
        {"custom_id": f"e{i}", "url": "/v1/embeddings", "body": body | {"input": texts[i : i + 3]}}
        for i in range(0, 24, 3)
    ]
    lines[1]["body"]["encoding_format"] = "float"
    lines[2]["body"]["colour"] = "red"  # refused at submission, naming the field
    lines[3]["body"]["dimensions"] = 100  # refused by the worker: the model has 384
    content = "\n".join(json.dumps(x) for x in lines).encode()
    uploaded = client.files.create(file=("embed.jsonl", content), purpose="batch")
    batch = client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/embeddings", completion_window="24h"
    )
    deadline = time.monotonic() + 120
    while batch.status not in ("completed", "failed") and time.monotonic() < deadline:
        time.sleep(0.3)
        batch = client.batches.retrieve(batch.id)
    assert batch.status == "completed" and batch.output_file_id and batch.error_file_id
    out = [json.loads(x) for x in client.files.content(batch.output_file_id).text.splitlines()]
    errors = [json.loads(x) for x in client.files.content(batch.error_file_id).text.splitlines()]
    assert sorted(o["custom_id"] for o in out) == ["e0", "e12", "e15", "e18", "e21", "e3"]
    assert {e["custom_id"]: e["error"]["message"] for e in errors}.keys() == {"e6", "e9"}
    assert "colour" in next(e for e in errors if e["custom_id"] == "e6")["error"]["message"]
    for line in out:
        body = line["response"]["body"]
        start = int(line["custom_id"][1:])
        assert body["object"] == "list" and body["model"] == MODEL
        assert body["usage"]["prompt_tokens"] == sum(
            len(ids) for ids in engine.tokenize(texts[start : start + 3])
        )
        for d, text in zip(body["data"], texts[start : start + 3], strict=True):
            if line["custom_id"] == "e3":
                vector = d["embedding"]  # the line asked for floats
            else:
                vector = np.frombuffer(base64.b64decode(d["embedding"]), "<f4").tolist()
            row = GenerationInput(prompt_ids=[], max_new_tokens=0, inputs=engine.tokenize([text]))
            alone = unpack(pack(engine.generate([row]).outputs[0].vectors[0]))
            assert cosine(vector, alone) > 1 - 1e-5


def test_rerank_and_score_on_an_embedding_model_are_the_cosines_of_its_vectors(
    sdk_serving: Callable[[str], Any],
) -> None:
    import httpx

    client = sdk_serving(MODEL)
    base = str(client.base_url).rstrip("/").removesuffix("/v1")
    auth = {"Authorization": f"Bearer {client.api_key}"}

    def post(path: str, body: dict[str, Any]) -> httpx.Response:
        return httpx.post(base + path, json={"model": MODEL, **body}, headers=auth, timeout=60)

    weather, sunny, stadium = (
        "The weather is lovely today.",
        "It's so sunny outside!",
        "He drove to the stadium.",
    )
    ranked = post("/v1/rerank", {"query": weather, "documents": [stadium, sunny]}).json()
    assert [(r["index"], round(r["relevance_score"], 4)) for r in ranked["results"]] == [
        (1, 0.6660),
        (0, 0.1046),
    ]
    assert ranked["results"][0]["document"] == {"text": sunny} and ranked["model"] == MODEL
    assert ranked["usage"]["total_tokens"] > 0
    objects = [{"text": stadium}, {"text": sunny}]
    only = {"top_n": 1, "return_documents": False}
    short = post("/rerank", {"query": weather, "documents": objects, **only}).json()
    assert short["results"] == [
        {"index": 1, "relevance_score": ranked["results"][0]["relevance_score"]}
    ]
    many = post("/v1/score", {"text_1": weather, "text_2": [sunny, stadium]}).json()
    assert [round(d["score"], 4) for d in many["data"]] == [0.6660, 0.1046]
    pairwise = post("/score", {"text_1": [weather, sunny], "text_2": [sunny, stadium]}).json()
    assert [round(d["score"], 4) for d in pairwise["data"]] == [0.6660, 0.1411]
    for path, bad, says in [
        ("/v1/rerank", {"query": weather, "documents": []}, "documents"),
        ("/v1/rerank", {"documents": [sunny]}, "query"),
        ("/v1/rerank", {"query": weather, "documents": [sunny], "top_n": -1}, "top_n"),
        ("/v1/score", {"text_1": [weather, sunny], "text_2": [stadium] * 3}, "pairwise"),
        ("/v1/score", {"text_1": weather, "text_2": sunny, "colour": 1}, "colour"),
    ]:
        answer = post(path, bad)
        assert answer.status_code == 400 and says in answer.json()["error"]["message"], bad
