"""``genq bench --scenario prefix-vllm``: placement by prefix and the cache beyond the batch on
a real engine: one ``genq worker --engine vllm`` on smollm2-135m (vLLM's automatic
prefix caching; on a CPU, 128-token blocks).

- **Shared prefixes, shuffled**: ``SYSTEMS`` system prompts of ~``SYSTEM_TOKENS`` tokens, each
  request one of them (in a shuffled order) plus a short question, submitted at once. Three
  configurations, taking turns, each on a fresh worker and queue: the KV cache sized to the
  batch alone and no placement (``--prefix-cache-tokens 0 --no-prefix-aware``: genq before
  of placement), the default room for prefixes without placement (``--no-prefix-aware``), and both
  (the defaults). Reported: generated tokens/s over the makespan, and cached / prompt tokens.
- **Multi-turn chats through ``genq serve``**: ``SESSIONS`` conversations of ``TURNS`` turns
  each, a few at a time, through the OpenAI SDK (chat completions): each turn resends the
  history with the model's last answer and one more question. Reported: the share of prompt
  tokens the SDK's ``usage.prompt_tokens_details.cached_tokens`` says came from the cache, by
  turn, with the defaults.
"""

from __future__ import annotations

import random
import statistics
import threading
import time
from typing import Any

SYSTEMS = 8
SYSTEM_SENTENCES = 60  # ~1,000 tokens of smollm2's tokenizer
REQUESTS = 64
MAX_NEW_TOKENS = 16
BUDGET_TOKENS = 4096
BATCH_SIZE = 8
SESSIONS = 32
TURNS = 6
CONCURRENT_SESSIONS = 8
CONFIGS = {
    "batch-sized cache, no placement": ("--prefix-cache-tokens", "0", "--no-prefix-aware"),
    "prefix room, no placement": ("--no-prefix-aware",),
    "prefix room and placement (defaults)": (),
}
ENGINE_ARGS = '{"enforce_eager": true}'
TOPICS = ("astronomy", "cooking", "law", "music", "sailing", "chess", "gardening", "finance")


def system_prompt(topic: str, rng: random.Random) -> str:
    """A long, distinct system prompt about ``topic``."""
    facts = [
        f"Rule {i}: when asked about {topic}, mention fact number {rng.randint(1, 10_000)} "
        f"and keep the answer under {rng.randint(10, 90)} words."
        for i in range(SYSTEM_SENTENCES)
    ]
    return f"You are an expert on {topic}. " + " ".join(facts) + "\n\nQuestion: "


def shuffled_workload(n: int, seed: int = 5) -> list[str]:
    """``n`` prompts: a system prompt each (all ``SYSTEMS`` equally often, shuffled) and a
    question of its own."""
    rng = random.Random(seed)
    systems = [system_prompt(t, rng) for t in TOPICS[:SYSTEMS]]
    prompts = [f"{systems[i % SYSTEMS]}What is point {i} about? Answer:" for i in range(n)]
    rng.shuffle(prompts)
    return prompts


def _worker(redis_url: str, queue: str, extra: tuple[str, ...]) -> Any:
    from genq.worker.devtools.worker_process import start_worker

    return start_worker(
        redis_url=redis_url,
        queue=queue,
        consumer=f"{queue}-w",
        engine="vllm",
        model="smollm2-135m",
        max_batch_tokens=BUDGET_TOKENS,
        max_batch_size=BATCH_SIZE,
        extra_args=("--vllm-args", ENGINE_ARGS, *extra),
    )


def _stop(proc: Any) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=60)
    except Exception:
        proc.kill()
        proc.wait()


def run_shared(redis_url: str, queue: str, extra: tuple[str, ...]) -> dict[str, Any]:
    """One run of the shuffled shared-prefix workload on a fresh worker."""
    import redis
    from genq.producer import Client
    from genq.worker.devtools.worker_process import wait_until_serving

    r = redis.Redis.from_url(redis_url)
    proc = _worker(redis_url, queue, extra)
    try:
        wait_until_serving(r, queue, f"{queue}-w", proc, timeout_s=600)
        with Client(r, queue) as client:
            client.generate("Warm up.", max_new_tokens=2, timeout=300)
            t0 = time.perf_counter()
            ids = client.submit_many(shuffled_workload(REQUESTS), max_new_tokens=MAX_NEW_TOKENS)
            results = client.results(ids, timeout=1800)
            makespan = time.perf_counter() - t0
    finally:
        _stop(proc)
    prompt = sum(x.usage.prompt_tokens for x in results)
    cached = sum(x.usage.cached_tokens for x in results)
    generated = sum(x.usage.completion_tokens for x in results)
    return {
        "succeeded": sum(x.status == "succeeded" for x in results),
        "requests": len(results),
        "makespan_s": round(makespan, 2),
        "tokens_per_s": round(generated / makespan, 1),
        "hit_rate": round(cached / prompt, 4) if prompt else 0.0,
        "prompt_tokens": prompt,
    }


