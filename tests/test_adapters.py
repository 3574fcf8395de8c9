"""LoRA adapters per request: ``genq worker --lora NAME=PATH`` serves each adapter
as a model of its own; one batch holds rows of different adapters and of the base model, each
equal to its text alone; ``--max-loras`` bounds what is resident, the rest loading on demand.
Adapters are built offline on the tiny model (PEFT, random non-zero weights)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis
from genq.common.errors import ConfigError
from genq.common.keys import Keys
from genq.common.settings import WorkerSettings
from genq.producer import Client

from tests.conftest import WorkerProcess, genq, wait_until


@pytest.fixture(scope="module")
def adapters(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Three adapters of the tiny model, different seeds: name -> directory."""
    from genq.worker.engines.lora_builder import build_tiny_adapter

    root = tmp_path_factory.mktemp("adapters")
    return {f"a{s}": str(build_tiny_adapter(root / f"a{s}", seed=s)) for s in (1, 2, 3)}


def _engine(adapters: dict[str, str], max_loras: int = 0) -> object:
    from genq.worker.engines.adapters import Adapters
    from genq.worker.engines.static import StaticEngine, load_model

    model, tokenizer = load_model("tiny")
    loaded = Adapters(model, adapters, max_loras=max_loras, base_names=["tiny"])
    return StaticEngine(model, tokenizer, "cpu", loaded)


def test_one_batch_of_mixed_adapters_equals_each_row_alone_and_adapters_differ(
    adapters: dict[str, str],
) -> None:
    from genq.worker.engines.base import GenerationInput
    from genq.worker.engines.static import StaticEngine

    engine = _engine(adapters)
    assert isinstance(engine, StaticEngine)
    prompts = engine.tokenize(["Once upon a time", "Hello", "The queue"])
    names = [None, "a1", "a2", "a3", "a1", None, "tiny", "a2"]  # "tiny": the base's own name
    rows = [
        GenerationInput(prompt_ids=prompts[i % 3], max_new_tokens=10, adapter=a)
        for i, a in enumerate(names)
    ]
    batched = [o.text for o in engine.generate(rows).outputs]
    alone = [engine.generate([r]).outputs[0].text for r in rows]
    assert batched == alone
    same_prompt = [
        engine.generate([GenerationInput(prompt_ids=prompts[0], max_new_tokens=10, adapter=a)])
        for a in (None, "a1", "a2", "a3")
    ]
    assert len({r.outputs[0].text for r in same_prompt}) == 4  # each adapter changes the text


def test_per_row_lora_computes_what_peft_computes_and_refuses_what_it_does_not_run(
    adapters: dict[str, str], tmp_path: Path
) -> None:
    import torch
    from genq.worker.engines.adapters import Adapters
    from genq.worker.engines.base import GenerationInput
    from genq.worker.engines.static import load_model
    from peft import PeftModel

    ids = torch.tensor([[1, 5, 9, 14, 3, 7]])
    model, _ = load_model("tiny")
    with torch.inference_mode():
        base_logits = model(ids.repeat(2, 1)).logits  # (batched as below: the same sums)
    peft = PeftModel.from_pretrained(model, adapters["a2"], adapter_name="a2").eval()
    with torch.inference_mode():
        want = peft(ids).logits
    plain, _ = load_model("tiny")
    ours = Adapters(plain, adapters, max_loras=3, base_names=["tiny"])
    rows = [GenerationInput(prompt_ids=[], max_new_tokens=1, adapter=a) for a in ("a2", None)]
    with torch.inference_mode(), ours.rows(rows, "cpu"):
        got = ours.model(ids.repeat(2, 1)).logits
    assert not torch.allclose(want[0], base_logits[0], atol=1e-3), "the adapter changes them"
    torch.testing.assert_close(got[0], want[0], atol=1e-4, rtol=1e-4)
    assert torch.equal(got[1], base_logits[1]), "a base row adds exactly nothing"
    config = json.loads((Path(adapters["a1"]) / "adapter_config.json").read_text())
    for field, value in {"use_dora": True, "modules_to_save": ["lm_head"]}.items():
        odd = tmp_path / field
        odd.mkdir()
        (odd / "adapter_config.json").write_text(json.dumps({**config, field: value}))
        weights = Path(adapters["a1"]) / "adapter_model.safetensors"
        (odd / "adapter_model.safetensors").write_bytes(weights.read_bytes())
        fresh, _ = load_model("tiny")
        with pytest.raises(ConfigError, match=f"{field}.*unsupported"):
            Adapters(fresh, {"odd": str(odd)}, max_loras=1, base_names=["tiny"])


