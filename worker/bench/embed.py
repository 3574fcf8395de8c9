"""``genq bench --scenario embed``: embeddings through the queue against the engine alone.

The same inputs (mixed lengths: lognormal, 8-256 tokens, from a fixed seed) embedded by
sentence-transformers' ``encode`` in this process (its defaults: batches of 32, sorted by
length) and through genq: the client's ``embed_many`` (requests of 64 inputs, one round trip)
to one ``genq worker --model all-minilm-l6-v2`` process, on a private redis-server unless
``--redis-url``. A third side sends as many inputs of which 40% repeat others (``repeated``):
the worker computes each distinct one once, and the ratio of its inputs/s to genq's on the
distinct inputs is what the repeats saved. Rounds take turns (sentence-transformers first, then
genq first, ...) after an untimed warm-up; each of genq's rounds is another tenant's, so no round
finds the vectors of another (a worker's repeats meet within a tenant). Reported: inputs/s and
input tokens/s, medians, the genq ÷ alone and repeats ÷ genq ratios, the inputs the worker saved
in a round of each side, and the lowest cosine between two vectors of one input (genq's against
encode's, on both of genq's sides). ``--quick``: 1,000 inputs, one round.
"""

from __future__ import annotations

import math
import random
import statistics
import time
from collections.abc import Callable
from typing import Any

from genq.worker.devtools.worker_process import start_worker, stop_worker, wait_until_serving

MODEL = "all-minilm-l6-v2"
INPUTS = 20_000
QUICK_INPUTS = 1_000
_TEXT = (
    "the of and to in is was for on that with as by at from his it an were are which this be or "
    "has had not first one their its new after who they have her she two been other when there "
    "all during into school time may years more most only over city some world would where "
    "later up such used many can state about national out known university united then made "
    "well team people also under north river water light music house small power season history "
    "between system early series film government family group game area south long church "
    "number three around war life west public part work second found high name place several "
    "same before while each against through because since them party left these home "
)
WORDS = tuple(_TEXT.split())
REPEATED = 0.4
"""The share of the ``repeated`` side's inputs that repeat another of its inputs."""


def workload(n: int, seed: int = 0) -> list[str]:
    """``n`` texts whose lengths are lognormal (median ~40 words), 6-254 words: with the
    model's two special tokens and its one token a word, 8-256 tokens."""
    rng = random.Random(seed)
    texts = []
    for _ in range(n):
        words = min(254, max(6, round(rng.lognormvariate(math.log(40), 0.7))))
        texts.append(" ".join(rng.choices(WORDS, k=words)))
    return texts


def repeated(texts: list[str], share: float = REPEATED, seed: int = 1) -> list[str]:
    """As many inputs as ``texts``, ``share`` of them repeats of the first others (shuffled)."""
    rng = random.Random(seed)
    distinct = texts[: len(texts) - round(share * len(texts))]
    out = distinct + [rng.choice(distinct) for _ in range(len(texts) - len(distinct))]
    rng.shuffle(out)
    return out


