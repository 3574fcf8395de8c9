"""``genq bench --scenario structured``: what a ``response_format`` costs.

Through the queue, per engine (a ``genq worker`` process each: ``static``, ``continuous``, and
``vllm`` where it is installed): the same chat workload free and with one JSON schema, rounds
taking turns (free first, then schema first, ...) after an untimed warm-up of both; completion
tokens/s and requests/s, medians, and the schema ÷ free ratio. Then the grammar compile cost on
the transformers engines' cache (``engines/grammar.py``): the first schema on a fresh worker
(the tokenizer's tables included), a schema compiled again, and 100 distinct schemas.
"""

from __future__ import annotations

import importlib.util
import os
import statistics
import subprocess
import time
from typing import Any

from genq.worker.devtools.worker_process import start_worker, wait_until_serving, worker_args

PEOPLE = [
    ("Ann", 31, "Oslo"),
    ("Bruno", 45, "Lyon"),
    ("Chen", 27, "Taipei"),
    ("Dora", 62, "Porto"),
    ("Emeka", 38, "Lagos"),
    ("Fatima", 19, "Rabat"),
    ("Gus", 54, "Austin"),
    ("Hana", 23, "Kyoto"),
]
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 32},
        "age": {"type": "integer", "minimum": 0, "maximum": 130},
        "city": {"type": "string", "maxLength": 32},
    },
    "required": ["name", "age", "city"],
}
MAX_NEW_TOKENS = 48


def workload(n: int) -> list[dict[str, Any]]:
    """``n`` chat requests asking for a person's details as JSON (free text: no format)."""
    out = []
    for i in range(n):
        name, age, city = PEOPLE[i % len(PEOPLE)]
        text = (
            f"Record {i}: {name} is {age + i // len(PEOPLE)} years old and lives in {city}. "
            "Give the name, age and city as JSON."
        )
        out.append(
            {"messages": [{"role": "user", "content": text}], "max_new_tokens": MAX_NEW_TOKENS}
        )
    return out


def schema_format(schema: dict[str, Any] = SCHEMA) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "person", "schema": schema}}


def _round(client: Any, requests: list[dict[str, Any]]) -> dict[str, float]:
    t0 = time.perf_counter()
    results = client.results(client.submit_many(requests), timeout=3600)
    wall_s = time.perf_counter() - t0
    if any(r.status != "succeeded" for r in results):
        bad = next(r for r in results if r.status != "succeeded")
        raise RuntimeError(f"a bench request ended {bad.status}: {bad.error}")
    tokens = sum(r.usage.completion_tokens for r in results)
    return {"tokens_per_s": tokens / wall_s, "requests_per_s": len(results) / wall_s}


def run_engine(
    redis_url: str, engine: str, *, model: str, n: int, repeats: int, worker: dict[str, object]
) -> dict[str, Any]:
    """Free against schema rounds through one ``genq worker --engine ENGINE``."""
    from genq.common.connection import connect
    from genq.producer import Client

    r = connect(redis_url)
    queue, consumer = f"bench-structured-{engine}", f"bench-{engine}-{os.getpid()}"
    settings = {**worker, "model": model, "engine": engine}
    if engine == "vllm":
        settings["vllm_args"] = '{"enforce_eager": true}'
    proc = start_worker(
        log=subprocess.DEVNULL,
        extra_args=tuple(worker_args(**settings)),
        redis_url=redis_url,
        queue=queue,
        consumer=consumer,
    )
    free = workload(n)
    constrained = [{**w, "response_format": schema_format()} for w in free]
    rounds: dict[str, list[dict[str, float]]] = {"free": [], "schema": []}
    try:
        wait_until_serving(r, queue, consumer, proc, timeout_s=600)
        client = Client(r, queue)
        _round(client, free[:8] + constrained[:8])  # untimed: warm-up, the schema compiled
        for i in range(repeats):
            order = ["free", "schema"] if i % 2 == 0 else ["schema", "free"]
            for kind in order:
                rounds[kind].append(_round(client, free if kind == "free" else constrained))
    finally:
        proc.terminate()
        proc.wait(timeout=120)
        r.close()
    out: dict[str, Any] = {"engine": engine}
    for kind, runs in rounds.items():
        out[kind] = {k: statistics.median(x[k] for x in runs) for k in runs[0]}
    out["ratio"] = out["schema"]["tokens_per_s"] / out["free"]["tokens_per_s"]
    return out


