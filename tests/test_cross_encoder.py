"""Cross-encoders through the queue: a query's score against each text, equal to
sentence-transformers' ``CrossEncoder.predict`` on the same folder, batched equal to alone,
``truncate`` on the text (never the query), and ``/v1/rerank`` and ``/v1/score`` answering with
the model's scores. The model is ``packaged_models.cross_encoder_dir``'s: MiniLM's encoder under a
seeded random head (its scores rank nothing; they are compared with the model's own)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from genq.common.errors import InvalidRequest, RequestFailed
from genq.producer import Client
from genq.producer.building import build_embedding
from genq.worker.engines.packaged_models import cross_encoder_dir
from genq.worker.engines.scoring import ScoringEngine, is_scoring_model

from tests.conftest import (
    WorkerProcess,
    refused_at_start,
    varied_prompts,
    wait_until,
    worker_thread,
)

pytestmark = pytest.mark.slow

NAME = "reranker"
QUERY = "what is the weather like"
DOCS = ["The weather is lovely today.", "He drove to the stadium.", "It's so sunny outside!"]


@pytest.fixture(scope="module")
def folder() -> str:
    return str(cross_encoder_dir())


@pytest.fixture(scope="module")
def engine(folder: str) -> ScoringEngine:
    return ScoringEngine.load(folder)


@pytest.fixture(scope="module")
def predicted(folder: str) -> Callable[[str, list[str]], list[float]]:
    """sentence-transformers' own scores of (query, text) pairs on the same folder."""
    from sentence_transformers import CrossEncoder

    model = CrossEncoder(folder, device="cpu")
    return lambda query, texts: [float(x) for x in model.predict([(query, t) for t in texts])]


@pytest.fixture()
def client(redis_url: str, queue: str) -> Iterator[Client]:
    c = Client.from_url(redis_url, queue)
    yield c
    c.close()


def test_a_cross_encoder_scores_as_sentence_transformers_predicts(
    redis_url: str,
    queue: str,
    folder: str,
    engine: ScoringEngine,
    client: Client,
    predicted: Callable[[str, list[str]], list[float]],
) -> None:
    assert is_scoring_model(folder) and not is_scoring_model(str(folder) + "-none")
    with worker_thread(redis_url, queue, engine, served_model_name=NAME, max_wait_ms=0):
        got = client.score(QUERY, DOCS, model=NAME, timeout=60)
        long = client.score(QUERY, ["word " * 700], model=NAME, timeout=60)  # cut at 512
    want = predicted(QUERY, DOCS)
    assert max(abs(a - b) for a, b in zip(got, want, strict=True)) < 1e-5
    assert all(0 < s < 1 for s in got)  # one label: the sigmoid, as predict gives it
    assert abs(long[0] - predicted(QUERY, ["word " * 700])[0]) < 1e-5


def test_batched_scores_equal_each_pair_alone_and_a_repeat_is_computed_once(
    redis_url: str,
    queue: str,
    engine: ScoringEngine,
    client: Client,
    predicted: Callable[[str, list[str]], list[float]],
) -> None:
    texts = varied_prompts(24)
    texts[5] = texts[1]
    requests = [
        build_embedding(texts[i : i + 4], model=NAME, query=f"query {i // 8}")
        for i in range(0, 24, 4)
    ]
    ids = client.submit_requests(requests)
    with worker_thread(redis_url, queue, engine, served_model_name=NAME, max_wait_ms=50):
        results = client.results(ids, timeout=120)
    assert max(r.batch_size or 0 for r in results) > 1  # they shared a batch
    for request, result in zip(requests, results, strict=True):
        assert request.query is not None and request.input is not None
        alone = predicted(request.query, [str(t) for t in request.input])
        got = [v[0] for v in result.vectors()]
        assert max(abs(a - b) for a, b in zip(got, alone, strict=True)) < 1e-5
    assert results[1].usage.cached_tokens > 0  # texts[5] after texts[1], same query: once


