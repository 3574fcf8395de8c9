"""``genq bench --scenario priority``: the priority cases, preemption and time slices on and off,
taking turns, each on a fresh queue and worker (smollm2-135m unless ``--model``):

- **high behind low**: every place of a worker (8) taken by low requests of 200 new tokens
  (counting: they run to their limit), then 4 high ones of 8: the high ones' queue wait, and
  whether the low texts are the same either way (greedy or seeded: they must be); the low
  requests greedy, with ``ignore_eos``, and sampled (``LOW_KINDS``); continuous, static and vLLM;
- **low backlog**: 32 low requests of 64 new tokens and nothing else: requests/s, preemption on
  against off (nothing to preempt: the cost of looking);
- **long and shorts**: a request of 4,000 new tokens and 32 of 16 at the same priority, on 4
  places: the short ones' waits, the time slice (``--time-slice-ms``, its default) on against
  off (continuous). (With as many long requests as places, and no time slice, the short ones
  wait for a long one's whole generation: minutes on this model and CPU.)

``--no-preempt`` is today's behaviour (no preemption, no time slice). Each case runs two
rounds, the order of the modes swapped in the second; the tables show every run.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from genq.common.connection import connect
from genq.producer import Client
from genq.worker.bench.modes import percentile, report_on_redis
from genq.worker.devtools.worker_process import start_worker, wait_until_serving

COUNT = "Count from {n} to 5000, separated by commas: {n},"
"""smollm2-135m answers with numbers to its limit (no eos): every low request runs its length."""
SHORT = "Name a colour. {n}"
MODES = ("--preempt", "--no-preempt")


def _serve(
    url: str, queue: str, engine: str, model: str, slots: int, mode: str
) -> tuple[Any, Client]:
    """A fresh worker on ``queue`` in ``mode``, warmed up, and a client of it (a budget and a
    limit that let 4 requests of 4,000 new tokens run at once)."""
    consumer = f"{queue}-w"
    extra: tuple[str, ...] = (mode, "--max-new-tokens-limit", "4096", "--max-batch-tokens", "20000")
    extra += ("--vllm-args", '{"enforce_eager": true}') if engine == "vllm" else ()
    proc = start_worker(
        redis_url=url,
        queue=queue,
        model=model,
        engine=engine,
        consumer=consumer,
        max_batch_size=slots,
        max_wait_ms=0,
        extra_args=extra,
    )
    r = connect(url)
    try:
        wait_until_serving(r, queue, consumer, proc, timeout_s=600)
    finally:
        r.close()
    client = Client.from_url(url, queue)
    client.generate("warm up", max_new_tokens=2, timeout=300)
    return proc, client


def _stop(proc: Any, client: Client) -> None:
    client.close()
    proc.terminate()
    proc.wait(timeout=120)


def _running(client: Client, ids: list[str]) -> None:
    deadline = time.monotonic() + 300
    while True:
        states = [client.status(i) for i in ids]
        if all(s.status == "running" for s in states):
            return
        ended = [s for s in states if s.status not in ("queued", "running")]
        if ended:
            raise RuntimeError(f"a request ended before the case began: {ended[0]}")
        if time.monotonic() > deadline:
            raise RuntimeError("the requests did not all start within 300 s")
        time.sleep(0.02)


LOW_KINDS: dict[str, dict[str, Any]] = {
    "greedy": {},
    "ignore_eos": {"ignore_eos": True},
    "sampled": {"temperature": 0.7, "ignore_eos": True},
}
"""The low requests of ``high_behind_low``: greedy (on the continuous engine they run in its
manager), and with ``ignore_eos`` or sampled (temperature 0.7, seeded; they run apart there, as a
static group: ``engines/static_group.py``)."""


def high_behind_low(client: Client, slots: int, kind: str = "greedy") -> dict[str, Any]:
    """Low requests of 200 tokens (``LOW_KINDS[kind]``) in every place, then 4 high ones of 8."""
    lows = client.submit_many(
        [
            {
                "prompt": COUNT.format(n=i + 1),
                "max_new_tokens": 200,
                "priority": "low",
                "seed": i + 1,
                **LOW_KINDS[kind],
            }
            for i in range(slots)
        ]
    )
    _running(client, lows)
    highs = client.submit_many(
        [{"prompt": SHORT.format(n=i), "max_new_tokens": 8, "priority": "high"} for i in range(4)]
    )
    high = client.results(highs, timeout=1800)
    low = client.results(lows, timeout=1800)
    waits = [float(d.timings.queue_wait_ms or 0) for d in high]
    generation = [float(d.timings.generation_ms or 0) for d in low]
    return {
        "high_wait_p50_ms": percentile(waits, 0.5),
        "high_wait_max_ms": max(waits),
        "low_generation_p50_ms": percentile(generation, 0.5),
        "succeeded": sum(d.status == "succeeded" for d in [*high, *low]),
        "requests": len(high) + len(low),
        "low_texts": [d.text for d in low],
    }


def low_backlog(client: Client) -> dict[str, Any]:
    """32 low requests of 64 tokens: requests/s from the first submit to the last result."""
    t0 = time.perf_counter()
    ids = client.submit_many(
        [
            {"prompt": COUNT.format(n=i + 100), "max_new_tokens": 64, "priority": "low"}
            for i in range(32)
        ]
    )
    done = client.results(ids, timeout=1800)
    elapsed = time.perf_counter() - t0
    return {
        "requests_per_s": len(done) / elapsed,
        "succeeded": sum(d.status == "succeeded" for d in done),
    }


def long_and_shorts(client: Client, longs: int = 1) -> dict[str, Any]:
    """``longs`` requests of 4,000 tokens running, then 32 of 16 at the same priority: the
    short ones' waits (the long ones are cancelled once the short ones are done)."""
    ids = client.submit_many(
        [{"prompt": COUNT.format(n=i + 1), "max_new_tokens": 4000} for i in range(longs)]
    )
    _running(client, ids)
    shorts = client.submit_many(
        [{"prompt": SHORT.format(n=i), "max_new_tokens": 16} for i in range(32)]
    )
    done = client.results(shorts, timeout=1800)
    for i in ids:
        client.cancel(i)
    waits = [float(d.timings.queue_wait_ms or 0) for d in done]
    return {
        "short_wait_p50_ms": percentile(waits, 0.5),
        "short_wait_p99_ms": percentile(waits, 0.99),
        "succeeded": sum(d.status == "succeeded" for d in done),
    }


