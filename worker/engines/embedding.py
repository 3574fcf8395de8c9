"""Embeddings on transformers: a sentence-transformers model folder (its ``modules.json``: a
Transformer, a Pooling, maybe a Normalize) run as the worker's engine.

A batch's rows are requests of one or many inputs. Their inputs are run together: identical
ones of one scope (a tenant, or the tenants that share) once, and none that the engine's
recent vectors hold, the rest sorted by length and cut into passes whose padded tokens stay within
``pass_tokens`` (an input longer than that runs alone: never a bigger pass), each pooled
(mean, CLS or last token, as the folder says) and normalized where the row asks or the model
does. The vectors go back as float32 bytes (``GenerationOutput.vectors``).
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from genq.common.errors import ConfigError, InvalidRequest
from genq.common.formats import ResponseFormat
from genq.worker.engines.base import (
    BatchReport,
    GenerationInput,
    GenerationOutput,
    StoppedEarly,
)
from genq.worker.policy.sizing import BatchLimits

PASS_TOKENS = 2_048
"""Padded tokens in one forward pass of the model (rows x the longest of them). Measured on 2
CPU cores with all-MiniLM-L6-v2, 2,000 inputs of 8-256 tokens: 11.9 k tokens/s at 1,024-2,048,
10.9 k at 4,096, 7.8 k at 8,192, 5.9 k at 16,384 (attention grows with the longest row)."""
BATCH_TOKENS = 4_096
"""An embedding worker's batch budget in real input tokens where ``--max-batch-tokens`` is
auto: ~0.35 s of all-MiniLM-L6-v2 on 2 CPU cores, the longest a high-priority request waits
for the batch in flight."""
BATCH_SIZE = 256
"""An embedding worker's most requests a batch where ``--max-batch-size`` is auto."""
RECENT_VECTORS = 4_096
"""Vectors an embedding engine keeps after it computed them, so that a repeat in a later batch
(another request in flight, or just done) is not computed again: 6 MB at 384 dimensions."""
POOLINGS = {
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_cls_token": "cls",
    "pooling_mode_lasttoken": "last",
}


def is_embedding_model(path: str) -> bool:
    """Whether the folder at ``path`` holds a sentence-transformers model (``modules.json``)."""
    return (Path(path) / "modules.json").is_file()


@dataclass(frozen=True, kw_only=True)
class EmbeddingLayout:
    """What a sentence-transformers folder says about its model beside the weights."""

    pooling: str
    """``mean``, ``cls`` or ``last``."""
    normalizes: bool
    """A Normalize module follows the pooling."""
    max_tokens: int
    """Most tokens an input may have (``max_seq_length``)."""
    dimension: int


def read_layout(path: str, config: Any) -> EmbeddingLayout:
    """The layout of the folder at ``path`` (``config``: the transformer's); ConfigError for a
    module genq does not run (Dense, a custom one) or a pooling it does not know."""
    folder = Path(path)
    modules = json.loads((folder / "modules.json").read_text())
    kinds = [m.get("type", "").rsplit(".", 1)[-1] for m in modules]
    unknown = [k for k in kinds if k not in ("Transformer", "Pooling", "Normalize")]
    if unknown or "Pooling" not in kinds:
        raise ConfigError(
            f"{path}: genq runs sentence-transformers models of a Transformer, a Pooling and "
            f"maybe a Normalize module; this one has {', '.join(kinds)}"
        )
    pooling_dir = next(m["path"] for m in modules if m["type"].endswith("Pooling"))
    pooling_config = json.loads((folder / pooling_dir / "config.json").read_text())
    modes = [mode for key, mode in POOLINGS.items() if pooling_config.get(key)]
    if len(modes) != 1 or len([k for k, v in pooling_config.items() if v is True]) != 1:
        raise ConfigError(f"{path}: genq pools by the mean, the CLS or the last token only")
    st_config = folder / "sentence_bert_config.json"
    st: dict[str, Any] = json.loads(st_config.read_text()) if st_config.exists() else {}
    limit = st.get("max_seq_length") or getattr(config, "max_position_embeddings", None) or 512
    return EmbeddingLayout(
        pooling=modes[0],
        normalizes="Normalize" in kinds,
        max_tokens=int(limit),
        dimension=int(pooling_config.get("word_embedding_dimension") or config.hidden_size),
    )


