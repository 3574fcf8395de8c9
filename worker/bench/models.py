"""``genq bench --scenario models``: two models on one queue behind one gateway.

Workers of ``tiny`` (two of them) and ``smollm2-135m`` serve one queue; ``genq serve`` is in
front. First each distinct prompt runs alone on each model (one request at a time: the
reference texts). Then ``REQUESTS`` greedy requests, the two models mixed, half through the
Python client and half through the OpenAI SDK (a few threads), while one of the two ``tiny``
workers is killed (SIGKILL) mid-run. Reported: requests answered, answered by the wrong model
(the result's ``model``, and a worker of another model), texts that differ from their model's
text alone, what ``/v1/models`` lists, and the wall time.
"""

from __future__ import annotations

import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

MODELS = ("tiny", "smollm2-135m")
REQUESTS = 400
PROMPTS = 20
MAX_NEW_TOKENS = 12
SDK_THREADS = 8


def _prompts() -> list[str]:
    topics = ("rivers", "bread", "stars", "chess", "rain", "glass", "trains", "bees", "salt")
    return [
        f"Write one sentence about {topics[i % len(topics)]} number {i}." for i in range(PROMPTS)
    ]


def _workers(redis_url: str, queue: str) -> dict[str, Any]:
    from genq.worker.devtools.worker_process import start_worker

    spec = {"tiny-a": "tiny", "tiny-b": "tiny", "smollm2": "smollm2-135m"}
    args = ("--engine", "static", "--claim-idle-ms", "3000", "--max-new-tokens-limit", "64")
    return {
        name: start_worker(
            redis_url=redis_url, queue=queue, consumer=name, model=model, extra_args=args
        )
        for name, model in spec.items()
    }


def run_models(redis_url: str, queue: str = "bench-models") -> dict[str, Any]:
    """The run (see the module's docstring); the workers and gateway are stopped after."""
    import openai
    import redis
    from genq.producer import Client
    from genq.worker.devtools.gateway_process import GatewayProcess
    from genq.worker.devtools.worker_process import wait_until_serving

    r = redis.Redis.from_url(redis_url)
    procs = _workers(redis_url, queue)
    gateway = GatewayProcess(redis_url, queue, None)
    try:
        for name, proc in procs.items():
            wait_until_serving(r, queue, name, proc, timeout_s=600)
        sdk = openai.OpenAI(base_url=gateway.url, api_key="-", max_retries=0, timeout=600)
        listed = sorted(m.id for m in sdk.models.list())
        prompts = _prompts()
        with Client(r, queue) as client:
            alone = {
                (m, p): client.generate(p, model=m, max_new_tokens=MAX_NEW_TOKENS, timeout=300).text
                for m in MODELS
                for p in prompts
            }
            jobs = [(MODELS[i % 2], prompts[i % PROMPTS], i % 4 < 2) for i in range(REQUESTS)]
            t0 = time.perf_counter()
            killer = threading.Timer(2.0, procs["tiny-a"].send_signal, (signal.SIGKILL,))
            killer.start()
            answers = _run_mixed(client, sdk, jobs)
            wall = time.perf_counter() - t0
            killer.cancel()
    finally:
        gateway.stop()
        for proc in procs.values():
            proc.terminate()
        for proc in procs.values():
            proc.wait(timeout=120)
    wrong = sum(a["model"] != m or a["worker"] not in _served_by(m) for (m, _, _), a in answers)
    differ = sum(a["text"] != alone[(m, p)] for (m, p, _), a in answers)
    return {
        "requests": REQUESTS,
        "answered": sum(a["ok"] for _, a in answers),
        "wrong_model": wrong,
        "texts_differing_from_alone": differ,
        "models_listed": listed,
        "models_differ": sum(alone[(MODELS[0], p)] != alone[(MODELS[1], p)] for p in prompts),
        "wall_s": round(wall, 1),
        "killed": "tiny-a, SIGKILL, 2 s into the run",
    }


def _served_by(model: str) -> set[str | None]:
    """The workers of a model (None: an answer through the SDK, which names no worker)."""
    return {None, "tiny-a", "tiny-b"} if model == "tiny" else {None, "smollm2"}


def _run_mixed(client: Any, sdk: Any, jobs: list[tuple[str, str, bool]]) -> list[Any]:
    """Each job (model, prompt, through the client?): the client's all at once, the SDK's
    from a few threads; (job, answer) in the jobs' order."""
    mine = [j for j in jobs if j[2]]
    ids = client.submit_many(
        [{"prompt": p, "model": m} for m, p, _ in mine], max_new_tokens=MAX_NEW_TOKENS
    )

    def through_sdk(job: tuple[str, str, bool]) -> dict[str, Any]:
        c = sdk.completions.create(model=job[0], prompt=job[1], max_tokens=MAX_NEW_TOKENS)
        return {"ok": True, "model": c.model, "worker": None, "text": c.choices[0].text}

    with ThreadPoolExecutor(SDK_THREADS) as pool:
        sdk_answers = list(pool.map(through_sdk, [j for j in jobs if not j[2]]))
    results = client.results(ids, timeout=1800)
    by_client = iter(
        {"ok": x.status == "succeeded", "model": x.model, "worker": x.worker, "text": x.text}
        for x in results
    )
    by_sdk = iter(sdk_answers)
    return [(j, next(by_client) if j[2] else next(by_sdk)) for j in jobs]


def models_markdown(res: dict[str, Any]) -> str:
    """The BENCHMARKS.md lines."""
    return "\n".join(
        [
            f"Workers: 2 x `tiny` and 1 x `smollm2-135m` (static engine) on one queue, one "
            f"`genq serve`; {res['requests']} greedy requests of {MAX_NEW_TOKENS} new tokens, "
            f"the models alternating, half through the Python client and half through the "
            f"OpenAI SDK ({SDK_THREADS} threads); {res['killed']}.",
            "",
            "| answered | wrong model | texts unlike the model's alone | `/v1/models` | "
            "prompts where the two models differ | wall s |",
            "|---|---|---|---|---|---|",
            f"| {res['answered']} / {res['requests']} | {res['wrong_model']} | "
            f"{res['texts_differing_from_alone']} | {', '.join(res['models_listed'])} | "
            f"{res['models_differ']} / {PROMPTS} | {res['wall_s']:g} |",
        ]
    )


def run_and_print(params: dict[str, Any]) -> None:
    """``genq bench --scenario models`` with the command's parameters."""
    from genq.worker.bench.modes import report_on_redis

    report_on_redis(params, run_models, models_markdown)
