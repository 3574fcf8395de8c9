"""The static engine on the real tiny model: batched output must equal each prompt alone."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from genq.worker.engines.base import GenerationInput
from genq.worker.engines.static import StaticEngine

from tests.conftest import varied_prompts


@pytest.fixture(scope="module")
def engine() -> StaticEngine:
    return StaticEngine.load("tiny")


def alone(engine: StaticEngine, row: GenerationInput) -> tuple[str, int, str]:
    out = engine.generate([row]).outputs[0]
    return out.text, out.completion_tokens, out.finish_reason


def test_batched_greedy_equals_each_prompt_alone(engine: StaticEngine) -> None:
    prompts = varied_prompts(12, seed=1)
    ids = engine.tokenize(prompts)
    rows = [GenerationInput(prompt_ids=p, max_new_tokens=4 + 9 * i) for i, p in enumerate(ids)]
    report = engine.generate(rows)
    batched = [(o.text, o.completion_tokens, o.finish_reason) for o in report.outputs]
    assert batched == [alone(engine, r) for r in rows]
    # The workload really exercises what it claims: different prompt lengths, rows ending at
    # their own limits, and at least one ending early on eos.
    assert len({len(p) for p in ids}) > 6
    assert any(o.finish_reason == "length" for o in report.outputs)
    early_eos = {
        o.completion_tokens
        for o, r in zip(report.outputs, rows, strict=True)
        if o.finish_reason == "stop" and o.completion_tokens < r.max_new_tokens
    }
    assert len(early_eos) >= 2


def test_no_row_gets_tokens_past_its_own_limit(engine: StaticEngine) -> None:
    ids = engine.tokenize(varied_prompts(6, seed=3))
    rows = [
        GenerationInput(prompt_ids=p, max_new_tokens=n)
        for p, n in zip(ids, [1, 2, 3, 50, 5, 8], strict=True)
    ]
    for row, out in zip(rows, engine.generate(rows).outputs, strict=True):
        assert out.completion_tokens <= row.max_new_tokens
        assert (
            len(engine.tokenizer(out.text, add_special_tokens=False)["input_ids"])
            <= row.max_new_tokens
        )


def test_stop_strings_end_their_own_row_only(engine: StaticEngine) -> None:
    ids = engine.tokenize(varied_prompts(4, seed=11))
    free = [GenerationInput(prompt_ids=p, max_new_tokens=40) for p in ids]
    texts = [o.text for o in engine.generate(free).outputs]
    # Stop row 0 on a character it really produces, mid-way.
    stop_char = texts[0][len(texts[0]) // 2]
    rows = [GenerationInput(prompt_ids=ids[0], max_new_tokens=40, stop=(stop_char,)), *free[1:]]
    outs = engine.generate(rows).outputs
    assert outs[0].text == texts[0][: texts[0].index(stop_char)]
    assert outs[0].finish_reason == "stop"
    assert [o.text for o in outs[1:]] == texts[1:]
    assert (outs[0].text, outs[0].completion_tokens) == alone(engine, rows[0])[:2]


def test_left_padding_is_what_makes_batches_correct(engine: StaticEngine) -> None:
    """Guard against a test that cannot fail: right padding really changes the output."""
    import torch

    short, long = engine.tokenize(["hi", "a much longer prompt than the other one"])
    width = len(long)
    ids = torch.full((2, width), engine.pad_token_id)
    mask = torch.zeros((2, width), dtype=torch.long)
    ids[0, : len(short)] = torch.tensor(short)  # right padding
    mask[0, : len(short)] = 1
    ids[1] = torch.tensor(long)
    mask[1] = 1
    out = engine.model.generate(
        input_ids=ids,
        attention_mask=mask,
        max_new_tokens=12,
        do_sample=False,
        pad_token_id=engine.pad_token_id,
    )
    right_padded = engine.tokenizer.decode(out[0, width:], skip_special_tokens=True)
    assert right_padded != alone(engine, GenerationInput(prompt_ids=short, max_new_tokens=12))[0]


def test_seeded_sampling_is_reproducible_whatever_the_batch(engine: StaticEngine) -> None:
    ids = engine.tokenize(varied_prompts(3, seed=5))
    sampled = GenerationInput(
        prompt_ids=ids[0], max_new_tokens=20, temperature=0.9, top_p=0.95, top_k=50, seed=42
    )
    other = GenerationInput(prompt_ids=ids[1], max_new_tokens=20)
    a = engine.generate([sampled]).outputs[0].text
    b = engine.generate([other, sampled]).outputs[1].text
    c = engine.generate([dataclasses.replace(sampled, seed=43)]).outputs[0].text
    greedy = alone(engine, GenerationInput(prompt_ids=ids[0], max_new_tokens=20))[0]
    assert a == b
    assert a != c or a != greedy


def test_greedy_rows_are_unaffected_by_sampled_batch_mates(engine: StaticEngine) -> None:
    ids = engine.tokenize(varied_prompts(2, seed=9))
    greedy = GenerationInput(prompt_ids=ids[0], max_new_tokens=16)
    sampled = GenerationInput(prompt_ids=ids[1], max_new_tokens=16, temperature=1.5, seed=1)
    assert engine.generate([greedy, sampled]).outputs[0].text == alone(engine, greedy)[0]


def test_batch_report_counts_padding(engine: StaticEngine) -> None:
    ids = engine.tokenize(["a", "a longer prompt here"])
    report = engine.generate([GenerationInput(prompt_ids=p, max_new_tokens=3) for p in ids])
    assert report.prompt_tokens == sum(len(p) for p in ids)
    assert report.padded_prompt_tokens == 2 * max(len(p) for p in ids)
    assert 0 < report.padding_fraction < 1


def test_the_gpu_bench_model_has_a_few_hundred_million_parameters() -> None:
    import torch
    from genq.worker.engines.builtin_models import BUILTIN_CONFIGS
    from transformers import LlamaConfig, LlamaForCausalLM

    with torch.device("meta"):  # shapes only: nothing is allocated or initialised
        model = LlamaForCausalLM(LlamaConfig(**BUILTIN_CONFIGS["random-250m"]))
        big = LlamaForCausalLM(LlamaConfig(**BUILTIN_CONFIGS["random-1b"]))
    params = sum(p.numel() for p in model.parameters())
    assert 200e6 < params < 400e6
    assert 0.95e9 < sum(p.numel() for p in big.parameters()) < 1.0e9  # Llama-3.2-1B's shape


def test_a_stream_sends_a_piece_at_its_first_token_even_with_no_text_yet() -> None:
    """The first token of a streamed row sends a piece, empty when it settles no text yet (half
    of a UTF-8 character here), as ``vllm serve`` streams it: a client timing its first chunk
    (``vllm bench serve``'s TTFT) sees the first token, not the first visible character. After
    it, only text is sent, and the pieces add up to the text."""
    from genq.worker.engines.base import TextStreamer

    texts = {(1,): "\ufffd", (1, 2): "é", (1, 2, 3): "é", (1, 2, 3, 4): "éa"}
    pieces: list[str] = []
    row = GenerationInput(prompt_ids=[9], max_new_tokens=8, on_text=pieces.append)
    streamer = TextStreamer(lambda tokens: texts[tuple(tokens)], eos_token_ids=[0], row=row)
    for n in range(1, 5):
        streamer.update([1, 2, 3, 4][:n])
    assert pieces == ["", "é", "a"]
    eos_first: list[str] = []
    row = GenerationInput(prompt_ids=[9], max_new_tokens=8, on_text=eos_first.append)
    TextStreamer(lambda tokens: "", eos_token_ids=[0], row=row).update([0])
    assert eos_first == []  # no token before the end: nothing streamed


def test_vllms_stream_sends_a_piece_at_its_first_output_even_with_no_text_yet() -> None:
    """The vLLM engine's side of the same rule (its outputs carry the text so far)."""
    from genq.worker.engines.vllm_engine import VllmEngine

    engine = VllmEngine.__new__(VllmEngine)  # _stream uses only the pieces sent so far
    engine._sent = {}
    pieces: list[str] = []
    row = GenerationInput(prompt_ids=[9], max_new_tokens=8, on_text=pieces.append)
    for text in ("", "", "Hi", "Hi", "Hi there"):
        engine._stream("k", row, text)
    assert pieces == ["", "Hi", " there"]


def test_a_batch_given_a_stop_ends_at_the_next_step_and_runs_again_to_the_same_text(
    engine: StaticEngine,
) -> None:
    """Preemption's engine half on the static engine: once ``stop`` is set the batch ends
    between two decode steps (``StoppedEarly``), and run again it gives what it gives alone."""
    import threading

    from genq.worker.engines.base import LogitAdjust, StoppedEarly

    a, b = engine.tokenize(varied_prompts(2, seed=41))
    rows = [
        GenerationInput(prompt_ids=a, max_new_tokens=200, temperature=0.7, seed=9),
        GenerationInput(prompt_ids=b, max_new_tokens=200, adjust=LogitAdjust(ignore_eos=True)),
    ]
    stop = threading.Event()
    steps: list[str] = []
    rows[1] = dataclasses.replace(rows[1], on_text=steps.append)
    timer = threading.Thread(target=_set_after, args=(stop, steps, 5))
    timer.start()
    with pytest.raises(StoppedEarly):
        engine.generate(rows, stop=stop)
    timer.join()
    assert 5 <= len(steps) < 200  # it ran a few steps, then stopped
    again = engine.generate(rows).outputs
    assert again == [engine.generate([r]).outputs[0] for r in rows]
    assert again[1].completion_tokens == 200
    stop.clear()
    assert engine.generate(rows, stop=stop).outputs == again  # never set: it runs to its end


def _set_after(stop: Any, steps: list[str], n: int) -> None:
    """Set ``stop`` once ``steps`` has ``n`` pieces (a stream's piece a decode step)."""
    import time

    deadline = time.monotonic() + 30
    while len(steps) < n and time.monotonic() < deadline:
        time.sleep(0.001)
    stop.set()


def test_an_echo_batch_given_a_stop_ends_when_it_is_set() -> None:
    import threading
    import time

    from genq.worker.engines.base import StoppedEarly
    from genq.worker.engines.echo import EchoEngine

    echo = EchoEngine(step_ms=10)
    row = GenerationInput(prompt_ids=list(b"hello"), max_new_tokens=500)  # 5 s of steps
    stop = threading.Event()
    threading.Timer(0.1, stop.set).start()
    t0 = time.monotonic()
    with pytest.raises(StoppedEarly):
        echo.generate([row], stop=stop)
    assert time.monotonic() - t0 < 2
