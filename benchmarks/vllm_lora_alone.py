"""vLLM alone (``LLM.generate`` in this process, no genq), smollm2-135m: what 4 LoRA adapters
mixed in its batches cost against the base model, on the workload of ``genq bench --scenario
adapters`` (64 greedy prompts of 32 new tokens, ``ignore_eos``; 4 adapters of rank 8 built
offline, named in rotation; 16 slots, a 4,096-token budget, eager mode, as a genq worker
configures vLLM). The engine's own ratio, to read beside genq's through the queue.

    VLLM_TARGET_DEVICE=cpu python benchmarks/vllm_lora_alone.py base
    VLLM_TARGET_DEVICE=cpu python benchmarks/vllm_lora_alone.py mixed
    VLLM_TARGET_DEVICE=cpu python benchmarks/vllm_lora_alone.py one
    VLLM_TARGET_DEVICE=cpu python benchmarks/vllm_lora_alone.py lora-base

``mixed``: the 4 adapters in rotation; ``one``: the same engine (LoRA on, 4 adapters known),
every request for the first adapter: what one adapter a batch costs against four;
``lora-base``: the same engine, no request naming an adapter: what LoRA being on costs.

Each prints one line: the mode and the tokens/s of 3 timed runs after a warm-up. Run the two
modes in turns (each starts its own engine).
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path


def main(mode: str) -> None:
    from genq.worker.bench.adapters import MAX_NEW_TOKENS, _prompts
    from genq.worker.engines.lora_builder import build_tiny_adapter
    from genq.worker.engines.vllm_args import lora_engine_args, worker_engine_args
    from vllm import LLM, SamplingParams
    from vllm.lora.request import LoRARequest

    tmp = tempfile.mkdtemp(prefix="genq-lora-alone-")
    names = {
        f"lora{i}": str(build_tiny_adapter(Path(tmp) / f"lora{i}", seed=i + 1, base="smollm2-135m"))
        for i in range(4)
    }
    args = worker_engine_args(
        "smollm2-135m",
        device="cpu",
        dtype="auto",
        max_batch_tokens=4096,
        max_batch_size=16,
        prefix_room_tokens=0,
        vllm_args={"enforce_eager": True},
    )
    if mode in ("mixed", "one", "lora-base"):
        args.update(lora_engine_args(names, 0, ["smollm2-135m"]))
    llm = LLM(**args)
    loras = [
        LoRARequest(lora_name=n, lora_int_id=i + 1, lora_path=p)
        for i, (n, p) in enumerate(names.items())
    ]
    prompts = _prompts()
    params = SamplingParams(temperature=0, max_tokens=MAX_NEW_TOKENS, ignore_eos=True)
    rotation = None
    if mode in ("mixed", "one"):
        rotation = [loras[i % len(loras) if mode == "mixed" else 0] for i in range(len(prompts))]
    llm.generate(
        prompts[:4], params, lora_request=rotation[:4] if rotation else None, use_tqdm=False
    )
    runs = []
    for _ in range(3):
        t0 = time.perf_counter()
        outs = llm.generate(prompts, params, lora_request=rotation, use_tqdm=False)
        tokens = sum(len(o.outputs[0].token_ids) for o in outs)
        runs.append(round(tokens / (time.perf_counter() - t0), 1))
    print(mode, json.dumps(runs), flush=True)


if __name__ == "__main__":  # vLLM's engine core is a spawned process: it imports this module
    main(sys.argv[1] if len(sys.argv) > 1 else "base")