def run_chats(redis_url: str, queue: str) -> dict[str, Any]:
    """``SESSIONS`` chats of ``TURNS`` turns through ``genq serve`` and the OpenAI SDK."""
    import openai
    import redis
    from genq.worker.devtools.gateway_process import GatewayProcess
    from genq.worker.devtools.worker_process import wait_until_serving

    r = redis.Redis.from_url(redis_url)
    proc = _worker(redis_url, queue, ())
    gateway = None
    by_turn: dict[int, list[tuple[int, int]]] = {t: [] for t in range(TURNS)}
    failures: list[str] = []
    try:
        wait_until_serving(r, queue, f"{queue}-w", proc, timeout_s=600)
        gateway = GatewayProcess(redis_url, queue, None)
        sdk = openai.OpenAI(base_url=gateway.url, api_key="unused", timeout=600)
        rng = random.Random(9)
        systems = [system_prompt(t, rng)[:1500] for t in TOPICS]

        def chat(session: int) -> None:
            messages: list[Any] = [{"role": "system", "content": systems[session % len(systems)]}]
            for turn in range(TURNS):
                messages.append(
                    {"role": "user", "content": f"Session {session}, question {turn}: why?"}
                )
                try:
                    out = sdk.chat.completions.create(
                        model="smollm2-135m", messages=messages, max_tokens=MAX_NEW_TOKENS
                    )
                except openai.OpenAIError as err:
                    failures.append(f"{session}/{turn}: {err}")
                    return
                usage = out.usage
                details = usage.prompt_tokens_details if usage else None
                cached = (details.cached_tokens or 0) if details else 0
                by_turn[turn].append((usage.prompt_tokens if usage else 0, cached))
                messages.append(
                    {"role": "assistant", "content": out.choices[0].message.content or ""}
                )

        t0 = time.perf_counter()
        for first in range(0, SESSIONS, CONCURRENT_SESSIONS):
            threads = [
                threading.Thread(target=chat, args=(s,))
                for s in range(first, min(SESSIONS, first + CONCURRENT_SESSIONS))
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        wall = time.perf_counter() - t0
    finally:
        if gateway is not None:
            gateway.stop()
        _stop(proc)
    turns = {
        turn: round(sum(c for _, c in got) / max(1, sum(p for p, _ in got)), 4)
        for turn, got in by_turn.items()
    }
    later = [pc for t, got in by_turn.items() if t > 0 for pc in got]
    return {
        "requests": sum(len(v) for v in by_turn.values()),
        "failures": failures,
        "wall_s": round(wall, 1),
        "hit_rate_by_turn": turns,
        "hit_rate_after_first_turn": round(
            sum(c for _, c in later) / max(1, sum(p for p, _ in later)), 4
        ),
    }


def run_prefix_engine(redis_url: str, *, rounds: int) -> dict[str, Any]:
    """The shared-prefix runs (``rounds`` of each configuration, taking turns), then the
    chats."""
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in CONFIGS}
    names = list(CONFIGS)
    for k in range(rounds):
        for name in names[k % len(names) :] + names[: k % len(names)]:
            queue = f"bench-prefix-vllm-{k}-{names.index(name)}"
            runs[name].append(run_shared(redis_url, queue, CONFIGS[name]))
    return {"rounds": rounds, "runs": runs, "chats": run_chats(redis_url, "bench-prefix-chats")}


def prefix_engine_markdown(res: dict[str, Any]) -> str:
    """The BENCHMARKS.md tables."""
    lines = [
        f"One vLLM worker (smollm2-135m, budget {BUDGET_TOKENS} tokens, {BATCH_SIZE} slots); "
        f"{REQUESTS} requests at once, {SYSTEMS} system prompts of ~1,000 tokens shuffled, "
        f"{MAX_NEW_TOKENS} new tokens each; medians of {res['rounds']} rounds.",
        "",
        "| configuration | tokens/s | makespan s | cached / prompt tokens |",
        "|---|---|---|---|",
    ]
    for name, runs in res["runs"].items():
        med = {f: statistics.median(r[f] for r in runs) for f in runs[0] if f != "prompt_tokens"}
        lines.append(
            f"| {name} | {med['tokens_per_s']:.1f} | {med['makespan_s']:.1f} | "
            f"{med['hit_rate']:.1%} |"
        )
    chats = res["chats"]
    turns = ", ".join(f"{int(t) + 1}: {v:.0%}" for t, v in chats["hit_rate_by_turn"].items())
    lines += [
        "",
        f"Chats through `genq serve` ({SESSIONS} sessions x {TURNS} turns, "
        f"{CONCURRENT_SESSIONS} at a time, the OpenAI SDK): {chats['requests']} answered, "
        f"{len(chats['failures'])} failed, {chats['wall_s']:g} s; cached / prompt tokens as "
        f"the SDK saw them (`prompt_tokens_details.cached_tokens`), by turn: {turns}; after "
        f"the first turn: {chats['hit_rate_after_first_turn']:.1%}.",
    ]
    return "\n".join(lines)


def run_and_print(params: dict[str, Any]) -> None:
    """``genq bench --scenario prefix-vllm`` with the command's parameters."""
    from genq.worker.bench.modes import report_on_redis

    report_on_redis(
        params,
        lambda url: run_prefix_engine(url, rounds=1 if params["quick"] else 3),
        prefix_engine_markdown,
    )
