"""The small interface every engine implements, and what goes in and out of it.

An engine knows nothing of Redis: it tokenizes prompts (so the worker can cost them exactly)
and runs one batch of already-admitted requests.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol, runtime_checkable

from genq.common.errors import GenqError
from genq.common.formats import ResponseFormat
from genq.common.models import RequestBody
from genq.worker.policy.sizing import BatchLimits


@dataclass(slots=True, kw_only=True)
class GenerationInput:
    """One row of a batch. (Read-only by convention: not frozen, because one is made per
    request on the worker's hot path and a frozen dataclass costs four times as much to build.)"""

    prompt_ids: list[int]
    """The prompt in the engine's tokenizer (special tokens included)."""
    max_new_tokens: int
    """Never generate, return or count more tokens than this for this row."""
    temperature: float = 0.0
    """0 = greedy."""
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    """Seeds this row's own random generator: the same seed gives the same sample, whatever
    else is in the batch."""
    stop: tuple[str, ...] = ()
    """The row ends before the first of these strings; the string is not returned."""
    min_p: float = 0.0
    """Sampled rows: tokens below ``min_p`` x the likeliest one's probability are dropped."""
    adjust: LogitAdjust | None = None
    """Penalties, biases and eos rules for this row's logits (None: none, the fast path)."""
    logprobs: int | None = None
    """Return each generated token's log-probability and this many likeliest at each position
    (None: none)."""
    n: int = 1
    """Choices to generate (``RequestBody.n``): engines run the row n times
    (``expand_choices``), or natively (vLLM)."""
    constraint: Any = None
    """What the engine's ``constrain`` made of the request's ``response_format`` (None: free
    text): the row may generate only what it allows."""
    priority: str = "normal"
    """The request's priority (``high``, ``normal``, ``low``): vLLM's scheduler orders by it."""
    adapter: str | None = None
    """The model the request named: one of the engine's LoRA adapters runs the row through it
    (``--lora``); any other name (the base model's), or None, through the base model."""
    on_text: Callable[[str], None] | None = field(default=None, compare=False)
    """If set, called with each new piece of text as it is generated (streaming)."""
    inputs: list[list[int]] | None = None
    """An embedding request's inputs, each within the model's tokens (``prompt_ids`` holds
    them end to end, their cost): an embedding engine makes one vector of each."""
    normalize: bool | None = None
    """Embeddings: scale each vector to length 1 (None: as the model does)."""
    scope: str = ""
    """Embeddings: the rows whose identical inputs may be computed once: those of one tenant
    (its name), or of all the tenants that share (``share_prefixes``: ``SHARED_SCOPE``)."""


SHARED_SCOPE = " shared"
"""The scope of the tenants that share (no tenant's name has a space)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LogitAdjust:
    """What a row asks done to its logits at each step before a token is picked (in this
    order, as vLLM does): penalties, the bias, then eos masked while it may not end."""

    frequency_penalty: float = 0.0
    """Minus this x the times a token was generated so far (OpenAI's)."""
    presence_penalty: float = 0.0
    """Minus this once for a token generated so far (OpenAI's)."""
    repetition_penalty: float = 1.0
    """A token in the prompt or generated: positive logit / this, negative x this."""
    logit_bias: tuple[tuple[int, float], ...] = ()
    """(token id, added to its logit)."""
    min_tokens: int = 0
    """eos is masked until this many tokens are generated."""
    ignore_eos: bool = False
    """eos is always masked."""

    @property
    def needs_history(self) -> bool:
        """Whether the tokens so far matter (any penalty is on)."""
        return bool(self.frequency_penalty or self.presence_penalty) or (
            self.repetition_penalty != 1.0
        )


def logit_adjust(r: RequestBody) -> LogitAdjust | None:
    """A request's logit adjustments, or None when it asks for none (most requests: checked
    field by field first, since this runs for every request the worker starts)."""
    if not (
        r.frequency_penalty
        or r.presence_penalty
        or r.repetition_penalty != 1.0
        or r.logit_bias
        or r.min_tokens
        or r.ignore_eos
    ):
        return None
    adjust = LogitAdjust(
        frequency_penalty=r.frequency_penalty,
        presence_penalty=r.presence_penalty,
        repetition_penalty=r.repetition_penalty,
        logit_bias=tuple((int(k), v) for k, v in r.logit_bias.items() if v),
        min_tokens=r.min_tokens,
        ignore_eos=r.ignore_eos,
    )
    return None if adjust == NO_ADJUST else adjust


NO_ADJUST = LogitAdjust()
LOGPROB_FLOOR = -9999.0
"""OpenAI's stand-in for a log-probability of minus infinity (JSON has no infinity)."""


def logprob_entries(
    decode: Callable[[list[int]], str],
    steps: Sequence[tuple[int, float, Sequence[tuple[int, float]]]],
) -> list[dict[str, Any]]:
    """``TokenLogprob``-shaped dicts for (token id, log-probability, [(id, log-probability) of
    the likeliest]) per generated token; each token's text is ``decode([id])``."""

    def one(token: int, logprob: float) -> dict[str, Any]:
        text = decode([token])
        value = logprob if logprob > LOGPROB_FLOOR else LOGPROB_FLOOR
        return {"token": text, "logprob": value, "bytes": list(text.encode())}

    return [
        {**one(token, lp), "top_logprobs": [one(t, v) for t, v in top]} for token, lp, top in steps
    ]


@dataclass(slots=True, kw_only=True)
class GenerationOutput:
    """What one row produced. (Read-only by convention, as GenerationInput.)"""

    text: str
    """Generated text, without the prompt, eos, or a matched stop string."""
    completion_tokens: int
    """Tokens generated for this row, up to and including the one that ended it."""
    finish_reason: Literal["stop", "length"]
    """``stop``: eos or a stop string; ``length``: reached its max_new_tokens."""
    logprobs: list[dict[str, Any]] | None = None
    """If the row asked: one ``TokenLogprob``-shaped dict per generated token (eos excluded)."""
    cached_tokens: int = 0
    """Prompt tokens the engine took from its prefix cache instead of computing them (0 where
    the engine cannot tell)."""
    choices: list[GenerationOutput] | None = None
    """For a row with ``n`` > 1: every choice (the fields above are the first's, but
    ``completion_tokens``, which counts them all)."""
    vectors: list[bytes] | None = None
    """An embedding row's vectors, one per input, as float32 little-endian bytes."""


def expand_choices(batch: Sequence[GenerationInput]) -> tuple[list[GenerationInput], list[int]]:
    """The rows to run for ``batch``: a row with ``n`` > 1 as n rows of one choice each (choice
    j of a seeded row seeded with seed + j); and each input row's count of them."""
    rows: list[GenerationInput] = []
    for r in batch:
        if r.n == 1:
            rows.append(r)
            continue
        for j in range(r.n):
            seed = None if r.seed is None else (r.seed + j) % 2**63
            rows.append(replace(r, n=1, seed=seed))
    return rows, [r.n for r in batch]


def gather_choices(
    outputs: Sequence[GenerationOutput], counts: Sequence[int]
) -> list[GenerationOutput]:
    """The outputs of ``expand_choices``'s rows as one per input row: a row of n choices has
    the first's text, finish reason and logprobs, all n as ``choices``, and their tokens."""
    out: list[GenerationOutput] = []
    at = 0
    for n in counts:
        if n == 1:
            out.append(outputs[at])
        else:
            out.append(combine_choices(list(outputs[at : at + n])))
        at += n
    return out


def combine_choices(choices: list[GenerationOutput]) -> GenerationOutput:
    """One output holding ``choices`` (see ``GenerationOutput.choices``)."""
    first = choices[0]
    return GenerationOutput(
        text=first.text,
        completion_tokens=sum(c.completion_tokens for c in choices),
        finish_reason=first.finish_reason,
        logprobs=first.logprobs,
        cached_tokens=first.cached_tokens,  # one prompt, whatever n
        choices=choices,
    )


@dataclass(frozen=True, kw_only=True)
class BatchReport:
    """The outputs of a batch, in input order, and what the batch cost."""

    outputs: list[GenerationOutput]
    prompt_tokens: int = 0
    """Real prompt tokens in the batch."""
    padded_prompt_tokens: int = 0
    """Prompt positions computed, padding included (rows x longest prompt for static)."""
    decode_slots: int = 0
    """Row-steps of decoding run (rows x steps for static); useful ones are completion tokens."""
    errors: dict[int, str] = field(default_factory=dict)
    """Rows that failed, by index, with the reason; their outputs entry is a placeholder."""
    adapter_loads: int = 0
    """LoRA adapters loaded for this batch (``--max-loras``: swaps)."""
    inputs: int = 0
    """Embedding inputs answered (each repeat counted)."""
    saved_inputs: int = 0
    """Of those, inputs not computed: an identical one in the batch was."""

    @property
    def completion_tokens(self) -> int:
        """Useful generated tokens."""
        return sum(o.completion_tokens for o in self.outputs)

    @property
    def cached_tokens(self) -> int:
        """Prompt tokens taken from the engine's prefix cache."""
        return sum(o.cached_tokens for o in self.outputs)

    @property
    def padding_fraction(self) -> float:
        """Share of prompt positions that were padding."""
        if not self.padded_prompt_tokens:
            return 0.0
        return 1.0 - self.prompt_tokens / self.padded_prompt_tokens

    @property
    def wasted_decode_fraction(self) -> float:
        """Share of decode row-steps spent on rows that had already finished."""
        if not self.decode_slots:
            return 0.0
        return max(0.0, 1.0 - self.completion_tokens / self.decode_slots)


class StoppedEarly(Exception):
    """A batch given a ``stop`` event ended when it was set, before its rows did: what it
    generated is dropped (run again from their prompts, greedy or seeded rows generate the
    same)."""


class Engine(Protocol):
    """What the worker needs from an engine. A new engine: a class with these, built in
    ``engines/__init__.py: make_engine`` under a new ``EngineName``; the runner, the turn and
    the queue's guarantees come with it. One that also has ``IterationEngine``'s methods is run
    by the continuous runner: ``make_runner`` checks at run time (``isinstance(engine,
    IterationEngine)``; the protocol is ``runtime_checkable``), so having ``submit``, ``poll``,
    ``cancel`` and ``close`` is what makes an engine iteration-level."""

    name: str
    """Its --engine name."""
    max_context_tokens: int | None
    """Prompt plus generated tokens may not exceed this (None: no limit)."""
    tokenizer: Any
    """The Hugging Face tokenizer whose chat template turns a chat request's messages into its
    prompt (``engines/chat.py``), or None: chats are then a plain ``role: content``
    transcript."""
    limits: BatchLimits | None
    """The batch limits ``make_engine`` chose for it (the settings', or sized to its device);
    None for an engine built directly: the settings' numbers, or a CPU's for ``auto``."""
    prefix_room: int
    """Prompt tokens of earlier requests' prefixes its cache keeps beyond the batch it runs
    (0: none outlive a batch). The worker counts itself as holding that much (``Holdings``)."""

    def tokenize(self, prompts: Sequence[str]) -> list[list[int]]:
        """Token ids of each prompt, as ``generate`` will see them."""
        ...

    def constrain(self, fmt: ResponseFormat) -> Any:
        """What a row needs (``GenerationInput.constraint``) to generate only output of
        ``fmt``, made once per distinct format; raise InvalidRequest when it cannot be
        enforced (the request fails alone, at admission)."""
        ...

    def generate(self, batch: Sequence[GenerationInput]) -> BatchReport:
        """Run one batch; outputs in input order. Must not return or count a token past a
        row's own max_new_tokens."""
        ...


class StoppableEngine(Engine, Protocol):
    """An engine whose batch can be stopped between two decode steps (``static``, ``echo``
    and a pool of static engines: ``stoppable`` True), for preemption on the static runner."""

    stoppable: bool

    def generate(
        self, batch: Sequence[GenerationInput], *, stop: threading.Event | None = None
    ) -> BatchReport:
        """``Engine.generate``; once ``stop`` is set, raise ``StoppedEarly`` at the next step."""
        ...


@runtime_checkable
class IterationEngine(Engine, Protocol):
    """An engine that batches at every decode step: requests are submitted one at a time and
    finish one at a time (``--engine continuous``)."""

    def submit(self, key: str, row: GenerationInput) -> None:
        """Start generating ``row``; raise InvalidRequest if this engine cannot serve it."""
        ...

    def poll(self, timeout_s: float) -> list[tuple[str, GenerationOutput | str | GenqError]]:
        """Finished requests since the last call: (key, output), (key, error message) for an
        engine failure, or (key, GenqError) for a request the engine refused (it fails with
        that error)."""
        ...

    def cancel(self, key: str) -> None:
        """Stop generating ``key`` and free its place; ``poll`` will not return it."""
        ...

    def close(self) -> None:
        """Stop background work."""
        ...


@runtime_checkable
class PausingEngine(IterationEngine, Protocol):
    """An iteration-level engine that can take a running request out of its batch and run it
    again later (preemption: ``policy/preemption.py``)."""

    def pause(self, key: str) -> bool:
        """Take ``key`` out of the running batch, keeping it; False if it cannot be."""
        ...

    def resume(self, key: str) -> None:
        """Run a paused request again (greedy: it ends as it would have)."""
        ...


def run_to_completion(engine: IterationEngine, batch: Sequence[GenerationInput]) -> BatchReport:
    """Submit ``batch`` to an iteration-level engine and wait for every row (its ``generate``,
    for in-process use, benchmarks and tests). Raises RuntimeError if a row fails."""
    keys = [f"g{time.monotonic_ns()}-{i}" for i in range(len(batch))]
    for key, row in zip(keys, batch, strict=True):
        engine.submit(key, row)
    outputs: dict[str, GenerationOutput] = {}
    while len(outputs) < len(keys):
        for key, out in engine.poll(1.0):
            if isinstance(out, str | GenqError):
                raise RuntimeError(str(out))
            outputs[key] = out
    prompt_tokens = sum(len(r.prompt_ids) for r in batch)
    report_outputs = [outputs[k] for k in keys]
    return BatchReport(
        outputs=report_outputs,
        prompt_tokens=prompt_tokens,
        padded_prompt_tokens=prompt_tokens,  # no padding: sequences are packed
        decode_slots=sum(o.completion_tokens for o in report_outputs),
    )


class TextStreamer:
    """Turns a row's growing token list into text deltas whose concatenation is a prefix of the
    row's final text: text after eos is dropped, a possible start of a stop string and an
    incomplete UTF-8 character are held back until they are settled."""

    def __init__(
        self, decode: Callable[[list[int]], str], eos_token_ids: Sequence[int], row: GenerationInput
    ) -> None:
        self.decode = decode
        self.eos = set(eos_token_ids)
        self.row = row
        self.sent = ""
        self.opened = False
        """Whether a piece was sent: the first token sends one even when it settles no text."""
        self.hold_chars = max((len(s) for s in row.stop), default=1) - 1

    def update(self, tokens: list[int]) -> None:
        """Emit (through ``row.on_text``) whatever new text ``tokens`` settle."""
        if self.row.on_text is None:
            return
        tokens = tokens[: self.row.max_new_tokens]
        for j, t in enumerate(tokens):
            if t in self.eos:
                tokens = tokens[:j]
                break
        text, stopped = cut_at_stop(self.decode(tokens), self.row.stop)
        if not stopped and self.hold_chars:
            text = text[: max(0, len(text) - self.hold_chars)]
        text = text.rstrip("\ufffd")
        if len(text) > len(self.sent) and text.startswith(self.sent):
            delta, self.sent = text[len(self.sent) :], text
        elif self.opened or not tokens:
            return
        else:  # the first token, with no text settled yet: an empty piece, as vLLM streams
            delta = ""  # it (a client timing its first chunk sees the first token now)
        self.opened = True
        self.row.on_text(delta)


class Replayed:
    """A streaming request's text over the runs of a batch that stopped and ran again from
    its prompts: each run generates the same text (greedy or seeded), so a run sends only what
    is past what the runs before it sent, and the first (empty) piece once."""

    def __init__(self, send: Callable[[str], None]) -> None:
        self.send = send
        self.sent = 0  # characters sent, by all runs
        self.seen = 0  # characters this run has produced
        self.opened = False

    def restart(self) -> None:
        """A run begins (from the prompt)."""
        self.seen = 0

    def __call__(self, delta: str) -> None:
        start, self.seen = self.seen, self.seen + len(delta)
        if self.seen > self.sent:
            self.send(delta[max(0, self.sent - start) :])
            self.sent = self.seen
        elif not delta and not self.opened:
            self.send(delta)
        self.opened = True


def cut_at_stop(text: str, stop: Sequence[str]) -> tuple[str, bool]:
    """Cut ``text`` before the earliest occurrence of any stop string; say whether one matched."""
    cut = len(text)
    for s in stop:
        i = text.find(s)
        if i != -1:
            cut = min(cut, i)
    return text[:cut], cut != len(text)