def compile_costs(model: str, distinct: int = 100) -> dict[str, float]:
    """Milliseconds to compile: the first schema on a fresh cache (the tokenizer's tables
    built too), the same schema again (a cache hit), and each of ``distinct`` more schemas."""
    from genq.common.formats import ResponseFormat
    from genq.worker.engines.grammar import GrammarCache
    from genq.worker.engines.static import load_model

    mdl, tokenizer = load_model(model)
    cache = GrammarCache(tokenizer, vocab_size=int(mdl.config.vocab_size), stop_token_ids=[0])
    fmt = ResponseFormat.model_validate(schema_format())
    t0 = time.perf_counter()
    cache.constraint(fmt)
    first_ms = (time.perf_counter() - t0) * 1000
    again = ResponseFormat.model_validate(schema_format())  # an equal format, a new object
    t0 = time.perf_counter()
    cache.constraint(again)
    hit_ms = (time.perf_counter() - t0) * 1000
    formats = [
        ResponseFormat.model_validate(
            schema_format(
                {
                    **SCHEMA,
                    "properties": {**SCHEMA["properties"], f"field_{i}": {"type": "boolean"}},
                }
            )
        )
        for i in range(distinct)
    ]
    t0 = time.perf_counter()
    for f in formats:
        cache.constraint(f)
    each_ms = (time.perf_counter() - t0) * 1000 / distinct
    return {
        "first_schema_ms": first_ms,
        "cache_hit_ms": hit_ms,
        "distinct_schemas": distinct,
        "per_distinct_schema_ms": each_ms,
        "cache_mib": cache.bytes / 2**20,
    }


def run_structured(
    redis_url: str, *, model: str, n: int, repeats: int, worker: dict[str, object]
) -> dict[str, Any]:
    """Every engine's rounds, then the compile costs."""
    engines = ["static", "continuous"]
    if importlib.util.find_spec("vllm") is not None:
        engines.append("vllm")
    runs = [
        run_engine(redis_url, e, model=model, n=n, repeats=repeats, worker=worker) for e in engines
    ]
    return {
        "model": model,
        "requests": n,
        "repeats": repeats,
        "engines": runs,
        "compile": compile_costs(model),
    }


def structured_markdown(res: dict[str, Any]) -> str:
    lines = [
        f"{res['requests']} chat requests (max_new_tokens {MAX_NEW_TOKENS}) on {res['model']}, "
        f"free and with one JSON schema, through the queue; medians of {res['repeats']} rounds "
        "each, taking turns.",
        "",
        "| engine | free tokens/s | schema tokens/s | schema ÷ free | free req/s | schema req/s |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for e in res["engines"]:
        f, s = e["free"], e["schema"]
        lines.append(
            f"| {e['engine']} | {f['tokens_per_s']:.1f} | {s['tokens_per_s']:.1f} | "
            f"{e['ratio']:.3f} | {f['requests_per_s']:.2f} | {s['requests_per_s']:.2f} |"
        )
    c = res["compile"]
    lines += [
        "",
        f"Compile (xgrammar, this model's vocabulary): first schema {c['first_schema_ms']:.0f} ms "
        f"(tokenizer tables included), a cached one {c['cache_hit_ms']:.3f} ms, "
        f"{c['distinct_schemas']} distinct schemas {c['per_distinct_schema_ms']:.1f} ms each "
        f"({c['cache_mib']:.0f} MiB cached).",
    ]
    return "\n".join(lines)


def run_and_print(params: dict[str, Any]) -> None:
    """``genq bench --scenario structured`` with the command's parameters: on a private
    redis-server unless ``--redis-url``; markdown, or JSON with ``--json``."""
    from genq.worker.bench.modes import report_on_redis

    worker = {k: params[k] for k in ("device", "dtype", "max_batch_tokens", "max_batch_size")} | {
        "max_wait_ms": 0
    }

    def run(url: str) -> dict[str, Any]:
        return run_structured(
            url,
            model=params["model"],
            n=params["n_requests"],
            repeats=params["repeats"],
            worker=worker,
        )

    report_on_redis(params, run, structured_markdown)
