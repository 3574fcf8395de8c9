"""``genq bench --scenario embed-vllm``: vLLM's pooling runner through the queue against vLLM
alone, on the ``embed`` scenario's inputs (lognormal lengths, 8-256 tokens) and the built-in
all-MiniLM-L6-v2.

- **vLLM alone**: ``LLM.embed`` over every input at once, in a process of its own (vLLM binds
  OpenMP threads for the whole process it runs in), with the engine settings a genq worker
  gives it (``runner="pooling"``, float32, the embedding budget: 4,096 tokens and 256 inputs a
  step, ``--vllm-args``);
- **genq**: the client's ``embed_many`` (requests of 64 inputs, one round trip) to one
  ``genq worker --engine vllm`` process, on a private redis-server unless ``--redis-url``.

Both are loaded and warmed up before any timed run; the rounds take turns (vLLM first, then
genq first, ...). Each genq round is another tenant's, so no round reuses another's vectors.
Reported: inputs/s of each (medians), genq ÷ alone (the goal: >= 0.95x), each side's start-up
seconds, and the lowest cosine between the two sides' vectors of one input (the first
``CHECKED`` inputs). ``--quick``: 1,000 inputs, one round.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from typing import Any

from genq.worker.bench.embed import INPUTS, MODEL, QUICK_INPUTS, workload
from genq.worker.bench.embed_peer import cosine
from genq.worker.bench.vllm_compare import RESULT_PREFIX, InProcess
from genq.worker.devtools.worker_process import start_worker, stop_worker, wait_until_serving

CHECKED = 200
"""Inputs whose vectors vLLM alone hands back for the cosine check (all would be ~150 MB)."""
PER_REQUEST = 64


def alone_child(spec: dict[str, Any]) -> None:
    """(In a child process.) vLLM's ``LLM`` on the model with a worker's settings, warmed up;
    then one timed ``LLM.embed`` of every text per ``run`` line on stdin."""
    from genq.worker.engines.embedding import BATCH_SIZE, BATCH_TOKENS, read_layout
    from genq.worker.engines.static import resolve_model
    from genq.worker.engines.vllm_args import set_vllm_environment
    from genq.worker.engines.vllm_embedding import KV_CACHE_BYTES
    from transformers import AutoConfig

    set_vllm_environment("cpu")
    from vllm import LLM

    path = resolve_model(MODEL)
    layout = read_layout(path, AutoConfig.from_pretrained(path))
    t0 = time.perf_counter()
    llm = LLM(
        model=path,
        runner="pooling",
        dtype="float32",
        max_model_len=layout.max_tokens,
        max_num_seqs=BATCH_SIZE,
        max_num_batched_tokens=max(BATCH_TOKENS, layout.max_tokens),
        seed=0,
        disable_log_stats=True,
        **{"kv_cache_memory_bytes": KV_CACHE_BYTES, **spec["vllm_args"]},
    )
    texts: list[str] = spec["texts"]
    llm.embed(texts[:64], use_tqdm=False)  # warm-up, untimed
    print(RESULT_PREFIX + json.dumps({"start_s": time.perf_counter() - t0}), flush=True)
    for line in sys.stdin:
        if line.strip() != "run":
            break
        t0 = time.perf_counter()
        outs = llm.embed(texts, use_tqdm=False)
        seconds = time.perf_counter() - t0
        checked = [o.outputs.embedding for o in outs[:CHECKED]]
        print(RESULT_PREFIX + json.dumps({"seconds": seconds, "vectors": checked}), flush=True)


def run_embed_vllm(url: str, *, n: int, repeats: int, vllm_args: dict[str, Any]) -> dict[str, Any]:
    """Both sides ``repeats`` times, taking turns (see the module's docstring)."""
    import redis
    from genq.producer import Client

    texts = workload(n)
    queue, consumer = f"bench-embed-vllm-{time.time_ns()}", "embed-vllm"
    t0 = time.perf_counter()
    proc = start_worker(
        redis_url=url,
        queue=queue,
        consumer=consumer,
        model=MODEL,
        engine="vllm",
        vllm_args=json.dumps(vllm_args),
    )
    alone = InProcess({"texts": texts, "vllm_args": vllm_args}, module=__name__)
    client = Client.from_url(url, queue)
    rates: dict[str, list[float]] = {"vllm": [], "genq": []}
    vectors: dict[str, list[list[float]]] = {}
    try:
        wait_until_serving(redis.Redis.from_url(url), queue, consumer, proc, timeout_s=600)
        genq_start_s = time.perf_counter() - t0
        client.embed_many(texts[:64], model=MODEL, tenant="warm-up", timeout=600)
        for i in range(repeats):
            for side in ("vllm", "genq") if i % 2 == 0 else ("genq", "vllm"):
                if side == "vllm":
                    alone.run()
                    run = alone.mode["runs"][-1]
                    rates[side].append(n / run["seconds"])
                    vectors[side] = run["vectors"]
                    continue
                t1 = time.perf_counter()
                got = client.embed_many(
                    texts, model=MODEL, per_request=PER_REQUEST, tenant=f"r{i}", timeout=3600
                )
                rates[side].append(n / (time.perf_counter() - t1))
                vectors[side] = got[:CHECKED]
    finally:
        client.close()
        alone.close()
        stop_worker(proc)
    medians = {side: statistics.median(r) for side, r in rates.items()}
    return {
        "inputs": n,
        "repeats": repeats,
        "per_request": PER_REQUEST,
        "vllm_args": vllm_args,
        "inputs_per_s": medians,
        "runs_inputs_per_s": {side: [round(x) for x in r] for side, r in rates.items()},
        "genq_over_alone": medians["genq"] / medians["vllm"],
        "start_s": {"vllm": alone.mode["start_s"], "genq": genq_start_s},
        "lowest_cosine": min(
            cosine(a, b) for a, b in zip(vectors["genq"], vectors["vllm"], strict=True)
        ),
    }


def embed_vllm_markdown(res: dict[str, Any]) -> str:
    rates, runs, start = res["inputs_per_s"], res["runs_inputs_per_s"], res["start_s"]
    return "\n".join(
        [
            f"{res['inputs']} inputs (8-256 tokens, lognormal), {res['repeats']} round(s) taking "
            f"turns; genq: embed_many in requests of {res['per_request']}; --vllm-args "
            f"{json.dumps(res['vllm_args'])}",
            "",
            "| side | inputs/s | runs | start-up s |",
            "|---|---|---|---|",
            f"| vLLM alone (LLM.embed) | {rates['vllm']:.0f} | {runs['vllm']} | "
            f"{start['vllm']:.1f} |",
            f"| genq, --engine vllm | {rates['genq']:.0f} | {runs['genq']} | {start['genq']:.1f} |",
            "",
            f"genq ÷ vLLM alone: {res['genq_over_alone']:.2f}x; lowest cosine between the two "
            f"sides' vectors of one input (first {CHECKED}): {res['lowest_cosine']:.7f}",
        ]
    )


def run_and_print(params: dict[str, Any]) -> None:
    """``genq bench --scenario embed-vllm`` with the command's parameters (``--quick``,
    ``--repeats``, ``--vllm-args``, ``--redis-url``, ``--json``)."""
    from genq.common.settings import WorkerSettings
    from genq.worker.bench.modes import report_on_redis

    n, repeats = (QUICK_INPUTS, 1) if params["quick"] else (INPUTS, params["repeats"])
    args = WorkerSettings.build({"vllm_args": params["vllm_args"]}, env={}).vllm_engine_args
    report_on_redis(
        params,
        lambda url: run_embed_vllm(url, n=n, repeats=repeats, vllm_args=dict(args)),
        embed_vllm_markdown,
    )


if __name__ == "__main__":
    alone_child(json.loads(sys.stdin.readline()))