def test_wrong_kinds_and_an_input_over_the_limit_fail_alone_with_clear_errors(
    redis_url: str, queue: str, engine: ScoringEngine, client: Client
) -> None:
    with pytest.raises(InvalidRequest, match="every input a text"):
        build_embedding([[1, 2, 3]], model=NAME, query=QUERY)
    with pytest.raises(InvalidRequest, match="normalize"):
        build_embedding(DOCS, model=NAME, query=QUERY, normalize=True)
    with worker_thread(redis_url, queue, engine, served_model_name=NAME, max_wait_ms=0):
        with pytest.raises(RequestFailed, match="cross-encoder"):
            client.embed(DOCS, model=NAME, timeout=60)  # no query: not an embedding model
        with pytest.raises(RequestFailed, match="input 1 has"):
            client.score(QUERY, ["short", "word " * 700], model=NAME, truncate="none", timeout=60)
        assert len(client.score(QUERY, DOCS, model=NAME, timeout=60)) == 3  # the rest go on


@pytest.fixture()
def gateway_on_reranker(
    queue: str, folder: str, openai_client: Any, start_worker: Callable[..., WorkerProcess]
) -> Any:
    start_worker(queue, "--model", folder, "--served-model-name", NAME)
    wait_until(lambda: [m.id for m in openai_client.models.list()] == [NAME], timeout_s=120)
    return openai_client


def test_rerank_and_score_on_a_cross_encoder_give_its_scores(
    gateway_on_reranker: Any, predicted: Callable[[str, list[str]], list[float]]
) -> None:
    import httpx
    import openai

    client = gateway_on_reranker
    base = str(client.base_url).rstrip("/").removesuffix("/v1")
    auth = {"Authorization": f"Bearer {client.api_key}"}

    def post(path: str, body: dict[str, Any]) -> httpx.Response:
        return httpx.post(base + path, json={"model": NAME, **body}, headers=auth, timeout=60)

    assert client.models.list().model_dump()["data"][0]["kind"] == "score"
    want = predicted(QUERY, DOCS)
    ranked = post("/v1/rerank", {"query": QUERY, "documents": DOCS}).json()
    order = sorted(range(3), key=lambda i: -want[i])
    assert [r["index"] for r in ranked["results"]] == order
    for r in ranked["results"]:
        assert abs(r["relevance_score"] - want[r["index"]]) < 1e-5
        assert r["document"] == {"text": DOCS[r["index"]]}
    pairwise = post("/v1/score", {"text_1": [QUERY, "a stadium"], "text_2": DOCS[:2]}).json()
    pair_want = [want[0], predicted("a stadium", DOCS[1:2])[0]]
    got = [d["score"] for d in pairwise["data"]]
    assert max(abs(a - b) for a, b in zip(got, pair_want, strict=True)) < 1e-5
    assert pairwise["usage"]["prompt_tokens"] > 0
    with pytest.raises(openai.BadRequestError, match="cross-encoder"):
        client.embeddings.create(model=NAME, input=DOCS)
    with pytest.raises(openai.BadRequestError, match="scores texts"):
        client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "hi"}])


def test_a_cross_encoder_on_vllm_is_refused_at_start_with_one_line(
    redis_url: str, queue: str, folder: str
) -> None:
    args = ("--queue", queue, "--model", folder, "--engine", "vllm")
    refused_at_start(redis_url, {args: "is a cross-encoder"})


def test_an_embedding_model_refuses_a_query_and_embeds_the_rest(
    redis_url: str, queue: str, client: Client
) -> None:
    from genq.worker.engines.embedding import EmbeddingEngine
    from genq.worker.engines.static import resolve_model

    embedder = EmbeddingEngine.load(resolve_model("all-minilm-l6-v2"))
    settings = {"served_model_name": "all-minilm-l6-v2", "max_wait_ms": 0}
    with worker_thread(redis_url, queue, embedder, **settings):
        with pytest.raises(RequestFailed, match="scores no query"):
            client.score(QUERY, DOCS, model="all-minilm-l6-v2", timeout=60)
        assert len(client.embed(DOCS, model="all-minilm-l6-v2", timeout=60).vectors) == 3