class EmbeddingEngine:
    """An embedding model behind the ``Engine`` interface (``generate`` embeds; it generates no
    text). Run by the static runner."""

    name = "static"
    embeds = True
    stoppable = True
    """A batch stops between two passes for a higher-priority request (``StoppableEngine``);
    the vectors its passes made wait for its rerun, which computes only the rest."""
    prefix_room = 0
    limits: BatchLimits | None = None

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        layout: EmbeddingLayout,
        *,
        device: str = "cpu",
        pass_tokens: int = PASS_TOKENS,
        recent_vectors: int = RECENT_VECTORS,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.layout = layout
        self.device = device
        self.pass_tokens = pass_tokens
        self.max_context_tokens: int | None = layout.max_tokens
        self.dimension = layout.dimension
        self.saved_inputs = 0
        """Inputs not computed because an identical one was (a counter)."""
        self.recent_vectors = recent_vectors
        self._recent: OrderedDict[tuple[str, tuple[int, ...]], Any] = OrderedDict()
        """The last ``recent_vectors`` computed, by scope and input (pooled, not normalized)."""
        self._made: dict[tuple[str, tuple[int, ...]], Any] = {}
        """What the passes of a batch that stopped made, for its rerun (counted computed)."""
        probe = tokenizer("a")["input_ids"]
        bare = tokenizer("a", add_special_tokens=False)["input_ids"]
        at = next(i for i in range(len(probe)) if probe[i : i + len(bare)] == bare)
        self._head, self._tail = probe[:at], probe[at + len(bare) :]

    @classmethod
    def load(cls, path: str, device: str = "cpu", dtype: str = "auto") -> EmbeddingEngine:
        """The model of the folder at ``path`` on ``device`` (``auto``: float32)."""
        import torch
        from transformers import AutoModel, AutoTokenizer
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        torch_dtype = torch.float32 if dtype == "auto" else getattr(torch, dtype)
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModel.from_pretrained(path, dtype=torch_dtype).to(device).eval()
        return cls(model, tokenizer, read_layout(path, model.config), device=device)

    def tokenize(self, prompts: Sequence[str]) -> list[list[int]]:
        """Each text's ids with the model's special tokens, not yet cut to its limit (``fit``)."""
        return [list(ids) for ids in self.tokenizer(list(prompts))["input_ids"]] if prompts else []

    def fit(self, ids: list[int], truncate: str, index: int) -> list[int]:
        """``ids`` within the model's limit: cut from the ``end`` or the ``start`` (its special
        tokens kept), or, for ``none``, InvalidRequest naming input ``index``."""
        limit = self.layout.max_tokens
        if len(ids) <= limit:
            return ids
        if truncate == "none":
            raise InvalidRequest(
                f"input {index} has {len(ids)} tokens, over the model's {limit} "
                "(truncate: none; send it shorter, or truncate: end or start)"
            )
        head, tail = len(self._head), len(self._tail)
        body = ids[head : len(ids) - tail]
        keep = limit - head - tail
        body = body[:keep] if truncate == "end" else body[len(body) - keep :]
        return ids[:head] + body + ids[len(ids) - tail :]

    def constrain(self, fmt: ResponseFormat) -> Any:
        raise InvalidRequest("an embedding model generates no text to constrain")

    def generate(
        self, batch: Sequence[GenerationInput], *, stop: threading.Event | None = None
    ) -> BatchReport:
        """Every row's vectors (``GenerationOutput.vectors``), in input order. An input of the
        same scope (``GenerationInput.scope``: a tenant, or the tenants that share) as one
        earlier in the batch, or among the ``recent_vectors`` last computed, is not computed
        again: its tokens are the row's ``cached_tokens``. Once ``stop`` is set, StoppedEarly
        after the pass under way; the vectors made so far are kept for the batch's rerun."""
        keys = [[(row.scope, tuple(ids)) for ids in row.inputs or ()] for row in batch]
        fresh = list(dict.fromkeys(k for row in keys for k in row if k not in self._recent))
        made = {k: self._made.pop(k) for k in fresh if k in self._made}
        try:
            vectors, padded = self._embed([k for k in fresh if k not in made], stop)
        except StoppedEarly:  # stopped again: what earlier passes made waits on
            self._made.update(made)
            raise
        vectors.update(made)
        padded += sum(len(k[1]) for k in made)
        found = {k: self._recent[k] for row in keys for k in row if k in self._recent}
        for k in found:
            self._recent.move_to_end(k)
        for k in fresh:
            self._recent[k] = found[k] = vectors[k]
        while len(self._recent) > self.recent_vectors:
            self._recent.popitem(last=False)
        computed: set[tuple[str, tuple[int, ...]]] = set()
        to_compute = set(fresh)
        outputs = []
        for row, row_keys in zip(batch, keys, strict=True):
            cached = 0
            for k in row_keys:
                if k in to_compute and k not in computed:
                    computed.add(k)
                else:
                    cached += len(k[1])
            normalize = self.layout.normalizes if row.normalize is None else row.normalize
            out = [found[k] for k in row_keys]
            if normalize:
                out = [v / max(float(v.norm()), 1e-12) for v in out]
            outputs.append(
                GenerationOutput(
                    text="",
                    completion_tokens=0,
                    finish_reason="stop",
                    cached_tokens=cached,
                    vectors=[v.numpy().astype("<f4").tobytes() for v in out],
                )
            )
        answered = sum(len(row) for row in keys)
        self.saved_inputs += answered - len(fresh)
        reused = sum(o.cached_tokens for o in outputs)
        return BatchReport(
            outputs=outputs,
            prompt_tokens=sum(len(k[1]) for row in keys for k in row),
            padded_prompt_tokens=padded + reused,  # a reused input: its positions, no padding
            inputs=answered,
            saved_inputs=answered - len(fresh),
        )

    def _embed(
        self, inputs: list[tuple[str, tuple[int, ...]]], stop: threading.Event | None = None
    ) -> tuple[dict[tuple[str, tuple[int, ...]], Any], int]:
        """The pooled (not normalized) vector of each input (a scope and its ids), and the
        padded tokens computed; StoppedEarly between two passes once ``stop`` is set, what the
        passes made kept in ``_made``."""
        import torch

        order = sorted(inputs, key=lambda k: -len(k[1]))
        vectors: dict[tuple[str, tuple[int, ...]], Any] = {}
        padded = 0
        start = 0
        while start < len(order):
            if stop is not None and stop.is_set():
                if len(self._made) + len(vectors) > self.recent_vectors:
                    self._made.clear()  # (kept for one batch's rerun, not forever)
                self._made.update(vectors)
                raise StoppedEarly
            longest = len(order[start][1])
            count = max(1, self.pass_tokens // max(longest, 1))
            chunk = order[start : start + count]
            start += len(chunk)
            padded += longest * len(chunk)
            ids = torch.zeros((len(chunk), longest), dtype=torch.long)
            mask = torch.zeros((len(chunk), longest), dtype=torch.long)
            for row, (_, one) in enumerate(chunk):
                ids[row, : len(one)] = torch.tensor(one)
                mask[row, : len(one)] = 1
            with torch.inference_mode():
                pooled = self._forward(ids.to(self.device), mask.to(self.device))
            for row, key in enumerate(chunk):
                vectors[key] = pooled[row].cpu()
        return vectors, padded

    def _forward(self, ids: Any, mask: Any) -> Any:
        """One pass: a vector per row of ``ids`` (padded; ``mask``: its real tokens)."""
        hidden = self.model(input_ids=ids, attention_mask=mask).last_hidden_state
        return self._pool(hidden.float(), mask)

    def _pool(self, hidden: Any, mask: Any) -> Any:
        """One vector per row of ``hidden`` by the folder's pooling (``mask``: real tokens)."""
        if self.layout.pooling == "cls":
            return hidden[:, 0]
        if self.layout.pooling == "last":
            last = mask.sum(1) - 1
            return hidden[range(hidden.shape[0]), last]
        weights = mask.unsqueeze(-1).to(hidden.dtype)
        return (hidden * weights).sum(1) / weights.sum(1).clamp(min=1e-9)
