"""Scores on transformers: a cross-encoder (a ``*ForSequenceClassification`` model folder, as
sentence-transformers' ``CrossEncoder`` saves one) run as the worker's engine.

A cross-encoder reads two texts together (``[CLS] query [SEP] text [SEP]``, the second one's
tokens of segment 1 where the model has segments) and gives one value a label: a request's
``query`` against each of its inputs (``Request.query``). Everything else is the embedding
engine's (``embedding.py``): passes sorted by length within ``pass_tokens``, identical pairs
of one scope computed once, the recent ones kept, a batch stoppable between passes. A pair's
"vector" is its scores after the model's activation, as ``CrossEncoder.predict`` gives them:
the one the folder's config names (``sentence_transformers.activation_fn``), else a sigmoid
for one label and the raw logits for more. ``truncate`` cuts the input, never the query.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from genq.common.errors import InvalidRequest
from genq.worker.engines.embedding import EmbeddingEngine, EmbeddingLayout


def is_scoring_model(path: str) -> bool:
    """Whether the folder at ``path`` holds a cross-encoder: its config names an architecture
    ``*ForSequenceClassification``, and it is no sentence-transformers embedding folder."""
    folder = Path(path)
    config = folder / "config.json"
    if (folder / "modules.json").is_file() or not config.is_file():
        return False
    try:
        architectures = json.loads(config.read_text()).get("architectures") or []
    except (OSError, ValueError):
        return False
    return any(str(a).endswith("ForSequenceClassification") for a in architectures)


def activation_of(config: Any) -> str:
    """``sigmoid`` or ``none``: what ``CrossEncoder.predict`` applies to this model's logits."""
    named = str((getattr(config, "sentence_transformers", None) or {}).get("activation_fn", ""))
    if named:
        return "sigmoid" if named.endswith("Sigmoid") else "none"
    return "sigmoid" if config.num_labels == 1 else "none"


class ScoringEngine(EmbeddingEngine):
    """A cross-encoder behind the ``Engine`` interface: ``generate`` scores each row's
    pairs (its ids: the query and an input, ``tokenize_pairs``). Run by the static runner."""

    scores = True

    def __init__(
        self, model: Any, tokenizer: Any, layout: EmbeddingLayout, *, device: str = "cpu"
    ) -> None:
        super().__init__(model, tokenizer, layout, device=device)
        self.activation = activation_of(model.config)
        self._segments = getattr(model.config, "type_vocab_size", 1) > 1
        self._sep = tokenizer.sep_token_id

    @classmethod
    def load(cls, path: str, device: str = "cpu", dtype: str = "auto") -> ScoringEngine:
        """The cross-encoder of the folder at ``path`` on ``device`` (``auto``: float32)."""
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        torch_dtype = torch.float32 if dtype == "auto" else getattr(torch, dtype)
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForSequenceClassification.from_pretrained(path, dtype=torch_dtype)
        model = model.to(device).eval()
        config = model.config
        limits = [config.max_position_embeddings, tokenizer.model_max_length]
        layout = EmbeddingLayout(
            pooling="cls",
            normalizes=False,
            max_tokens=int(min(n for n in limits if isinstance(n, int) and n > 0)),
            dimension=int(config.num_labels),
        )
        return cls(model, tokenizer, layout, device=device)

    def tokenize(self, prompts: Sequence[str]) -> list[list[int]]:
        raise InvalidRequest("a cross-encoder scores texts against a query: send query")

    def tokenize_pairs(self, query: str, texts: Sequence[str]) -> list[list[int]]:
        """Each text's ids read after ``query``, with the model's special tokens, not yet cut
        to its limit (``fit``)."""
        if not texts:
            return []
        return [list(ids) for ids in self.tokenizer([query] * len(texts), list(texts))["input_ids"]]

    def fit(self, ids: list[int], truncate: str, index: int) -> list[int]:
        """A pair's ``ids`` within the model's limit: its input (after the query's separator)
        cut from the ``end`` or the ``start``, or for ``none`` InvalidRequest naming it."""
        limit = self.layout.max_tokens
        if len(ids) <= limit:
            return ids
        if truncate == "none":
            raise InvalidRequest(
                f"input {index} has {len(ids)} tokens with the query, over the model's {limit} "
                "(truncate: none; send it shorter, or truncate: end or start)"
            )
        cut = ids.index(self._sep) + 1 if self._sep in ids else len(self._head)
        head, tail = ids[:cut], ids[len(ids) - len(self._tail) :]
        keep = limit - len(head) - len(tail)
        if keep < 1:
            raise InvalidRequest(f"the query alone takes {len(head)} of the model's {limit} tokens")
        body = ids[cut : len(ids) - len(tail)]
        body = body[:keep] if truncate == "end" else body[len(body) - keep :]
        return head + body + tail

    def _forward(self, ids: Any, mask: Any) -> Any:
        """One pass: each row's scores (its segments: 1 after the query's separator)."""
        extra = {}
        if self._segments and self._sep is not None:
            sep = (ids == self._sep).long()
            extra["token_type_ids"] = ((sep.cumsum(1) - sep) > 0).long() * mask
        logits = self.model(input_ids=ids, attention_mask=mask, **extra).logits.float()
        return logits.sigmoid() if self.activation == "sigmoid" else logits
