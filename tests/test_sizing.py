"""Batch limits sized to the device (``auto``): the pure rule, the settings and flags that ask
for it, and what a worker and the continuous engine do with it. The GPU numbers the rule uses
were measured on an H100 (BENCHMARKS.md); here the rule runs on plain data."""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from genq.common.errors import ConfigError
from genq.common.settings import AUTO, WorkerSettings
from genq.worker.policy.sizing import (
    CPU_BATCH_SIZE,
    CPU_BATCH_TOKENS,
    GPU_BATCH_SIZE,
    PAGED_GPU_TOKENS,
    BatchLimits,
    DeviceMemory,
    batch_limits,
)

GIB = 1 << 30
#: random-250m in float32 on an H100, as measured: 77.8 GiB free after loading, 40 KiB of KV
#: cache per token, a 2,048-token context.
H100_250M = DeviceMemory(
    free_bytes=83_494_109_184, kv_bytes_per_token=40_960, max_context_tokens=2048
)


def test_auto_on_a_cpu_is_the_fixed_numbers_and_numbers_given_are_kept() -> None:
    auto = batch_limits(tokens=AUTO, size=AUTO, device=None)
    assert (auto.tokens, auto.size) == (CPU_BATCH_TOKENS, CPU_BATCH_SIZE) == (16_384, 32)
    assert "auto on a CPU" in auto.why
    given = batch_limits(tokens=999, size=7, device=None)
    assert (given.tokens, given.size, given.why) == (999, 7, "set: 7 requests, 999 tokens")
    assert batch_limits(tokens=999, size=AUTO, device=None).size == CPU_BATCH_SIZE


def test_auto_on_a_gpu_fills_the_free_memory_at_four_times_the_kv_bytes_per_token() -> None:
    limits = batch_limits(tokens=AUTO, size=AUTO, device=H100_250M)
    assert limits.size == GPU_BATCH_SIZE == 256
    # 0.9 x 77.8 GiB / (4 x 40 KiB) = 458,646 tokens: under 256 x 2,048 = 524,288.
    assert limits.tokens == int(83_494_109_184 * 0.9) // (4 * 40_960) == 458_646
    assert "77.8 GiB free" in limits.why and "capped" not in limits.why
    # The measured peak on that machine was at most 3.5x the KV bytes per token.
    assert limits.tokens * 3.5 * 40_960 < 83_494_109_184


def test_a_gpu_budget_is_capped_at_a_full_context_per_row_or_the_paged_cache_and_given_wins() -> (
    None
):
    roomy = DeviceMemory(free_bytes=1000 * GIB, kv_bytes_per_token=40_960, max_context_tokens=2048)
    capped = batch_limits(tokens=AUTO, size=AUTO, device=roomy)
    assert capped.tokens == 256 * 2048 and "capped at 524288: a full context per row" in capped.why
    assert batch_limits(tokens=AUTO, size=8, device=roomy).tokens == 8 * 2048
    given = batch_limits(tokens=5000, size=64, device=H100_250M)
    assert (given.tokens, given.size) == (5000, 64)
    paged = batch_limits(tokens=AUTO, size=AUTO, device=H100_250M, paged=True)
    assert paged.tokens == PAGED_GPU_TOKENS == 65_536 and "the paged cache's" in paged.why
    tiny_gpu = DeviceMemory(free_bytes=1 << 20, kv_bytes_per_token=1 << 20, max_context_tokens=8)
    assert batch_limits(tokens=AUTO, size=AUTO, device=tiny_gpu).tokens == 1  # never 0


def test_auto_is_the_default_and_the_word_auto_works_as_flag_and_variable() -> None:
    assert WorkerSettings.build({}, env={}).max_batch_tokens == AUTO
    env = {"GENQ_MAX_BATCH_TOKENS": "auto", "GENQ_MAX_BATCH_SIZE": "AUTO"}
    s = WorkerSettings.build({}, env=env)
    assert (s.max_batch_tokens, s.max_batch_size) == (AUTO, AUTO)
    with pytest.raises(ConfigError, match="--max-batch-size / GENQ_MAX_BATCH_SIZE"):
        WorkerSettings.build({}, env={"GENQ_MAX_BATCH_SIZE": "lots"})


def test_the_worker_flags_take_auto_or_a_number_and_say_so() -> None:
    from genq.worker.commands.worker import worker

    runner = CliRunner()
    shown = runner.invoke(worker, ["--help"], terminal_width=200).output
    assert "--max-batch-size AUTO|N" in shown and "256 on a GPU" in shown
    bad = runner.invoke(worker, ["--max-batch-size", "lots"])
    assert bad.exit_code == 2 and "neither 'auto' nor a whole number" in bad.output


