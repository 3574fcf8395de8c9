"""``--engine continuous``: iteration-level batching with transformers' continuous batching
manager (``model.init_continuous_batching``).

The manager runs the model in its own thread over a paged KV cache; requests join and leave the
running batch at every decode step. The worker adds requests the moment its token budget has room
and writes each result the moment that request finishes (see ``Worker.step_continuous``).

The paged cache is sized explicitly from the worker's budget (otherwise the manager sizes itself
from system memory and takes seconds to warm up): ``ceil(max_batch_tokens / PAGE_SIZE)`` pages
for the tokens, plus one page per request for rounding.

Semantics, same as ``static``: each request stops at its own ``max_new_tokens`` or eos; stop
strings are applied to the text and counted as in ``static`` (the manager has no stop strings, so
the request runs on to its limit: correct output, some wasted decode steps).

Sampled requests (temperature > 0), and requests with penalties, a logit bias, ``min_tokens``,
``ignore_eos``, ``logprobs``, a response format (the manager applies one set of logits processors to
all its requests) or ``n`` > 1, run apart from the manager (``runs_apart``). The manager can sample,
but from one global random stream for all its requests, so a request's seed could not make its
output reproducible. Instead, they run together as a static group (``static_group.py``: a
``StaticEngine`` batch with per-row temperature, top-k, top-p and a generator seeded from the
request's seed, in a thread of its own) once the manager is idle: the waiting ones of the highest
priority among them. Not both at once: two threads computing on two cores change the float rounding
of each other's matmuls enough to flip near-tied greedy picks (seen in the tests), and the
guarantee that a greedy request's output equals its output alone would be lost. So a greedy request
waits while a group runs, and while sampled requests of its priority or above wait; one of a higher
priority goes to the manager before them. A sampled request gets exactly the output ``--engine
static`` gives for its seed.

Priorities hold across the two (``preempt``, the worker's ``--preempt``): a request that outranks
the running group stops it at the next decode step; its rows wait to run again from their prompts
(a seed is fixed for each at submit, so they generate the same text, and their streams send nothing
twice), and the higher-priority request runs first. The cost is what the group had generated,
computed again.

A greedy request can be paused (``pause``: out of the running batch, its place free for
another, as preemption needs) and resumed (``resume``): it runs again from its prompt under a
new run id (outputs of the old run that arrive late are ignored), generates what it would
have, and its stream sends nothing twice."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any

from genq.common.errors import GenqError
from genq.common.formats import ResponseFormat
from genq.worker.engines.base import (
    BatchReport,
    GenerationInput,
    GenerationOutput,
    TextStreamer,
    cut_at_stop,
    run_to_completion,
)
from genq.worker.engines.grammar import Constraint
from genq.worker.engines.static import StaticEngine, load_model
from genq.worker.engines.static_group import StaticGroups
from genq.worker.policy.sizing import BatchLimits

PAGE_SIZE = 16
"""Tokens per KV-cache page; small, because every request rounds up to whole pages."""
STEP_MAX_TOKENS = 512
"""Most tokens (prefill chunks + one per decoding request) one forward step processes."""
GPU_STEP_MAX_TOKENS = 2048
"""On a GPU a step of 2,048 tokens costs about what 512 do: prompts are taken in fewer steps."""
GPU_OPTIONS: dict[str, Any] = {"use_async_batching": True, "use_cuda_graph": False}
"""On a GPU (measured on an H100, BENCHMARKS.md): the manager prepares the next step while the
GPU runs this one (+27% tokens/s), and captures no CUDA graphs (with requests joining and
leaving, shapes change at almost every step, and capturing them cost more than it saved: half
the tokens/s)."""
TESTED_TRANSFORMERS = "5.19.0"
"""The transformers this engine's use of continuous batching is tested against (the pin in
``pyproject.toml``; a test keeps the two equal)."""


def runs_apart(row: GenerationInput) -> bool:
    """Whether ``row`` runs in a static group, not in the manager (see the module's text)."""
    return (
        row.temperature > 0
        or row.adjust is not None
        or row.logprobs is not None
        or row.constraint is not None
        or row.n > 1
    )


class ContinuousEngine:
    """Requests are submitted and finish one by one; ``generate`` is a convenience on top."""

    name = "continuous"
    limits: BatchLimits | None = None

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        device: str = "cpu",
        max_batch_tokens: int,
        max_batch_size: int,
        prefix_room_tokens: int = 0,
        preempt: bool = False,
    ) -> None:
        # The static engine knows this model's eos, pad and context; reuse it for those.
        self._static = StaticEngine(model, tokenizer, device)
        self.model = model
        self.device = device
        self.tokenizer = tokenizer
        self.eos_token_ids = self._static.eos_token_ids
        self.max_context_tokens = self._static.max_context_tokens
        self.grammars = self._static.grammars
        self.max_batch_tokens = max_batch_tokens
        self.max_batch_size = max_batch_size
        self.prefix_room = prefix_room_tokens
        """Paged-cache tokens beyond the batch budget, where finished requests' prefixes stay
        (transformers' block sharing) until a new request needs the pages."""
        self._manager: Any = None
        self._cached: dict[str, int] = {}  # prompt tokens found in the cache, by key
        # Built now, not at the first request: a transformers whose continuous batching differs
        # fails here, one line at start, instead of killing the worker on its first request.
        self._configs = self._batching_configs()
        self._rows: dict[str, GenerationInput] = {}
        self.preempt = preempt
        """Whether a running static group stops for a row that outranks it (``--preempt``)."""
        self._groups = StaticGroups(self._static)  # what runs apart, waiting and running
        self._deferred: dict[str, GenerationInput] = {}  # greedy, waiting for the sampled ones
        self._streamers: dict[str, TextStreamer] = {}
        self._paused: dict[str, GenerationInput] = {}  # out of the batch until ``resume``
        self._runs: dict[str, str] = {}  # the manager's request id -> key (a run per resume)
        self._run_of: dict[str, str] = {}  # key -> its current run's id

    @classmethod
    def load(
        cls,
        model_name: str,
        device: str = "cpu",
        dtype: str = "auto",
        *,
        max_batch_tokens: int,
        max_batch_size: int,
        prefix_room_tokens: int = 0,
    ) -> ContinuousEngine:
        """Load a causal LM (``tiny``, a directory or a hub id) for continuous batching."""
        model, tokenizer = load_model(model_name, device, dtype)
        return cls(
            model,
            tokenizer,
            device=device,
            max_batch_tokens=max_batch_tokens,
            max_batch_size=max_batch_size,
            prefix_room_tokens=prefix_room_tokens,
        )

    def tokenize(self, prompts: Sequence[str]) -> list[list[int]]:
        """Token ids of each prompt, with the model's special tokens."""
        return self._static.tokenize(prompts)

    def _batching_configs(self) -> tuple[Any, Any]:
        """(ContinuousBatchingConfig, GenerationConfig) for the manager: the paged cache sized
        from the budget. Raises ``ConfigError`` naming the installed transformers when its
        continuous batching is not the one genq was written against."""
        import transformers
        from genq.common.errors import ConfigError

        try:
            from transformers import ContinuousBatchingConfig, GenerationConfig

            if not callable(getattr(self.model, "init_continuous_batching", None)):
                raise AttributeError("the model has no init_continuous_batching")
            on_gpu = self._static.device.startswith("cuda")
            config = ContinuousBatchingConfig(
                page_size=PAGE_SIZE,
                num_blocks=math.ceil(self.max_batch_tokens / PAGE_SIZE)
                + self.max_batch_size
                + math.ceil(self.prefix_room / PAGE_SIZE),
                max_batch_tokens=min(
                    GPU_STEP_MAX_TOKENS if on_gpu else STEP_MAX_TOKENS, self.max_batch_tokens
                ),
                max_requests_per_batch=self.max_batch_size,
                **(GPU_OPTIONS if on_gpu else {}),
            )
        except (ImportError, TypeError, AttributeError) as err:
            raise ConfigError(
                f"--engine continuous needs transformers' continuous batching as in "
                f"transformers {TESTED_TRANSFORMERS} (ContinuousBatchingConfig with page_size, "
                f"num_blocks, max_batch_tokens, max_requests_per_batch); this worker has "
                f"transformers {transformers.__version__}, where it failed: {err}. Install "
                f"transformers=={TESTED_TRANSFORMERS}, or use --engine static"
            ) from None
        generation = GenerationConfig(
            do_sample=False,
            max_new_tokens=1,
            eos_token_id=self.eos_token_ids or None,
            pad_token_id=self._static.pad_token_id,
        )
        return config, generation

    def _ensure_started(self) -> Any:
        if self._manager is None:
            import logging

            # The manager logs every start and stop at INFO; keep worker logs to genq's lines.
            logging.getLogger("ContinuousBatchingLogger").setLevel(logging.WARNING)
            config, generation = self._configs
            self._manager = self.model.init_continuous_batching(
                generation_config=generation, continuous_batching_config=config
            )
            self._manager.start()
        return self._manager

    def submit(self, key: str, row: GenerationInput) -> None:
        """Start generating ``row``; its output comes back from ``poll`` under ``key``."""
        groups = self._groups
        if runs_apart(row):
            groups.add(key, row)  # runs in a static group once the manager is idle
        else:
            if row.on_text is not None and key not in self._streamers:  # (a resumed one's stays)
                self._streamers[key] = TextStreamer(self._static._decode, self.eos_token_ids, row)
            if groups.running is not None or groups.ahead_of(row):
                self._deferred[key] = row
            else:
                self._add(key, row)
        if self.preempt:  # it does not wait for a lower group to end
            groups.outranked_by(row)

    def constrain(self, fmt: ResponseFormat) -> Constraint:
        """The compiled grammar of a response format (the static group runs constrained
        rows)."""
        return self._static.constrain(fmt)

    def _add(self, key: str, row: GenerationInput) -> None:
        self._rows[key] = row
        run = key if key not in self._run_of else f"{key}#{time.monotonic_ns()}"
        self._runs[run], self._run_of[key] = key, run
        self._ensure_started().add_request(
            row.prompt_ids,
            request_id=run,
            max_new_tokens=row.max_new_tokens,
            streaming=row.on_text is not None,
        )

    def _stop_run(self, key: str) -> None:
        run = self._run_of.pop(key, None)
        if run is not None:
            self._runs.pop(run, None)
            if self._manager is not None:
                self._manager.cancel_request(run)

    def cancel(self, key: str) -> None:
        """Stop generating ``key`` (running or paused) and free its place in the batch."""
        self._groups.drop(key)
        self._deferred.pop(key, None)
        self._paused.pop(key, None)
        self._streamers.pop(key, None)
        if self._rows.pop(key, None) is not None:
            self._stop_run(key)
        self._run_of.pop(key, None)

    def pause(self, key: str) -> bool:
        """Take ``key`` out of the running batch and keep it, its place free for another
        (preemption); ``resume`` runs it again. What it generated is dropped and computed
        again on resume: greedy or seeded, it then generates exactly what it would have, and
        its stream sends nothing twice (its streamer knows what it sent). A row of a running
        static group stops the group at the next decode step (its other rows run again when
        the manager is next idle). False where ``key`` is not running here."""
        row = self._rows.pop(key, None)
        if row is not None:
            self._stop_run(key)
            self._run_of[key] = ""  # its next run takes a new id: the old one's outputs are stale
        else:
            row = self._deferred.pop(key, None) or self._groups.take(key)
        if row is None:
            return False
        self._paused[key] = row
        return True

    def resume(self, key: str) -> None:
        """Put a paused request back into the running batch."""
        row = self._paused.pop(key, None)
        if row is not None:
            self.submit(key, row)

    @property
    def paused(self) -> list[str]:
        """The paused requests, in the order they were paused."""
        return list(self._paused)

    @property
    def in_flight(self) -> int:
        """Requests submitted and not yet returned by ``poll`` (paused ones included)."""
        return len(self._rows) + len(self._groups) + len(self._deferred) + len(self._paused)

    def poll(self, timeout_s: float) -> list[tuple[str, GenerationOutput | str | GenqError]]:
        """Finished requests: (key, output) or (key, error message). Waits up to ``timeout_s``
        for the first one, then takes whatever else is ready. While a static group runs, waits
        for it; with the manager idle, starts the waiting sampled rows of the highest priority
        as a group; greedy rows that waited for a group go to the manager once it ended."""
        done: list[tuple[str, GenerationOutput | str | GenqError]] = []
        groups = self._groups
        if groups.running is not None:
            if not groups.running.wait(timeout_s):
                return done
            done = list(groups.end(self._paused))
        for waited_key, waited in list(self._deferred.items()):
            if not groups.ahead_of(waited):
                del self._deferred[waited_key]
                self._add(waited_key, waited)
        if groups.waiting and not self._rows:
            groups.start()
            return done
        if self._manager is None or not self._rows:
            return done
        wait = 0.0 if done else timeout_s
        while True:
            out = self._manager.get_result(timeout=wait)
            if out is None:
                return done
            wait = 0.0
            key = self._runs.get(out.request_id)
            if key is None:  # a cancelled or paused run's last words
                continue
            if not out.is_finished():  # a streaming request's progress
                if key in self._streamers:
                    self._streamers[key].update(list(out.generated_tokens))
                continue
            self._streamers.pop(key, None)
            self._runs.pop(out.request_id, None)
            self._run_of.pop(key, None)
            row = self._rows.pop(key, None)
            if row is None:
                continue
            if out.error:
                done.append((key, str(out.error)))
            else:
                done.append((key, self._finish(row, list(out.generated_tokens))))

    def _finish(self, row: GenerationInput, tokens: list[int]) -> GenerationOutput:
        """Finish a row exactly as the static engine does, given where a stop string ended it
        (the manager knows no stop strings, so find that point here)."""
        stopped_at = None
        if row.stop:
            for k in range(1, len(tokens) + 1):
                if cut_at_stop(self._static._decode(tokens[:k]), row.stop)[1]:
                    stopped_at = k
                    break
        return self._static._finish_row(row, tokens, stopped_at)

    def generate(self, batch: Sequence[GenerationInput]) -> BatchReport:
        """Run ``batch`` to completion (for in-process use and benchmarks)."""
        return run_to_completion(self, batch)

    def close(self) -> None:
        """Stop the manager's thread (and a static group's)."""
        self._groups.close()
        if self._manager is not None:
            self._manager.stop(block=True)
            self._manager = None