def test_past_max_loras_adapters_swap_least_recently_used_and_outputs_do_not_change(
    adapters: dict[str, str],
) -> None:
    from genq.worker.engines.base import GenerationInput
    from genq.worker.engines.static import StaticEngine

    full, small = _engine(adapters), _engine(adapters, max_loras=2)
    assert isinstance(full, StaticEngine) and isinstance(small, StaticEngine)
    assert small.adapters is not None and len(small.adapters.resident) == 2
    ids = full.tokenize(["rotate"])[0]
    for turn in ("a1", "a2", "a3", "a1", None):  # in rotation: each one not resident loads
        row = [GenerationInput(prompt_ids=ids, max_new_tokens=8, adapter=turn)]
        assert small.generate(row).outputs[0].text == full.generate(row).outputs[0].text
    assert small.adapters.loads >= 2 and len(small.adapters.resident) == 2
    mixed = [GenerationInput(prompt_ids=ids, max_new_tokens=8, adapter=a) for a in adapters]
    texts = [o.text for o in small.generate(mixed).outputs]  # 3 adapters, 2 fit: in parts
    assert texts == [o.text for o in full.generate(mixed).outputs]
    assert small.adapters.parts == 1


def test_a_worker_serves_its_adapters_as_models_batched_with_the_base(
    adapters: dict[str, str],
    redis_url: str,
    queue: str,
    r: redis.Redis,
    start_worker: Callable[..., WorkerProcess],
) -> None:
    loras = [f"--lora={n}={p}" for n, p in adapters.items()]
    w = start_worker(queue, "--model", "tiny", "--max-wait-ms", "300", *loras, "--max-loras", "2")
    wait_until(lambda: r.exists(Keys(queue).worker("w0")), timeout_s=120)
    assert r.hget(Keys(queue).worker("w0"), "engine") == b"static"  # auto, with --lora
    assert "engine static: auto: --lora on a CPU" in w.log()  # its first lines say why
    client = Client.from_url(redis_url, queue)
    models = ["tiny", "a1", "a2", "a3", None, "a1"]
    items = [{"prompt": "Once upon a time", **({"model": m} if m else {})} for m in models]
    batched = client.results(client.submit_many(items, max_new_tokens=8), timeout=120)
    assert [x.status for x in batched] == ["succeeded"] * 6
    assert [x.model for x in batched] == ["tiny", "a1", "a2", "a3", "tiny", "a1"]
    alone = [client.generate(**item, max_new_tokens=8, timeout=60) for item in items]
    assert [x.text for x in batched] == [x.text for x in alone]
    assert len({x.text for x in batched}) == 4  # the base and three adapters
    assert max(x.batch_size or 0 for x in batched) > 1  # they did share a batch