def test_a_worker_built_on_auto_runs_with_the_numbers_its_engine_was_sized_to(
    redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    from genq.worker.engines.echo import EchoEngine
    from genq.worker.runtime.builder import build_worker

    settings = WorkerSettings.build({"redis_url": redis_url, "engine": "echo"}, env={})
    with caplog.at_level("INFO", logger="genq.worker"):
        plain = build_worker(settings, EchoEngine())
    assert (plain.settings.max_batch_tokens, plain.settings.max_batch_size) == (16_384, 32)
    assert plain.planner.budget.tokens == 16_384
    assert "batch limits: auto on a CPU: fixed: 32 requests, 16384 tokens" in caplog.text
    sized = EchoEngine()
    sized.limits = BatchLimits(tokens=123_456, size=200, why="as a GPU would")
    worker = build_worker(settings, sized)
    assert (worker.settings.max_batch_tokens, worker.settings.max_batch_size) == (123_456, 200)


def test_make_engine_sizes_a_cpu_worker_and_keeps_the_numbers_given() -> None:
    from genq.worker.engines import make_engine
    from genq.worker.engines.continuous import ContinuousEngine

    auto = make_engine(WorkerSettings.build({"engine": "static"}, env={}))
    assert auto.limits is not None and (auto.limits.tokens, auto.limits.size) == (16_384, 32)
    given = make_engine(WorkerSettings.build({"engine": "continuous", "max_batch_size": 4}, env={}))
    assert isinstance(given, ContinuousEngine)
    assert given.limits is not None and given.limits.size == given.max_batch_size == 4
    given.close()


def test_the_continuous_engine_on_a_gpu_overlaps_steps_and_captures_no_graphs() -> None:
    """The manager's configuration for a CUDA device, built (not run) on this CPU: what the H100
    measurements chose (BENCHMARKS.md); a CPU keeps transformers' own choices."""
    from genq.worker.engines.continuous import (
        GPU_STEP_MAX_TOKENS,
        STEP_MAX_TOKENS,
        ContinuousEngine,
    )
    from genq.worker.engines.static import load_model

    model, tokenizer = load_model("tiny")
    kw = {"max_batch_tokens": 100_000, "max_batch_size": 256}
    gpu = ContinuousEngine(model, tokenizer, device="cuda", **kw)._configs[0]
    assert (gpu.use_async_batching, gpu.use_cuda_graph) == (True, False)
    assert gpu.max_batch_tokens == GPU_STEP_MAX_TOKENS == 2048
    assert gpu.max_requests_per_batch == 256
    cpu = ContinuousEngine(model, tokenizer, device="cpu", **kw)._configs[0]
    assert (cpu.use_async_batching, cpu.use_cuda_graph) == (None, None)
    assert cpu.max_batch_tokens == STEP_MAX_TOKENS


def test_the_default_engine_is_the_faster_one_on_the_device() -> None:
    """auto: continuous on a CPU, static on a GPU (BENCHMARKS.md, the H100 section); an engine
    named is kept, and a worker's stats show the one it runs, never ``auto``."""
    assert WorkerSettings.build({}, env={}).engine == "continuous"
    assert WorkerSettings.build({"device": "cuda"}, env={}).engine == "static"
    assert WorkerSettings.build({}, env={"GENQ_DEVICE": "cuda:1"}).engine == "static"
    named = WorkerSettings.build({"device": "cuda", "engine": "continuous"}, env={})
    assert named.engine == "continuous"
    assert (
        WorkerSettings.build({"engine": "auto"}, env={"GENQ_ENGINE": "echo"}).engine == "continuous"
    )


def test_a_static_worker_reads_at_least_a_full_batch_per_stream() -> None:
    """With 256 a batch allowed and the look-ahead at 64, a static worker ran batches of 64 (four
    where one would do: 0.6x in-process on an H100); the look-ahead is now at least a batch."""
    from genq.worker.policy.lookahead import Lookahead

    big = WorkerSettings.build({"max_batch_size": 256}, env={})
    assert Lookahead.for_settings(big, ["s"]).room() == {"s": 256}
    small = WorkerSettings.build({"max_batch_size": 8}, env={})
    assert Lookahead.for_settings(small, ["s"]).room() == {"s": 64}


def test_a_caching_engine_keeps_room_for_prefixes_beyond_its_batch() -> None:
    from genq.worker.policy.sizing import PREFIX_ROOM_BUDGETS, kv_cache_tokens, prefix_room

    room = {"budget": 4096, "echo_cache_tokens": 10_240}
    assert prefix_room(3000, engine="vllm", on_gpu=True, **room) == 3000  # the setting wins
    assert prefix_room(None, engine="echo", on_gpu=False, **room) == 10_240
    assert prefix_room(None, engine="static", on_gpu=True, **room) == 0
    assert prefix_room(None, engine="vllm", on_gpu=True, **room) is None  # vLLM sizes it
    cpu = prefix_room(None, engine="vllm", on_gpu=False, **room)
    assert cpu == prefix_room(None, engine="continuous", on_gpu=True, **room)
    assert cpu == PREFIX_ROOM_BUDGETS * 4096 > 0
    assert kv_cache_tokens(budget=4096, size=8, block_tokens=128, room=1000) == 4096 + 1024 + 1000


def test_the_continuous_engines_pages_hold_the_batch_and_the_prefix_room() -> None:
    from genq.worker.engines import make_engine
    from genq.worker.engines.continuous import PAGE_SIZE, ContinuousEngine

    kw = {"engine": "continuous", "max_batch_tokens": 1000, "max_batch_size": 4}
    plain = make_engine(WorkerSettings.build(kw, env={}))
    room = make_engine(WorkerSettings.build({**kw, "prefix_cache_tokens": 320}, env={}))
    assert isinstance(plain, ContinuousEngine) and isinstance(room, ContinuousEngine)
    assert plain.prefix_room == 1000 and room.prefix_room == 320
    assert plain._configs[0].num_blocks == 63 + 4 + 63  # ceil(1000 / 16) + a page a request
    assert room._configs[0].num_blocks == 63 + 4 + 320 // PAGE_SIZE
