"""``--engine static``: one ``model.generate`` call per batch, with left padding.

Decoder-only models must be padded on the left, with an attention mask, so that every row's
last prompt token sits at the same position and new tokens follow it directly; right padding
would put pad tokens between a prompt and its continuation and silently change the output.

Per-row behaviour inside one ``generate`` call:

- limits: a stopping criterion ends each row at its own ``max_new_tokens`` or stop string, and
  ``generate`` itself ends rows at eos (later steps of a finished row are padding, not counted);
- adjustments: a logits processor applies each row's own penalties, logit bias, ``min_tokens``
  and ``ignore_eos`` (``LogitAdjust``) to that row only;
- constraints: a logits processor masks each row that has a response format to the tokens
  its grammar allows next (``engines/grammar.py``);
- sampling: a logits processor samples each sampled row with its own temperature, top-k,
  top-p, min-p and seeded generator, then leaves only the drawn token for ``generate``'s greedy
  pick. Greedy rows are untouched, so a greedy row's output does not depend on its batch-mates.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import threading
from collections.abc import Sequence
from typing import Any

from genq.common.formats import ResponseFormat
from genq.worker.engines.adapters import Adapters, in_parts
from genq.worker.engines.base import (
    BatchReport,
    GenerationInput,
    GenerationOutput,
    StoppedEarly,
    TextStreamer,
    cut_at_stop,
    expand_choices,
    gather_choices,
    logprob_entries,
)
from genq.worker.engines.grammar import Constraint, GrammarCache, RowGrammar
from genq.worker.policy.sizing import BatchLimits, DeviceMemory


def _torch() -> Any:
    import torch

    return torch


class StaticEngine:
    """Batched generation with Hugging Face transformers ``generate``."""

    name = "static"
    stoppable = True
    limits: BatchLimits | None = None
    prefix_room = 0
    """No cache outlives a ``generate`` call: nothing of a batch is kept for the next."""

    def __init__(
        self, model: Any, tokenizer: Any, device: str = "cpu", adapters: Adapters | None = None
    ) -> None:
        self.adapters = adapters
        """The LoRA adapters (``--lora``), the model wrapped in PEFT; None: none."""
        self.model = (model if adapters is None else adapters.model).eval()
        self.tokenizer = tokenizer
        self.tokenizer.padding_side = "left"
        self.device = device
        eos: Any = model.generation_config.eos_token_id
        if eos is None:
            eos = tokenizer.eos_token_id
        self.eos_token_ids: list[int] = (
            [] if eos is None else [int(e) for e in (eos if isinstance(eos, list) else [eos])]
        )
        pad = tokenizer.pad_token_id
        if pad is None:
            pad = self.eos_token_ids[0] if self.eos_token_ids else 0
        self.pad_token_id = int(pad)
        self.max_context_tokens: int | None = getattr(model.config, "max_position_embeddings", None)
        self.vocab_size = int(model.config.vocab_size)
        self.grammars = GrammarCache(
            tokenizer, vocab_size=self.vocab_size, stop_token_ids=self.eos_token_ids
        )

    @classmethod
    def load(cls, model_name: str, device: str = "cpu", dtype: str = "auto") -> StaticEngine:
        """Load a causal LM: ``tiny`` (built-in), a local directory, or a hub id."""
        model, tokenizer = load_model(model_name, device, dtype)
        return cls(model, tokenizer, device)

    def tokenize(self, prompts: Sequence[str]) -> list[list[int]]:
        """Token ids of each prompt, with the model's special tokens (e.g. bos)."""
        ids: list[list[int]] = self.tokenizer(list(prompts), add_special_tokens=True)["input_ids"]
        return ids

    def constrain(self, fmt: ResponseFormat) -> Constraint:
        """The compiled grammar of a response format (cached); raises InvalidRequest when
        xgrammar cannot compile it."""
        return self.grammars.constraint(fmt)

    def generate(
        self, batch: Sequence[GenerationInput], *, stop: threading.Event | None = None
    ) -> BatchReport:
        """Run the batch in one ``generate`` call (a row with ``n`` > 1 as n rows; rows of more
        adapters than fit at once, in parts: ``Adapters.parts_of``). With ``stop``: once it is
        set, the batch ends at the next decode step boundary and ``StoppedEarly`` is raised
        (what it generated is dropped: run again, a greedy or seeded row generates the same;
        a stream sends nothing twice through a ``Replayed``)."""
        run = functools.partial(self._generate_rows, stop=stop)
        if self.adapters is not None:
            before = self.adapters.loads
            report = in_parts(run, batch, self.adapters)
            return dataclasses.replace(report, adapter_loads=self.adapters.loads - before)
        return run(batch)

    def _generate_rows(
        self, batch: Sequence[GenerationInput], stop: threading.Event | None
    ) -> BatchReport:
        if all(r.n == 1 for r in batch):
            return self._generate(batch, stop)
        rows, counts = expand_choices(batch)
        report = self._generate(rows, stop)
        return dataclasses.replace(report, outputs=gather_choices(report.outputs, counts))

    def _generate(
        self, batch: Sequence[GenerationInput], stop: threading.Event | None
    ) -> BatchReport:
        torch = _torch()
        from transformers import GenerationConfig, LogitsProcessorList, StoppingCriteriaList

        rows = len(batch)
        width = max(len(r.prompt_ids) for r in batch)
        input_ids = torch.full((rows, width), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((rows, width), dtype=torch.long)
        for i, r in enumerate(batch):
            n = len(r.prompt_ids)
            input_ids[i, width - n :] = torch.tensor(r.prompt_ids, dtype=torch.long)
            attention_mask[i, width - n :] = 1
        limits = _RowLimits(batch, width, self.tokenizer, stop)
        limits.streamers = {
            i: TextStreamer(self._decode, self.eos_token_ids, r)
            for i, r in enumerate(batch)
            if r.on_text is not None
        }
        processors = LogitsProcessorList()
        logprobs = _RowLogprobs(batch) if any(r.logprobs is not None for r in batch) else None
        if logprobs is not None:
            processors.append(logprobs)  # first: the model's own distribution
        if any(r.adjust is not None for r in batch):
            processors.append(_RowAdjuster(batch, width, self.eos_token_ids))
        if any(r.constraint is not None for r in batch):
            processors.append(RowGrammar([r.constraint for r in batch], self.vocab_size))
        if any(r.temperature > 0 for r in batch):
            processors.append(_RowSampler(batch, self.device))
        config = GenerationConfig(
            max_new_tokens=max(r.max_new_tokens for r in batch),
            do_sample=False,
            pad_token_id=self.pad_token_id,
            eos_token_id=self.eos_token_ids or None,
        )
        adapted: Any = contextlib.nullcontext()
        if self.adapters is not None:  # each row through its adapter
            adapted = self.adapters.rows(batch, self.device)
        with torch.inference_mode(), adapted:
            out = self.model.generate(
                input_ids=input_ids.to(self.device),
                attention_mask=attention_mask.to(self.device),
                generation_config=config,
                logits_processor=processors,
                stopping_criteria=StoppingCriteriaList([limits]),
            )
        if limits.stopped:
            raise StoppedEarly
        generated = out[:, width:].tolist()
        steps = len(generated[0]) if generated else 0
        outputs = [
            self._finish_row(r, tokens, limits.stopped_at[i])
            for i, (r, tokens) in enumerate(zip(batch, generated, strict=True))
        ]
        if logprobs is not None:
            for i, steps_of_row in logprobs.finish(out[:, -1]).items():
                n = outputs[i].completion_tokens  # eos, if it ended the row, has no entry
                kept = n - int(n > 0 and generated[i][n - 1] in self.eos_token_ids)
                outputs[i].logprobs = logprob_entries(self._decode, steps_of_row[:kept])
        prompt_tokens = sum(len(r.prompt_ids) for r in batch)
        return BatchReport(
            outputs=outputs,
            prompt_tokens=prompt_tokens,
            padded_prompt_tokens=rows * width,
            decode_slots=rows * steps,
        )

    def _decode(self, tokens: list[int]) -> str:
        text: str = self.tokenizer.decode(tokens, skip_special_tokens=True)
        return text

    def _finish_row(
        self, row: GenerationInput, tokens: list[int], stopped_at: int | None
    ) -> GenerationOutput:
        limit = row.max_new_tokens if stopped_at is None else min(row.max_new_tokens, stopped_at)
        tokens = tokens[:limit]
        count = len(tokens)
        reason: Any = "length"
        for j, t in enumerate(tokens):
            if t in self.eos_token_ids:
                tokens, count, reason = tokens[:j], j + 1, "stop"
                break
        text, stopped = cut_at_stop(self._decode(tokens), row.stop)
        if stopped or (stopped_at is not None and stopped_at <= count):
            reason = "stop"
        return GenerationOutput(text=text, completion_tokens=count, finish_reason=reason)


class _RowLimits:
    """Stopping criterion: each row ends at its own max_new_tokens or first stop string.
    Records, per row, how many tokens it had generated when a stop string appeared. Once the
    ``stop`` event is set, every row ends (``stopped``)."""

    def __init__(
        self,
        batch: Sequence[GenerationInput],
        prompt_width: int,
        tokenizer: Any,
        stop: threading.Event | None = None,
    ):
        self.stop = stop
        self.stopped = False
        self.max_new = [r.max_new_tokens for r in batch]
        self.stop_strings = [r.stop for r in batch]
        self.prompt_width = prompt_width
        self.tokenizer = tokenizer
        self.stopped_at: list[int | None] = [None] * len(batch)
        self.streamers: dict[int, TextStreamer] = {}
        # Tokens are at least one byte, so this many trailing tokens hold any stop string.
        self.tail_tokens = max((len(s.encode()) for r in batch for s in r.stop), default=0) + 2

    def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
        torch = _torch()
        if self.stop is not None and self.stop.is_set():
            self.stopped = True
            return torch.ones(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
        generated = input_ids.shape[1] - self.prompt_width
        done = [generated >= m for m in self.max_new]
        for i, stops in enumerate(self.stop_strings):
            if not stops or done[i]:
                if self.stopped_at[i] is not None:
                    done[i] = True
                continue
            if self.stopped_at[i] is None:
                k = min(generated, self.tail_tokens)
                tail = self.tokenizer.decode(input_ids[i, -k:].tolist(), skip_special_tokens=True)
                if any(s in tail for s in stops):
                    self.stopped_at[i] = generated
            done[i] = self.stopped_at[i] is not None
        for i, streamer in self.streamers.items():
            limit = self.stopped_at[i] or generated
            streamer.update(input_ids[i, self.prompt_width : self.prompt_width + limit].tolist())
        return torch.tensor(done, dtype=torch.bool, device=input_ids.device)


class _RowLogprobs:
    """Logits processor (first in the list, so it sees the model's own logits): for the rows
    that ask, each step's log-probabilities in float32, the likeliest ``k`` kept; the chosen
    token's is read at the next step (or at the end), once ``generate`` has picked it."""

    def __init__(self, batch: Sequence[GenerationInput]):
        torch = _torch()
        self.rows = [i for i, r in enumerate(batch) if r.logprobs is not None]
        self.k = max(batch[i].logprobs or 0 for i in self.rows)
        self.top_of = {i: batch[i].logprobs or 0 for i in self.rows}
        self.index = torch.tensor(self.rows, dtype=torch.long)
        self.last: Any = None
        self.chosen: list[Any] = []
        self.tops: list[tuple[Any, Any]] = []

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        torch = _torch()
        index = self.index.to(scores.device)
        if self.last is not None:
            self._take(input_ids[index, -1])
        self.last = torch.log_softmax(scores[index].float(), dim=-1)
        if self.k:
            top = torch.topk(self.last, self.k, dim=-1)
            self.tops.append((top.indices, top.values))
        return scores

    def _take(self, tokens: Any) -> None:
        lp = self.last.gather(1, tokens[:, None])[:, 0]
        self.chosen.append((tokens, lp))

    def finish(
        self, last_tokens: Any
    ) -> dict[int, list[tuple[int, float, list[tuple[int, float]]]]]:
        """Each asking row's steps: (token, log-probability, [(token, log-probability)])."""
        torch = _torch()
        if self.last is not None:
            self._take(last_tokens[self.index.to(last_tokens.device)])
        if not self.chosen:
            return {i: [] for i in self.rows}
        tokens = torch.stack([t for t, _ in self.chosen], dim=1).tolist()
        values = torch.stack([v for _, v in self.chosen], dim=1).tolist()
        top_ids = torch.stack([t for t, _ in self.tops], 1).tolist() if self.tops else None
        top_lps = torch.stack([v for _, v in self.tops], 1).tolist() if self.tops else None
        out = {}
        for n, i in enumerate(self.rows):
            k = self.top_of[i]
            out[i] = [
                (token, value, list(zip(top_ids[n][j][:k], top_lps[n][j][:k], strict=True)))
                if k and top_ids is not None and top_lps is not None
                else (token, value, [])
                for j, (token, value) in enumerate(zip(tokens[n], values[n], strict=True))
            ]
        return out


class _RowAdjuster:
    """Logits processor: each row's own penalties, logit bias and eos rules (``LogitAdjust``);
    rows without any are untouched, so their output does not depend on their batch-mates."""

    def __init__(self, batch: Sequence[GenerationInput], prompt_width: int, eos: list[int]):
        self.rows = [(i, r.adjust) for i, r in enumerate(batch) if r.adjust is not None]
        self.prompt_width = prompt_width
        self.prompt_len = [len(r.prompt_ids) for r in batch]
        self.eos = eos

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        torch = _torch()
        generated = input_ids.shape[1] - self.prompt_width
        for i, a in self.rows:
            row = scores[i]
            if a.needs_history:
                out = input_ids[i, self.prompt_width :]
                if a.repetition_penalty != 1.0:
                    seen = input_ids[i, self.prompt_width - self.prompt_len[i] :].unique()
                    seen = seen[seen < row.shape[-1]]
                    vals = row[seen]
                    p = a.repetition_penalty
                    row[seen] = torch.where(vals > 0, vals / p, vals * p)
                if (a.frequency_penalty or a.presence_penalty) and out.numel():
                    counts = torch.bincount(out, minlength=row.shape[-1])[: row.shape[-1]]
                    counts = counts.to(row.dtype)
                    row -= a.frequency_penalty * counts + a.presence_penalty * (counts > 0)
            for token, bias in a.logit_bias:
                row[token] += bias
            if self.eos and (a.ignore_eos or generated < a.min_tokens):
                row[self.eos] = float("-inf")
        return scores


class _RowSampler:
    """Logits processor: samples each sampled row with its own settings and generator, and
    leaves only the drawn token so that greedy selection picks it."""

    def __init__(self, batch: Sequence[GenerationInput], device: str):
        torch = _torch()
        self.rows = [(i, r) for i, r in enumerate(batch) if r.temperature > 0]
        self.generators = {}
        for i, r in self.rows:
            g = torch.Generator(device=device)
            seed = r.seed if r.seed is not None else int.from_bytes(os.urandom(8), "little") >> 1
            g.manual_seed(seed)
            self.generators[i] = g

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        torch = _torch()
        for i, r in self.rows:
            logits = scores[i].float() / r.temperature
            if r.top_k > 0 and r.top_k < logits.shape[-1]:
                kth = torch.topk(logits, r.top_k).values[-1]
                logits = logits.masked_fill(logits < kth, float("-inf"))
            probs = torch.softmax(logits, dim=-1)
            if r.top_p < 1.0:
                sorted_probs, order = torch.sort(probs, descending=True)
                keep = torch.cumsum(sorted_probs, dim=-1) - sorted_probs < r.top_p
                mask = torch.zeros_like(probs, dtype=torch.bool).scatter(0, order, keep)
                probs = probs.masked_fill(~mask, 0.0)
            if r.min_p > 0:
                probs = probs.masked_fill(probs < r.min_p * probs.max(), 0.0)
            token = torch.multinomial(probs, 1, generator=self.generators[i])
            scores[i] = float("-inf")
            scores[i, token] = 0.0
        return scores


def load_model(model_name: str, device: str = "cpu", dtype: str = "auto") -> tuple[Any, Any]:
    """(model, tokenizer) for a built-in name (``tiny``, ``random-250m``, ``smollm2-135m``), a
    local directory or a hub id, on ``device``."""
    torch = _torch()
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # worker logs are lines, not progress bars
    path = resolve_model(model_name)
    # auto = float32 even on GPU: in bfloat16, a batch's shape changes rounding enough to flip
    # near-tied greedy picks, so batched output would not always equal each prompt alone
    # (measured on an H100: 6 of 12 rows differ on the tiny model). --dtype bfloat16 for speed.
    torch_dtype = torch.float32 if dtype == "auto" else getattr(torch, dtype)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype).to(device)
    return model, tokenizer


def device_memory(model: Any, device: str) -> DeviceMemory | None:
    """What ``device`` offers a batch beside ``model`` (already on it): None on a CPU."""
    if not device.startswith("cuda"):
        return None
    torch = _torch()
    free, _total = torch.cuda.mem_get_info(torch.device(device))
    cfg = model.config
    heads = cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
    element = torch.tensor([], dtype=model.dtype).element_size()
    return DeviceMemory(
        free_bytes=int(free),
        kv_bytes_per_token=2 * cfg.num_hidden_layers * kv_heads * head_dim * element,
        max_context_tokens=int(getattr(cfg, "max_position_embeddings", None) or 2048),
    )


def resolve_model(model_name: str) -> str:
    """The directory (or hub id) of a model: built-in names are built into genq's cache on
    first use; anything else is passed on as it is."""
    from genq.worker.engines.builtin_models import BUILTIN_CONFIGS, builtin_model_dir
    from genq.worker.engines.packaged_models import (
        PACKAGED_FOLDERS,
        PACKAGED_MODELS,
        packaged_folder,
        packaged_model_dir,
    )

    if model_name in PACKAGED_FOLDERS:
        return str(packaged_folder(model_name))
    if model_name in BUILTIN_CONFIGS:
        return str(builtin_model_dir(model_name))
    if model_name in PACKAGED_MODELS:
        return str(packaged_model_dir(model_name))
    return model_name
