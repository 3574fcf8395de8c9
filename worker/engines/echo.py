"""``--engine echo``: no model; returns the prompt. For load tests of the queue itself.

Tokens are UTF-8 bytes, so costs and limits behave like a real engine's. ``step_ms`` (worker
``--echo-step-ms``) makes a batch take as long as a static batch whose decode steps each take
that long (its longest ``max_new_tokens`` steps): queue behaviour under slow generation, with no
model (recovery tests kill workers mid-batch this way). Asked for logprobs, it gives each byte of
its echo a log-probability of 0 (it is certain); penalties and biases mean nothing to it. It
refuses a ``response_format`` (an echo cannot be held to a schema).

With ``cache_tokens`` (``--echo-cache-tokens``) it keeps a simulated prefix cache
(``simulated_cache.py``): each prompt's leading blocks that the cache holds are its
``cached_tokens``, and ``prefill_us_per_token`` (``--echo-prefill-us-per-token``) makes every
token it does not hold cost that long before the batch's decode steps, as a GPU's prefill would.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Literal

from genq.common.errors import InvalidRequest
from genq.common.formats import ResponseFormat
from genq.worker.engines.base import (
    BatchReport,
    GenerationInput,
    GenerationOutput,
    StoppedEarly,
    cut_at_stop,
    expand_choices,
    gather_choices,
    logprob_entries,
)
from genq.worker.engines.simulated_cache import SimulatedPrefixCache
from genq.worker.policy.sizing import BatchLimits


class EchoEngine:
    """Returns each prompt's first max_new_tokens bytes (cut at a stop string) as its output."""

    name = "echo"
    stoppable = True
    limits: BatchLimits | None = None
    max_context_tokens: int | None = None
    tokenizer = None
    """No chat template: a chat is echoed as its ``role: content`` transcript."""

    def __init__(
        self, step_ms: float = 0.0, prefill_us_per_token: float = 0.0, cache_tokens: int = 0
    ) -> None:
        self.step_ms = step_ms
        self.prefill_us_per_token = prefill_us_per_token
        self.cache = SimulatedPrefixCache(cache_tokens)
        self.prefix_room = cache_tokens

    @property
    def ms_per_step(self) -> float | None:
        """A batch's time per decode step, known before it runs (``step_ms``; prefill not
        counted): the static runner's first batch needs no guess."""
        return self.step_ms

    def tokenize(self, prompts: Sequence[str]) -> list[list[int]]:
        """Each prompt's UTF-8 bytes."""
        return [list(p.encode("utf-8")) for p in prompts]

    def constrain(self, fmt: ResponseFormat) -> None:
        """Refuse: the echo of a prompt cannot be held to a format."""
        raise InvalidRequest(
            f"response_format {fmt.type!r} needs a model: --engine echo only echoes the prompt "
            "(use static, continuous or vllm)"
        )

    def generate(
        self, batch: Sequence[GenerationInput], *, stop: threading.Event | None = None
    ) -> BatchReport:
        """Echo each prompt, within its own limits (``n`` times for a row with ``n``); with
        ``stop``, ``StoppedEarly`` as soon as it is set (its steps are one wait)."""
        if any(r.n > 1 for r in batch):
            rows, counts = expand_choices(batch)
            report = self.generate(rows, stop=stop)
            return replace(report, outputs=gather_choices(report.outputs, counts))
        cached = [0] * len(batch)
        if self.cache.capacity_blocks:  # --echo-cache-tokens: a simulated prefix cache
            cached = [self.cache.lookup(r.prompt_ids) for r in batch]
            for r in batch:
                self.cache.insert(r.prompt_ids)
        computed = sum(len(r.prompt_ids) for r in batch) - sum(cached)
        wait_s = self.prefill_us_per_token * computed / 1e6
        if self.step_ms > 0 and batch:
            wait_s += self.step_ms * max(r.max_new_tokens for r in batch) / 1000
        if stop is not None and stop.wait(wait_s):
            raise StoppedEarly
        if stop is None and wait_s > 0:
            time.sleep(wait_s)
        outputs = []
        for row, hit in zip(batch, cached, strict=True):
            data = bytes(row.prompt_ids)
            kept = data[: row.max_new_tokens]
            text, stopped = cut_at_stop(kept.decode("utf-8", errors="ignore"), row.stop)
            n = len(text.encode("utf-8")) if stopped else len(kept)
            reason: Literal["stop", "length"] = (
                "stop" if stopped or len(data) <= row.max_new_tokens else "length"
            )
            out = GenerationOutput(
                text=text, completion_tokens=n, finish_reason=reason, cached_tokens=hit
            )
            if row.logprobs is not None:  # each byte is certain: log-probability 0
                top = 1 if row.logprobs else 0
                steps = [(b, 0.0, [(b, 0.0)][:top]) for b in data[:n]]
                out.logprobs = logprob_entries(_byte_text, steps)
            outputs.append(out)
        prompt_tokens = sum(len(r.prompt_ids) for r in batch)
        return BatchReport(
            outputs=outputs,
            prompt_tokens=prompt_tokens,
            padded_prompt_tokens=prompt_tokens,
            decode_slots=sum(o.completion_tokens for o in outputs),
        )


def _byte_text(tokens: list[int]) -> str:
    return bytes(tokens).decode("utf-8", errors="replace")
