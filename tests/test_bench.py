"""`genq bench` runs every mode on one workload (a small one here: timings are not checked)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from genq.worker.bench.modes import make_workload, plan_budgeted
from genq.worker.engines.base import GenerationInput
from genq.worker.engines.echo import EchoEngine

pytestmark = pytest.mark.slow


def test_workload_is_seeded_and_within_the_stated_ranges() -> None:
    engine = EchoEngine()
    a = make_workload(engine, 64, seed=3)
    assert a == make_workload(engine, 64, seed=3)
    assert a != make_workload(engine, 64, seed=4)
    lengths = [len(engine.tokenize([w.prompt])[0]) for w in a]
    assert min(lengths) >= 1 and max(lengths) <= 400
    assert all(8 <= w.max_new_tokens <= 128 for w in a)


def test_budgeted_plan_covers_every_request_once_within_budget() -> None:
    rows = [GenerationInput(prompt_ids=[0] * (5 + 7 * i), max_new_tokens=10) for i in range(30)]
    plan = plan_budgeted(rows, max_batch_tokens=400, max_batch_size=8)
    assert sorted(i for b in plan for i in b) == list(range(30))
    for batch in plan:
        cost = sum(len(rows[i].prompt_ids) + rows[i].max_new_tokens for i in batch)
        assert len(batch) <= 8 and (cost <= 400 or len(batch) == 1)


def bench_json(*args: str, timeout_s: int = 600) -> dict[str, Any]:
    """``genq bench ARGS --json``, run as a user runs it; its report."""
    out = subprocess.run(
        [sys.executable, "-m", "genq.worker", "bench", *args, "--json"],
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    report: dict[str, Any] = json.loads(out.stdout)
    return report


def test_bench_reports_every_mode_in_one_run() -> None:
    report = bench_json("--requests", "8", "--repeats", "1", "--queue-engine", "continuous")
    modes = {m["mode"]: m for m in report["modes"]}
    assert set(modes) == {
        "one_at_a_time",
        "fifo_static",
        "budgeted_static",
        "continuous",
        "queue_continuous",
    }
    assert all(m["requests"] == 8 and m["tokens_per_s"] > 0 for m in modes.values())
    assert report["machine"]["transformers"]
    # Every mode timed as often as asked: the warm-up rounds are not among the runs.
    assert {m: len(r) for m, r in report["all_runs"].items()} == dict.fromkeys(modes, 1)


def test_bench_runs_the_modes_asked_and_gives_the_queue_ratio() -> None:
    """``--modes`` skips slow modes (one_at_a_time on a big GPU model); the limits the bench
    picked and each round's progress go to stderr; the queue's ratio to the best in-process
    mode is in the report."""
    command = [sys.executable, "-m", "genq.worker", "bench", "--requests", "8", "--repeats", "1"]
    out = subprocess.run(
        [*command, "--modes", "budgeted_static", "--queue-engine", "static", "--json"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout)
    modes = {m["mode"]: m["tokens_per_s"] for m in report["modes"]}
    assert set(modes) == {"budgeted_static", "queue_static"}
    assert report["queue_vs_best_in_process"] == modes["queue_static"] / modes["budgeted_static"]
    assert "batch limits: auto on a CPU: fixed: 32 requests, 16384 tokens" in out.stderr
    # The continuous engine's budget, as a worker's (on a GPU its paged cache is capped lower).
    assert "; continuous: 16384 tokens" in out.stderr
    assert report["max_batch_tokens"] == report["continuous_batch_tokens"] == 16384
    assert "round 1/1: queue_static" in out.stderr
    bad = subprocess.run([*command, "--modes", "fast"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "unknown mode(s) ['fast']" in bad.stderr


def test_bench_sweep_covers_both_modes_at_each_size() -> None:
    points = bench_json("--sweep", "--requests", "4")["sweep"]
    sizes = {p["max_batch_size"] for p in points}
    assert sizes == {1, 4, 8, 16, 32, 64}
    assert {p["mode"] for p in points} == {"budgeted_static", "continuous"}
    assert all(p["tokens_per_s"] > 0 for p in points)


def test_aging_scenario_high_waits_about_one_batch_under_a_low_backlog(redis_url: str) -> None:
    from genq.worker.bench.aging import aging_markdown, run_aging_scenario

    res = run_aging_scenario(
        redis_url,
        engine="static",
        backlog=120,
        arrivals=6,
        every_s=0.15,
        max_new_tokens=10,
        max_batch_size=8,
        queue="prio-test",
        extra_worker_args=("--engine", "echo", "--echo-step-ms", "10"),  # a batch: 100 ms
    )
    p = res["priorities"]
    assert all(d["requests"] == d["succeeded"] for d in p.values())
    # 120 low requests are 15 batches (1.5 s) deep; high ones wait about one batch.
    assert p["high"]["wait_p99_ms"] < 400
    assert p["low"]["wait_p50_ms"] > 3 * p["high"]["wait_p50_ms"]
    assert "| high | 6 | 6 |" in aging_markdown(res)


def test_the_queue_speed_script_runs_genq_alone_and_scaled() -> None:
    """benchmarks/queue_speed.py with genq only (the peers need a venv of their own)."""
    root = Path(__file__).resolve().parent.parent
    script = [str(root / "benchmarks" / "queue_speed.py"), "--jobs", "300", "--repeats", "1"]

    def run(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, *script, *args],
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        return done.stdout

    out = run("--systems", "genq")
    assert "| genq |" in out and "Versions: redis-server" in out
    out = run("--genq-workers", "1,2")
    assert "| 1 |" in out and "| 2 |" in out


def test_queue_speed_turns_runs_each_tree_of_genq_its_own(tmp_path: Path) -> None:
    """benchmarks/queue_speed_turns.py: a revision's three folders become a package of their
    own, which a process with it first on the path imports (not this checkout's), and a round
    of two trees gives one row each and the medians."""
    root = Path(__file__).resolve().parent.parent
    script = root / "benchmarks" / "queue_speed_turns.py"
    path = tmp_path / "head"
    probe = "import genq.worker.runtime.worker as w; print(w.__file__)"
    spec = importlib.util.spec_from_file_location("queue_speed_turns", script)
    assert spec is not None and spec.loader is not None
    turns = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(turns)
    turns.tree("HEAD", path)
    env = {**os.environ, "PYTHONPATH": str(path)}
    where = subprocess.run(
        [sys.executable, "-c", probe],
        env=env,
        cwd=path,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert where.startswith(str(path)), where
    done = subprocess.run(
        [
            sys.executable,
            str(script),
            "--revs",
            "HEAD,worktree",
            "--rounds",
            "1",
            "--jobs",
            "200",
            "--prompt-bytes",
            "100",
        ],
        capture_output=True,
        text=True,
        timeout=180,
        check=True,
    )
    assert "| 1 | HEAD |" in done.stdout and "| 1 | worktree |" in done.stdout
    assert "| median | worktree |" in done.stdout and "(1.00x)" in done.stdout
    assert "| CPU µs a job |" in done.stdout  # worker, Redis and client together
    assert "--jobs 200 --prompt-bytes 100`" in done.stdout  # each job's prompt 100 bytes more


def test_fleet_scenario_reports_makespan_shares_and_redis_cost() -> None:
    (burst,) = bench_json("--scenario", "fleet", "--quick", timeout_s=300)["scenarios"]
    assert burst["requests"] == sum(burst["shares"].values()) == 48
    assert len(burst["shares"]) == 3 and burst["ideal_makespan_s"] == 1.0
    assert burst["makespan_s"] > 0 and burst["redis_commands_per_request"] > 0


def test_the_dashboard_bench_can_tell_the_snapshot_script_in_redis_slowlog() -> None:
    from genq.common.lua.snapshot import SNAPSHOT
    from genq.worker.bench.dashboard import SCRIPT_MARK

    # The SLOWLOG keeps the first 128 characters of each argument.
    assert SCRIPT_MARK in SNAPSHOT[:128]


def test_dashboard_scenario_reads_the_busy_queue_it_built_and_times_redis_and_the_page() -> None:
    res = bench_json("--scenario", "dashboard", "--quick", timeout_s=300)
    assert res["waiting"] == 1000 and res["live_workers"] == 3 and res["tenants"] == 20
    assert res["script_calls_seen"] == res["reads"] == 20  # every read is one script call
    assert 0 < res["script_ms"]["p50"] <= res["client_read_ms"]["p50"]
    if Path("/usr/bin/chromium").exists():
        assert res["loads"] == 2 and res["render_ms"]["p50"] > 0


def test_tenants_scenario_serves_a_trickle_through_a_flood_unlike_first_come() -> None:
    rep = bench_json("--scenario", "tenants", "--quick", timeout_s=300)
    fair, fifo = rep["trickle_wait_ms"]["fair"], rep["trickle_wait_ms"]["fifo"]
    assert fair["p99"] < fifo["p99"], rep  # first come: the trickle waits for the flood
    assert rep["service_gap"]["fair"]["start"] < rep["service_gap"]["fifo"]["start"], rep
    # While both were backlogged (a backlog four times what the fleet reads ahead), weights
    # 3 : 1 (2.7-3.3 in the full run; quick's window is a few batches).
    assert set(rep["flood_makespan_s"]) == {"fair", "fifo"}
    assert rep["weights_ratio"]["backlogged"] > 2, rep["weights_ratio"]
    # A flood batch ran at least its simulated steps (the goal's "one batch time", as measured).
    assert rep["batch_run_ms"]["fair"] >= rep["batch_ms"], rep
    assert rep["weights_ratio"]["to_last_start"] > 0  # quick: too few rounds for 3:1 to show
    # Five weights, a worker killed: every tenant started work before the first one's last
    # start (quick's backlog is too short for the while-all-wait window to hold every tenant).
    five = rep["five_weights"]
    assert all(five[f"to_last_start:t{i}"] > 0 for i in range(1, 6)), five
    assert five["backlogged"] >= 0 and five["to_last_start"] >= 0


def test_the_service_gap_is_the_most_the_difference_moved_while_both_waited() -> None:
    from genq.common.models import Result, Timings, Usage
    from genq.worker.bench.tenants import _gap, _gap_as_produced

    def done(tenant: str, queued: int, started: int, prompt: int) -> Result:
        return Result(
            id=f"{tenant}-{started}",
            status="succeeded",
            tenant=tenant,
            usage=Usage(prompt_tokens=prompt),
            timings=Timings(queued_unix_ms=queued, started_unix_ms=started),
        )

    results = [
        done("heavy", 0, 5, 100),  # before light queued: not a choice made while both waited
        done("light", 10, 20, 10),
        done("heavy", 0, 30, 100),
        done("light", 10, 40, 10),
        done("light", 10, 50, 10),  # heavy's last start is at 60: the end
        done("heavy", 0, 60, 100),
        done("light", 10, 70, 10),
    ]
    started = lambda x: x.timings.started_unix_ms or 0  # noqa: E731
    # While both waited: -10, +90, +80, +70: the most it rose or fell over any stretch is 100.
    assert _gap(results, started) == 100
    # From the first submission: heavy's lead of 100 before light came, then up to 190.
    assert _gap(results, started, from_first=True) == 190

    # As produced: a request's generated tokens (x2) count evenly from its start to its finish.
    def ran(tenant: str, started: int, finished: int, prompt: int, generated: int) -> Result:
        return Result(
            id=f"{tenant}-{started}",
            status="succeeded",
            tenant=tenant,
            usage=Usage(prompt_tokens=prompt, completion_tokens=generated),
            timings=Timings(queued_unix_ms=0, started_unix_ms=started, finished_unix_ms=finished),
        )

    spread = [
        ran("heavy", 10, 30, 0, 10),  # +20, from 10 to 30
        ran("light", 20, 20, 10, 0),  # -10 at 20: heavy had +10 produced by then
        ran("heavy", 40, 40, 0, 0),  # heavy's last start: the end
        ran("light", 50, 50, 0, 0),
    ]
    assert _gap(spread, started) == 20  # at starts: +20 at once
    assert _gap_as_produced(spread) == 10  # +10, back to 0, up to +10 at 30


def test_the_ideal_central_queue_batches_the_oldest_on_the_fastest_free_server() -> None:
    from genq.worker.bench.fleet import _ideal_burst_makespan, ideal_central_queue

    assert ideal_central_queue([0.0, 0.1, 0.2, 1.0], [0.5], 2) == [0.0, 0.5, 0.5, 1.0]
    assert ideal_central_queue([0.0, 0.0], [1.0, 0.5], 1) == [0.0, 0.0]
    assert _ideal_burst_makespan(48, [0.5, 1.0], 8) == 2.0  # fast: 4 batches, slow: 2
    assert _ideal_burst_makespan(96, [0.5] * 3, 8) == 2.0


def test_vllm_bench_ratios_are_of_medians_and_of_each_pair() -> None:
    """The goal's ratio both ways: medians of each mode, and the median of run-by-run pairs
    (each queue run against the vLLM-alone run beside it)."""
    from genq.worker.bench.vllm_compare import median_run, ratios

    def mode(*tps: float) -> dict[str, object]:
        m: dict[str, object] = {"runs": [{"tokens_per_s": t} for t in tps]}
        m["median"] = median_run(m)
        return m

    result = {
        "modes": {
            "vllm_in_process": mode(100, 200, 100),
            "queue_vllm": mode(90, 210, 96),
            "queue_continuous": mode(30, 30, 30),
        }
    }
    got = ratios(result)
    assert got["queue_vllm / vllm_in_process"] == pytest.approx(96 / 100)
    assert got["queue_vllm / vllm_in_process, run by run"] == pytest.approx(0.96)  # 0.9, 1.05, 0.96
    assert got["queue_vllm / queue_continuous"] == pytest.approx(96 / 30)


def test_the_queue_modes_worker_gets_the_benchs_device_dtype_and_engine(redis_url: str) -> None:
    """A queue mode on --device cuda must measure a worker on the GPU, not on the CPU: the
    worker is started with the bench's own settings (here: a device that does not exist
    reaches the worker, which refuses it by name)."""
    from genq.worker.bench.modes import queue_worker_settings, run_through_queue
    from genq.worker.devtools.worker_process import worker_args

    settings = queue_worker_settings(
        model="tiny",
        engine="static",
        device="cuda:1",
        dtype="bfloat16",
        max_batch_tokens=512,
        max_batch_size=4,
    )
    args = worker_args(**settings)
    for flag, value in [("--device", "cuda:1"), ("--dtype", "bfloat16"), ("--engine", "static")]:
        assert args[args.index(flag) + 1] == value
    workload = make_workload(EchoEngine(), 2, seed=0)
    wrong = {**settings, "device": "no-such-device"}
    with pytest.raises(RuntimeError, match="device 'no-such-device' is not one of"):
        run_through_queue(workload, redis_url=redis_url, worker=wrong, queue="bench-device")


def test_the_structured_bench_measures_compiles_and_reports_ratios() -> None:
    from genq.worker.bench.structured import compile_costs, structured_markdown, workload

    costs = compile_costs("tiny", distinct=5)
    assert costs["first_schema_ms"] > costs["cache_hit_ms"] and costs["per_distinct_schema_ms"] > 0
    assert len(workload(10)) == 10
    runs = [
        {
            "engine": "static",
            "free": {"tokens_per_s": 100.0, "requests_per_s": 2.0},
            "schema": {"tokens_per_s": 90.0, "requests_per_s": 3.0},
            "ratio": 0.9,
        }
    ]
    text = structured_markdown(
        {"model": "tiny", "requests": 10, "repeats": 3, "engines": runs, "compile": costs}
    )
    assert "| static | 100.0 | 90.0 | 0.900 |" in text and "5 distinct schemas" in text


def test_prefix_scenario_runs_every_variant_both_ways_and_counts_cache_hits() -> None:
    report = bench_json("--scenario", "prefix", "--quick")
    assert set(report["runs"]) == {"uniform", "zipf", "no shared prefix"}
    for name, runs in report["runs"].items():
        assert sorted(r["aware"] for r in runs) == [False, True], name
        assert all(r["succeeded"] == r["requests"] == report["requests"] for r in runs), name
    shared = report["runs"]["uniform"]
    assert all(r["hit_rate"] > 0 for r in shared), "shared prefixes hit the simulated caches"
    assert all(r["hit_rate"] == 0 for r in report["runs"]["no shared prefix"])
    online = report["online"]
    assert sorted(r["aware"] for r in online) == [False, True]
    assert all(r["succeeded"] == r["requests"] == report["requests"] // 2 for r in online)
    assert all(r["wait_prefill_p50_ms"] >= 0 and r["hit_rate"] > 0 for r in online)


def test_shares_per_unit_of_weight_count_only_starts_in_the_stretch() -> None:
    from genq.common.models import Result, Timings, Usage
    from genq.worker.bench.tenant_weights import _per_weight

    def started(tenant: str, at: int, prompt: int) -> Result:
        return Result(
            id=f"{tenant}-{at}",
            status="succeeded",
            tenant=tenant,
            usage=Usage(prompt_tokens=prompt),
            timings=Timings(queued_unix_ms=0, started_unix_ms=at),
        )

    # Tokens in proportion to the weights 1, 1, 2, 4, 8, then a late start outside [10, 20].
    fair = [started(f"t{i}", 15, 10 * w) for i, w in enumerate((1, 1, 2, 4, 8), start=1)]
    out = _per_weight([*fair, started("t5", 25, 999)], 10, 20, "s")
    assert out["s"] == 0 and out["s:t5"] == 1.0
    skewed = _per_weight([*fair, started("t1", 12, 10)], 10, 20, "s")
    assert skewed["s:t1"] == round(20 / 12, 4) and skewed["s"] == round(20 / 12 - 1, 4)


def test_the_vllm_prefix_workload_shuffles_equally_popular_system_prompts() -> None:
    from genq.worker.bench.prefix_engine import SYSTEMS, shuffled_workload

    prompts = shuffled_workload(64)
    systems = [p.split("Question: ")[0] for p in prompts]
    assert len(set(systems)) == SYSTEMS and all(systems.count(x) == 8 for x in set(systems))
    assert not all(systems[i] == systems[i % SYSTEMS] for i in range(64))  # not in turn
    assert len(set(prompts)) == 64  # each with a question of its own


def test_flood_scenario_serves_every_chat_and_reports_connections_and_memory() -> None:
    res = bench_json("--scenario", "flood", "--quick", timeout_s=300)
    assert res["alice_served"] == res["waiting"] == 500
    assert res["bob_failed"] == 0 and res["bob_requests"] > 0
    # The connections the flood added: the shared pool, the readers, the rest; 0 when the pool
    # the idle gateway had already holds the flood (seen once, in CI; 1-3 in other runs).
    assert 0 <= res["redis_connections"] <= 64 + 2 + 4
    assert res["kb_per_waiting"] > 0 and res["health_max_ms"] > 0


def test_attacks_scenario_refuses_each_attack_clearly_and_serves_the_other_tenant() -> None:
    """Each attack by alice at a gateway's defaults: a 4xx (429 for the uploads: her
    quota of files) for what must be refused, bob's chats all served meanwhile, and Redis under
    its maxmemory."""
    res = bench_json("--scenario", "attacks", "--quick", timeout_s=300)
    rows = res["attacks"]
    refused = {
        "huge body": {"413"},
        "tool schemas": {"400"},
        "tool arguments": {"400"},
        "malformed": {"400"},
        "priority": {"403"},
    }
    for name, codes in refused.items():
        assert set(rows[name]["alice"]) == codes, (name, rows[name])
    assert "429" in rows["uploads until refused"]["alice"]  # the tenant's quota of files
    assert set(rows["junk batches"]["alice"]) == {"200"}  # accepted, and cheap (Redis peak)
    for name, row in rows.items():
        assert row["bob_sent"] > 0 and row["bob_served"] == row["bob_sent"], (name, row)
        assert row["redis_peak_mb"] < res["redis_limit_mb"], (name, row)


def test_batch_scenario_runs_files_in_waves_and_reports_its_goals() -> None:
    """``genq bench --scenario batch --quick``: each batch's output holds every custom_id once,
    the big one's Redis peak stays far under its plain requests' (its window bounds it), and
    its status read costs what the small one's does."""
    rep = bench_json("--scenario", "batch", "--quick", timeout_s=300)
    cases = rep["cases"]
    assert all(cases[c]["every_custom_id_once"] for c in ("small", "status_1000", "big"))
    assert cases["plain"]["succeeded"] == cases["big"]["lines"]
    assert cases["big"]["redis_peak_mb"] < cases["plain"]["redis_peak_mb"]
    assert set(rep["ratios"]) >= {"peak_big_over_small", "lines_per_s_batch_over_plain"}
    assert rep["ratios"]["status_idle_p50_big_over_1000"] < 5  # one hash either way
    # Three kills (-9) mid-feed: nothing lost, nothing twice, the counters equal the output.
    faults = rep["faults"]
    assert len(faults["kills"]) == 3 and faults["commands_ok"], faults
    assert faults["every_custom_id_once"] and faults["counters_equal_output"], faults
    assert faults["error_lines"] == 0
    # Another tenant's requests ran beside a batch, and beside a flood (their waits are the
    # bench's report).
    assert rep["online"]["beside_batch"]["requests"] > 0, rep["online"]
    assert rep["online"]["beside_flood"]["requests"] > 0, rep["online"]