def test_bad_lora_values_stop_the_worker_at_start_with_one_line(
    adapters: dict[str, str], tmp_path: Path, redis_url: str, queue: str
) -> None:
    from genq.worker.engines.adapters import check_adapter

    foreign = tmp_path / "foreign"
    foreign.mkdir()
    config = json.loads((Path(adapters["a1"]) / "adapter_config.json").read_text())
    (foreign / "adapter_config.json").write_text(
        json.dumps({**config, "base_model_name_or_path": "HuggingFaceTB/SmolLM2-135M-Instruct"})
    )
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "adapter_config.json").write_text(json.dumps(config))
    (broken / "adapter_model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(ConfigError, match="made for"):
        check_adapter("f", str(foreign), ["tiny"])
    settings_cases = {  # refused by the settings, as the command line's are (one line)
        "has no adapter_config.json": {"lora": (f"x={tmp_path / 'nowhere'}",)},
        "is not NAME=PATH": {"lora": "just-a-name"},  # (the env twin's text)
        "is given twice": {"lora": (f"x={adapters['a1']}", f"x={adapters['a2']}")},
        "continuous engine runs no adapters": {
            "lora": (f"x={adapters['a1']}",),
            "engine": "continuous",
        },
    }
    for why, values in settings_cases.items():
        with pytest.raises(ConfigError, match=why):
            WorkerSettings.build(values, env={})
    where = ("--redis-url", redis_url, "--queue", queue, "--model", "tiny")
    cases = {  # found when the engine loads them, before the worker serves
        "broken": ("--lora", f"x={broken}"),
        "foreign": ("--lora", f"x={foreign}"),
    }
    for case, args in cases.items():
        done = genq("worker", *where, *args, timeout_s=120)
        err = done.stderr.strip().splitlines()
        assert done.returncode != 0, case
        assert err and "Traceback" not in done.stderr, (case, done.stderr[-2000:])
        assert any(w in err[-1] for w in ("adapter", "lora", "NAME=PATH")), (case, err[-1])


# -- the adapter rule of a worker's order (pure: no Redis, no torch) -----------------------


def _ask(key: str, model: str | None, at: int, tokens: int = 100, tenant: str = "t") -> Any:
    from genq.worker.policy.batching import Candidate

    return Candidate(
        key=key, prompt_tokens=tokens, max_new_tokens=8, enqueued_ms=at, tenant=tenant, model=model
    )


def _batch(order: Any, pool: list[Any], size: int) -> list[str]:
    from genq.worker.policy.batching import BatchPolicy

    policy = BatchPolicy(
        max_batch_tokens=100_000, max_batch_size=size, max_wait_ms=0, priority_aging_ms=10_000
    )
    return [c.key for c in order.decide(pool, 1_000, policy, {}).batch]


def test_resident_adapters_fill_a_batch_before_cold_ones_but_never_pick_its_anchor() -> None:
    from genq.worker.policy.ordering import make_order

    plain = make_order("fifo")
    order = make_order("fifo", adapters=["a1", "a2", "a3"], max_loras=2)
    order.started([_ask("s1", "a1", 0), _ask("s2", "a2", 0)])  # a1, a2 in the engine now
    pool = [
        _ask("cold", "a3", 1, tokens=100),  # the oldest: anchors, though a3 must be loaded
        _ask("a1", "a1", 2, tokens=900),
        _ask("a3b", "a3", 3, tokens=1000),
        _ask("a2", "a2", 4, tokens=800),
        _ask("a3c", "a3", 5, tokens=1000),
        _ask("base", None, 6, tokens=700),
    ]
    assert _batch(plain, pool, 3) == ["cold", "base", "a2"], "by length alone"
    assert _batch(order, pool, 3) == ["cold", "a3b", "a3c"], "the anchor's adapter first"
    others = [p for p in pool if p.model != "a3"] + [_ask("old", "a3", 0, tokens=100)]
    got = _batch(order, others, 3)
    assert got[0] == "old", "a cold adapter's oldest request still anchors: no endless wait"
    rest = [p for p in pool if p.key != "cold"] + [_ask("b0", None, 0, tokens=1000)]
    assert _batch(plain, rest, 4) == ["b0", "a3b", "a3c", "a1"]
    assert _batch(order, rest, 4) == [
        "b0",  # the base model anchors; resident adapters before the cold a3 ones
        "base",
        "a1",
        "a2",
    ]


def test_the_order_counts_the_last_max_loras_adapters_a_batch_used_as_resident() -> None:
    from genq.worker.policy.affinity import Affinity
    from genq.worker.policy.ordering import make_order

    order = make_order("fair", adapters=["a1", "a2", "a3"], max_loras=2)
    assert isinstance(order, Affinity) and order.resident == []
    for model in ("a1", "a2", None, "tiny", "a1", "a3"):
        order.started([_ask("x", model, 0)])
    assert order.resident == ["a1", "a3"], "a2 was the least recently used; base is no adapter"
    assert order.name == "fair" and not isinstance(make_order("fair"), Affinity)
    every = make_order("fair", adapters=["a1", "a2", "a3"], max_loras=0)  # 0: all resident
    for model in ("a1", "a2", "a3"):
        every.started([_ask("x", model, 0)])
    assert isinstance(every, Affinity) and every.resident == ["a1", "a2", "a3"]