def run_embed(url: str, *, n: int, repeats: int) -> dict[str, Any]:
    """Both sides ``repeats`` times, taking turns (see the module's docstring)."""
    import redis
    from genq.common.snapshot import collect
    from genq.producer import Client
    from genq.worker.engines.static import resolve_model
    from sentence_transformers import SentenceTransformer

    texts = workload(n)
    repeats_of = repeated(texts)
    folder = resolve_model(MODEL)
    alone = SentenceTransformer(folder, device="cpu")
    tokens = sum(len(ids) for ids in alone.tokenizer(texts)["input_ids"])
    tokens_repeated = sum(len(ids) for ids in alone.tokenizer(repeats_of)["input_ids"])
    queue, consumer = f"bench-embed-{time.time_ns()}", "embed-bench"
    proc = start_worker(redis_url=url, queue=queue, consumer=consumer, model=MODEL)
    client = Client.from_url(url, queue)
    r = redis.Redis.from_url(url)
    tenants = iter(f"bench-{i}" for i in range(10 * repeats + 10))

    def saved() -> int:
        return sum(int(w.get("saved_inputs", 0)) for w in collect(r, queue)["workers"])

    try:
        wait_until_serving(r, queue, consumer, proc)

        def genq(inputs: list[str]) -> Callable[[], list[list[float]]]:
            return lambda: client.embed_many(
                inputs, model=MODEL, per_request=64, timeout=3600, tenant=next(tenants)
            )

        def in_process() -> list[list[float]]:
            return alone.encode(texts, batch_size=32, show_progress_bar=False).tolist()  # type: ignore[no-any-return]

        sides = {"sentence-transformers": in_process, "genq": genq(texts)}
        sides["genq, 40% repeats"] = genq(repeats_of)
        client.embed_many(texts[:200], model=MODEL, timeout=600)  # warm-up, untimed
        alone.encode(texts[:200], show_progress_bar=False)
        seconds, vectors, saved_in = _take_turns(sides, repeats, saved)
    finally:
        client.close()
        stop_worker(proc)
    reference = dict(zip(texts, vectors["sentence-transformers"], strict=True))
    pairs = [
        *zip(vectors["genq"], vectors["sentence-transformers"], strict=True),
        *((v, reference[t]) for t, v in zip(repeats_of, vectors["genq, 40% repeats"], strict=True)),
    ]
    lowest = min(_cosine(a, b) for a, b in pairs)
    rows: dict[str, dict[str, Any]] = {
        name: {
            "median_s": statistics.median(s),
            "inputs_per_s": n / statistics.median(s),
            "tokens_per_s": (tokens_repeated if "repeats" in name else tokens)
            / statistics.median(s),
            "runs_s": [round(x, 2) for x in s],
            "saved_inputs": saved_in.get(name),
        }
        for name, s in seconds.items()
    }
    ratio = rows["genq"]["inputs_per_s"] / rows["sentence-transformers"]["inputs_per_s"]
    dedup = rows["genq, 40% repeats"]["inputs_per_s"] / rows["genq"]["inputs_per_s"]
    return {
        "inputs": n,
        "input_tokens": tokens,
        "repeats": repeats,
        "sides": rows,
        "genq_over_alone": ratio,
        "repeats_over_distinct": dedup,
        "lowest_cosine": lowest,
    }


def _take_turns(
    sides: dict[str, Callable[[], list[list[float]]]], repeats: int, saved: Callable[[], int]
) -> tuple[dict[str, list[float]], dict[str, list[list[float]]], dict[str, int]]:
    """Each side ``repeats`` times, in turns (the order reversed every other round): its
    seconds, its last vectors, and the inputs the worker saved in its last round."""
    seconds: dict[str, list[float]] = {name: [] for name in sides}
    vectors: dict[str, list[list[float]]] = {}
    saved_in: dict[str, int] = {}
    for i in range(repeats):
        for name in list(sides) if i % 2 == 0 else list(reversed(sides)):
            before = saved()
            t0 = time.perf_counter()
            vectors[name] = sides[name]()
            seconds[name].append(time.perf_counter() - t0)
            saved_in[name] = saved() - before
    return seconds, vectors, saved_in


def _cosine(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    return dot / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


def embed_markdown(res: dict[str, Any]) -> str:
    lines = [
        f"{res['inputs']} inputs, {res['input_tokens']} tokens, {MODEL}, "
        f"{res['repeats']} round(s) taking turns",
        "",
        "| side | median s | inputs/s | tokens/s | runs (s) | inputs saved in a round |",
        "|---|---|---|---|---|---|",
    ]
    for name, row in res["sides"].items():
        saved = "-" if row["saved_inputs"] is None else row["saved_inputs"]
        lines.append(
            f"| {name} | {row['median_s']:.2f} | {row['inputs_per_s']:.0f} | "
            f"{row['tokens_per_s']:.0f} | {row['runs_s']} | {saved} |"
        )
    lines += [
        "",
        f"genq ÷ sentence-transformers alone: {res['genq_over_alone']:.2f}x; 40% repeats ÷ "
        f"distinct inputs, through genq: {res['repeats_over_distinct']:.2f}x; lowest cosine "
        f"between two vectors of one input: {res['lowest_cosine']:.7f}",
    ]
    return "\n".join(lines)


def run_and_print(params: dict[str, Any]) -> None:
    """``genq bench --scenario embed`` with the command's parameters (``--quick``,
    ``--repeats``, ``--redis-url``, ``--json``)."""
    from genq.worker.bench.modes import report_on_redis

    quick = params["quick"]
    n, repeats = (QUICK_INPUTS, 1) if quick else (INPUTS, params["repeats"])
    report_on_redis(params, lambda url: run_embed(url, n=n, repeats=repeats), embed_markdown)
