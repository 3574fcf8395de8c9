"""LoRA adapters built offline for tests, benchmarks and trying ``--lora``: PEFT's, with random
non-zero weights, on a model genq builds (``tiny``) or packages (``smollm2-135m``)."""

from __future__ import annotations

import json
from pathlib import Path

from genq.worker.engines.builtin_models import TINY_MODEL_NAME
from genq.worker.engines.static import resolve_model


def build_tiny_adapter(path: Path, seed: int, base: str = TINY_MODEL_NAME, rank: int = 8) -> Path:
    """Write a LoRA adapter for a model genq builds or packages (``tiny`` by default,
    ``smollm2-135m``) to ``path``: PEFT's, on the attention's projections, with random non-zero
    weights of seed ``seed`` (so each adapter's output differs from the base's and the
    others'), recorded as made for ``base``. For tests and benchmarks: built offline, in well
    under a second for ``tiny``."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(resolve_model(base))
    config = LoraConfig(
        r=rank,
        lora_alpha=2 * rank,
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
        init_lora_weights=False,  # random A and B: the adapter changes the output at once
        task_type="CAUSAL_LM",
    )
    torch.manual_seed(seed)
    peft_model = get_peft_model(model, config)
    with torch.no_grad():  # strong enough that greedy picks change on a random model
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.mul_(4.0)
    peft_model.save_pretrained(str(path))
    adapter_config = path / "adapter_config.json"
    doc = json.loads(adapter_config.read_text())
    doc["base_model_name_or_path"] = base
    adapter_config.write_text(json.dumps(doc, indent=2))
    return path