def test_queue_speed_stages_says_where_each_tree_spends_its_time() -> None:
    """benchmarks/queue_speed_stages.py: a round of two trees gives, per job, Redis' time for
    the submission and the drain, the worker's loop and the steps it times, for each tree."""
    root = Path(__file__).resolve().parent.parent
    script = root / "benchmarks" / "queue_speed_stages.py"
    done = subprocess.run(
        [sys.executable, str(script), "--revs", "HEAD,worktree", "--rounds", "1", "--jobs", "300"],
        capture_output=True,
        text=True,
        timeout=180,
        check=True,
    )
    rows = {
        line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
        for line in done.stdout.splitlines()
        if line.startswith("| ") and not line.startswith("| what")
    }
    for what in ("redis_submit_scripts", "redis_drain_cpu", "loop", "Intake.admit"):
        head, worktree, _diff = rows[what]
        assert float(head) > 0 and float(worktree) > 0, (what, rows[what])


def _bench(name: str, *args: str) -> str:
    """What ``benchmarks/NAME ARGS`` printed (it must succeed within two minutes)."""
    script = Path(__file__).resolve().parent.parent / "benchmarks" / name
    command = [sys.executable, str(script), *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=True).stdout


def test_script_cost_gives_each_scripts_time_a_request() -> None:
    """benchmarks/script_cost.py: the submission, the read, the running mark and the final
    write of a few small batches, each a positive time a request in Redis (one JSON line of
    medians)."""
    out = _bench("script_cost.py", "--batch", "8", "--rounds", "5", "--json")
    medians = json.loads(out.strip().splitlines()[-1])
    assert set(medians) == {"submit", "pull", "running", "final"}
    assert all(v > 0 for v in medians.values()), medians


