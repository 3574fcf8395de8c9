"""``--engine vllm`` on an embedding model: vLLM's pooling runner (``runner="pooling"``)
behind the embedding engine's interface.

Everything a request sees is the embedding engine's (``embedding.py``): tokenizing off the
loop, ``truncate``, ``dimensions``, identical inputs of one scope computed once, the recent
vectors, ``normalize``. Only the compute differs: the distinct inputs a batch still needs go to
vLLM's ``LLM.embed`` in one call as token ids, where vLLM's scheduler packs them without padding
(within ``max_num_batched_tokens``: the worker's batch budget, or the model's longest input if
that is more). vLLM pools as the folder's ``modules.json`` says and is asked for the vector
before any normalization (``use_activation=False``), so a row's ``normalize`` means the same as
on transformers.

A batch is not stoppable between passes (vLLM runs the call whole): a high request waits for
the batch in flight, which the budget keeps short. vLLM's engine core runs in a process of its
own; the reaper (``reaper.py``) ends it if the worker dies, and ``close`` ends it at exit.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from genq.common.errors import ConfigError
from genq.worker.engines.embedding import EmbeddingEngine, EmbeddingLayout, read_layout
from genq.worker.engines.reaper import start_reaper, stop_reaper
from genq.worker.engines.vllm_args import require_vllm, set_vllm_environment

KV_CACHE_BYTES = 64 * 2**20
"""The KV cache genq asks vLLM for on an embedding model (vLLM sizes one for every model)."""


class VllmEmbeddingEngine(EmbeddingEngine):
    """An embedding model on vLLM's pooling runner, run by the static runner."""

    name = "vllm"
    stoppable = False

    def __init__(self, llm: Any, tokenizer: Any, layout: EmbeddingLayout, device: str) -> None:
        super().__init__(None, tokenizer, layout, device=device)
        self._llm = llm
        self.reaper: Any = None
        """This process's reaper: vLLM's engine process does not outlive it."""

    @classmethod
    def start(
        cls,
        path: str,
        device: str = "cpu",
        dtype: str = "auto",
        *,
        max_batch_tokens: int,
        max_batch_size: int,
        vllm_args: Mapping[str, Any] | None = None,
    ) -> VllmEmbeddingEngine:
        """vLLM's pooling runner on the sentence-transformers folder at ``path`` (``auto``:
        float32, as the transformers engine), its batches within the worker's budget."""
        set_vllm_environment(device)
        require_vllm()
        from transformers import AutoConfig, AutoTokenizer

        layout = read_layout(path, AutoConfig.from_pretrained(path))
        args: dict[str, Any] = {
            "model": path,
            "runner": "pooling",
            "dtype": "float32" if dtype == "auto" else dtype,
            "max_model_len": layout.max_tokens,
            "max_num_seqs": max_batch_size,
            "max_num_batched_tokens": max(max_batch_tokens, layout.max_tokens),
            "seed": 0,
            "disable_log_stats": True,
        }
        extra = dict(vllm_args or {})
        if not {"gpu_memory_utilization", "kv_cache_memory_bytes"} & set(extra):
            # An encoder keeps no KV cache between steps: a small one, not vLLM's default
            # share of the device (or, on a CPU, of the machine's memory) reserved for it.
            args["kv_cache_memory_bytes"] = KV_CACHE_BYTES
        args.update(extra)
        from vllm import LLM

        reaper = start_reaper()  # ends vLLM's engine process if this one is killed
        try:
            llm = LLM(**args)
        except TypeError as err:
            stop_reaper(reaper)
            raise ConfigError(f"--vllm-args: {err}") from err
        engine = cls(llm, AutoTokenizer.from_pretrained(path), layout, device)
        engine.reaper = reaper
        return engine

    def _embed(
        self, inputs: list[tuple[str, tuple[int, ...]]], stop: threading.Event | None = None
    ) -> tuple[dict[tuple[str, tuple[int, ...]], Any], int]:
        """The pooled (not normalized) vector of each input, computed by vLLM in one call, and
        the tokens computed (vLLM pads nothing)."""
        if not inputs:
            return {}, 0
        import torch
        from vllm import PoolingParams

        prompts = [{"prompt_token_ids": list(ids)} for _, ids in inputs]
        outputs = self._llm.embed(
            prompts, pooling_params=PoolingParams(use_activation=False), use_tqdm=False
        )
        vectors = {
            key: torch.tensor(out.outputs.embedding, dtype=torch.float32)
            for key, out in zip(inputs, outputs, strict=True)
        }
        return vectors, sum(len(ids) for _, ids in inputs)

    def close(self) -> None:
        """End vLLM's engine (its process) and the reaper."""
        shutdown = getattr(self._llm.llm_engine.engine_core, "shutdown", None)
        if shutdown is not None:
            shutdown()
        stop_reaper(self.reaper)