def _rounds(
    url: str,
    name: str,
    rounds: int,
    serve: Callable[[str, str], tuple[Any, Client]],
    run: Callable[[Client], dict[str, Any]],
) -> list[dict[str, Any]]:
    """``run`` in both modes, ``rounds`` times, the order swapped each round."""
    out = []
    for k in range(rounds):
        for mode in MODES if k % 2 == 0 else MODES[::-1]:
            proc, client = serve(f"{name}-{k}{mode}", mode)
            try:
                out.append({"round": k + 1, "mode": mode.strip("-"), **run(client)})
            finally:
                _stop(proc, client)
    return out


def run_scenario(
    url: str, *, model: str = "smollm2-135m", engines: tuple[str, ...], rounds: int = 2
) -> dict[str, Any]:
    """Every case, per engine; the low texts compared across modes."""
    res: dict[str, Any] = {"model": model, "rounds": rounds, "engines": {}}
    for engine in engines:

        def serve(queue: str, mode: str, slots: int = 8, e: str = engine) -> tuple[Any, Client]:
            return _serve(url, queue, e, model, slots, mode)

        cases: dict[str, Any] = {"low_texts_equal": {}}
        for kind in LOW_KINDS:

            def case(c: Client, k: str = kind) -> dict[str, Any]:
                return high_behind_low(c, 8, k)

            runs = _rounds(url, f"hbl-{kind}-{engine}", rounds, serve, case)
            cases[f"high_behind_{kind}"] = runs
            cases["low_texts_equal"][kind] = len({tuple(r.pop("low_texts")) for r in runs}) == 1
        cases["low_backlog"] = _rounds(url, f"lb-{engine}", rounds, serve, low_backlog)
        if engine == "continuous":
            cases["long_and_shorts_1"] = _rounds(
                url, f"ls1-{engine}", rounds, lambda q, m: serve(q, m, 4), long_and_shorts
            )
        res["engines"][engine] = cases
    return res


def _table(rows: list[dict[str, Any]], columns: dict[str, str]) -> list[str]:
    head = ["round", "mode", *columns.values()]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [str(r["round"]), r["mode"]]
        cells += [f"{r[k]:,.0f}" if "ms" in k else f"{r[k]:.2f}" for k in columns]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _ratio(rows: list[dict[str, Any]], key: str) -> float:
    on = sorted(r[key] for r in rows if r["mode"] == "preempt")
    off = sorted(r[key] for r in rows if r["mode"] == "no-preempt")
    return float(on[len(on) // 2] / off[len(off) // 2])


def priority_markdown(res: dict[str, Any]) -> str:
    """The scenario as BENCHMARKS.md tables, per engine and case."""
    lines = [f"Model {res['model']}, {res['rounds']} rounds, modes taking turns."]
    for engine, cases in res["engines"].items():
        for kind, equal in cases["low_texts_equal"].items():
            title = f"8 low requests ({kind}) of 200 tokens in every place, 4 high of 8"
            lines += ["", f"**{engine}: {title}**", ""]
            lines += _table(
                cases[f"high_behind_{kind}"],
                {
                    "high_wait_p50_ms": "high wait p50 ms",
                    "high_wait_max_ms": "high wait max ms",
                    "low_generation_p50_ms": "low generation p50 ms",
                },
            )
            lines += ["", f"Low texts the same in every run: {equal}."]
        lines += ["", f"**{engine}: a backlog of 32 low requests of 64 tokens (8 places)**", ""]
        lines += _table(cases["low_backlog"], {"requests_per_s": "requests/s"})
        ratio = _ratio(cases["low_backlog"], "requests_per_s")
        lines += ["", f"Preempt ÷ no-preempt, medians: **{ratio:.3f}x**."]
        rows = cases.get("long_and_shorts_1")
        if rows is not None:
            title = "1 of 4,000 tokens and 32 of 16 at one priority, 4 places"
            lines += ["", f"**{engine}: {title}**", ""]
            lines += _table(
                rows, {"short_wait_p50_ms": "short wait p50 ms", "short_wait_p99_ms": "p99 ms"}
            )
    return "\n".join(lines)


def run_and_print(params: dict[str, Any]) -> None:
    """``genq bench --scenario priority`` with the command's parameters: the continuous and
    static engines (``--engine vllm``: the vLLM engine as well)."""
    engines: tuple[str, ...] = ("continuous", "static")
    engines += ("vllm",) if params["bench_engine"] == "vllm" else ()
    model = "smollm2-135m" if params["model"] == "tiny" else str(params["model"])
    report_on_redis(
        params,
        lambda url: run_scenario(url, model=model, engines=engines),
        priority_markdown,
    )