def test_script_turns_compares_a_revisions_scripts_with_the_checkouts() -> None:
    """benchmarks/script_turns.py: a revision's Lua and this checkout's, in turns on one
    redis-server: a row per script, each tree's time a request positive."""
    out = _bench("script_turns.py", "--rev", "HEAD", "--batch", "8", "--rounds", "6")
    rows = [line.split("|") for line in out.splitlines() if line.startswith("| ")]
    by_script = {row[1].strip(): row for row in rows[1:]}
    assert set(by_script) == {"submit", "pull", "running", "final"}, out
    assert all(float(row[2]) > 0 and float(row[3]) > 0 for row in by_script.values())


def test_embed_scenario_gives_encodes_vectors_every_rate_and_the_repeats_saved() -> None:
    res = bench_json("--scenario", "embed", "--quick", timeout_s=300)
    assert res["inputs"] == 1_000
    assert set(res["sides"]) == {"sentence-transformers", "genq", "genq, 40% repeats"}
    assert res["lowest_cosine"] >= 0.9999  # genq's vectors are encode's, input by input
    assert all(side["inputs_per_s"] > 0 for side in res["sides"].values())
    assert res["genq_over_alone"] > 0.3  # (a ratio, measured in BENCHMARKS.md; not timed here)
    sides = res["sides"]  # every repeat computed once, and nothing else saved
    assert (sides["genq"]["saved_inputs"], sides["genq, 40% repeats"]["saved_inputs"]) == (0, 400)


def test_embed_priority_scenario_measures_queries_beside_a_job_and_the_jobs_speed() -> None:
    res = bench_json("--scenario", "embed-priority", "--quick", timeout_s=300)
    assert res["inputs"] == 1_000 and res["queries"]["idle"]["queries"] == 40
    assert res["queries"]["beside the job"]["queries"] > 0
    assert res["p50_over_idle"] > 0 and res["job_beside_over_alone"] > 0


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed")
def test_embed_vllm_scenario_gives_vllms_own_vectors_through_the_queue() -> None:
    res = bench_json("--scenario", "embed-vllm", "--quick", timeout_s=600)
    assert res["inputs"] == 1_000 and set(res["inputs_per_s"]) == {"vllm", "genq"}
    assert res["lowest_cosine"] >= 0.9999  # the same vectors as vLLM alone
    assert all(rate > 0 for rate in res["inputs_per_s"].values())
    assert res["genq_over_alone"] > 0.3  # (a ratio, measured in BENCHMARKS.md; not timed here)
