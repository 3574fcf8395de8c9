"""``--engine vllm``: vLLM's engine fed straight from the queue.

An ``IterationEngine`` (the continuous runner drives it, as it drives ``--engine continuous``):
the worker submits each request the moment its token budget has room and writes each result
the moment that request finishes. vLLM's ``LLMEngine`` runs in one thread of its own here
(``genq-vllm``), stepping while anything is unfinished; the worker's loop never calls into it.
The two talk through two queues: commands in (add, abort), outputs out. That keeps vLLM's
engine single-threaded, as it expects, and lets the model compute while the loop talks to Redis.

Per request: greedy or sampled with its own temperature, top-k, top-p and **seed** (vLLM keeps a
generator per seeded request, so a seed reproduces a sample whatever else runs beside it: no
side path as in ``continuous``), stop strings (vLLM's: cut before the string, the string not
returned), ``max_new_tokens`` and eos. Streaming requests get cumulative outputs each step and
send what is new (vLLM holds back text that may be the start of a stop string); the others get
only their final output. A cancelled or expired request is aborted inside the engine, freeing
its slot and KV blocks at the next step.

Priority and preemption: each request carries its priority into vLLM's priority
scheduler (``vllm_args``). vLLM preempts only when its KV cache runs short, which genq's budget
prevents, so the worker preempts itself (``ContinuousRunner.rebalance``, as on
``continuous``): ``pause`` aborts a running low request's run and ``resume`` adds it again from
its prompt under a new run id (greedy or seeded, it ends as it would have; its prompt's blocks
are likely still in the prefix cache).

Sizing: the KV cache is sized from the worker's token budget, as ``continuous`` sizes its paged
cache: ``max_batch_tokens`` plus one block per request (in the block size vLLM chose: 128
tokens on a CPU), plus ``--prefix-cache-tokens`` of room where the prefixes of earlier
requests survive (vLLM's automatic prefix caching; on a GPU, by default, vLLM sizes the cache
from the device's free memory, and all it has beyond the batch is that room). genq admits a
request only while the running requests' prompt + ``max_new_tokens`` fit the budget, so vLLM
never has to preempt (cached blocks nobody runs are evicted, never preempted).
``--vllm-args`` (JSON) passes any other ``EngineArgs`` through; ``gpu_memory_utilization`` or
``kv_cache_memory_bytes`` there replace genq's sizing.

Failures: a request vLLM refuses (``add_request`` raises) fails alone. An exception from a step
means the engine is broken: ``poll`` raises it, the worker exits, and what it ran stays pending
for the fleet (a request that kills engines ends as poison after ``max_attempts``).
"""

from __future__ import annotations

import logging
import queue
import tempfile
import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

from genq.common.errors import ConfigError, GenqError, InvalidRequest
from genq.common.formats import ResponseFormat
from genq.worker.engines.adapters import BASE
from genq.worker.engines.base import (
    BatchReport,
    GenerationInput,
    GenerationOutput,
    LogitAdjust,
    combine_choices,
    logprob_entries,
    run_to_completion,
)
from genq.worker.engines.reaper import start_reaper, stop_reaper
from genq.worker.engines.vllm_args import BLOCK_TOKENS, lora_requests, worker_engine_args
from genq.worker.policy.sizing import BatchLimits, kv_cache_tokens

log = logging.getLogger("genq.worker")

VLLM_PRIORITY = {"high": 0, "normal": 1, "low": 2}
"""genq's priorities as vLLM's (it serves the lowest value first)."""

CORE_WAIT_S = 0.1
"""While vLLM's engine core computes a step, the engine thread blocks until the core's output
arrives or a request is submitted (``_wait_for_core``); this is only the longest such wait, a
safety net. (It looked every 1 ms before: 7% of a core on a 2-core machine, taken from vLLM.)"""


class EngineFailed(RuntimeError):
    """vLLM's engine raised during a step: it cannot be trusted with more work."""


def _adjustments(adjust: LogitAdjust | None) -> dict[str, Any]:
    """A row's ``LogitAdjust`` as vLLM's SamplingParams fields (vLLM has each of them)."""
    if adjust is None:
        return {}
    return {
        "frequency_penalty": adjust.frequency_penalty,
        "presence_penalty": adjust.presence_penalty,
        "repetition_penalty": adjust.repetition_penalty,
        "logit_bias": dict(adjust.logit_bias) or None,
        "min_tokens": adjust.min_tokens,
        "ignore_eos": adjust.ignore_eos,
    }


class VllmEngine:
    """Requests are submitted and finish one by one; ``generate`` is a convenience on top."""

    name = "vllm"
    limits: BatchLimits | None = None

    def __init__(self, engine: Any) -> None:
        from vllm.exceptions import VLLMClientError
        from vllm.sampling_params import RequestOutputKind

        self._engine = engine
        self._kinds = RequestOutputKind
        self._refusals = (ValueError, TypeError, VLLMClientError)
        """What vLLM raises for one request it will not serve (an engine failure is not one)."""
        self.tokenizer = engine.get_tokenizer()
        self.max_context_tokens: int | None = engine.vllm_config.model_config.max_model_len
        self.block_tokens = int(engine.vllm_config.cache_config.block_size or BLOCK_TOKENS)
        self.prefix_room = 0
        """KV-cache tokens beyond the batch budget (``load`` counts them): prefixes kept."""
        self.reaper: Any = None
        """This process's reaper (``reaper.py``): vLLM's processes do not outlive it."""
        self.loras: dict[str, Any] = {}  # --lora: vLLM's LoRARequest by name (BASE on a CPU)
        self._zero_dir: tempfile.TemporaryDirectory[str] | None = None  # (lora_requests)
        # The loop's thread only, by key: the rows in flight, what to send vLLM to run each
        # again, its run's id in vLLM (a paused request runs again under a new one), the
        # paused, and what each stream has sent so far.
        self._rows: dict[str, GenerationInput] = {}
        self._added: dict[str, tuple[Any, Any, int, Any]] = {}
        self._run_of: dict[str, str] = {}
        self._key_of: dict[str, str] = {}  # run id -> key: the runs whose outputs count
        self._paused: set[str] = set()
        self._reruns = 0
        self._sent: dict[str, str] = {}
        self._commands: deque[tuple[str, Any, Any]] = deque()
        self._outputs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._wake = threading.Event()
        self._arriving = _core_outputs(engine)  # the core's outputs (multiprocess vLLM)
        self._closing = False
        self._failure: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="genq-vllm", daemon=True)
        self._thread.start()

    @classmethod
    def load(
        cls,
        model_name: str,
        device: str = "cpu",
        dtype: str = "auto",
        *,
        max_batch_tokens: int,
        max_batch_size: int,
        prefix_room_tokens: int | None = 0,
        vllm_args: Mapping[str, Any] | None = None,
        adapters: Mapping[str, str] | None = None,
    ) -> VllmEngine:
        """Start vLLM's engine on a model: a built-in name, a local directory or a hub id,
        with ``prefix_room_tokens`` of KV cache beyond the batch budget (None: vLLM sizes its
        cache from the device's free memory)."""
        args = worker_engine_args(
            model_name,
            device=device,
            dtype=dtype,
            max_batch_tokens=max_batch_tokens,
            max_batch_size=max_batch_size,
            prefix_room_tokens=prefix_room_tokens,
            vllm_args=vllm_args or {},
        )
        from vllm import EngineArgs, LLMEngine
        from vllm.config import StructuredOutputsConfig

        # Compact JSON and xgrammar, as the other engines (vLLM's per-request whitespace flag
        # is not read by its xgrammar backend: free whitespace let SmolLM2 loop on newlines).
        args.setdefault(
            "structured_outputs_config",
            StructuredOutputsConfig(backend="xgrammar", disable_any_whitespace=True),
        )
        try:
            engine_arguments = EngineArgs(**args)
        except TypeError as err:
            raise ConfigError(f"--vllm-args: {err}") from err
        reaper = start_reaper()  # ends vLLM's processes if this one is killed (-9 included)
        engine = cls(LLMEngine.from_engine_args(engine_arguments))
        engine.reaper = reaper
        engine.loras, engine._zero_dir = lora_requests(adapters or {}, device)
        # What vLLM made of it (its blocks, counted once its cache was allocated).
        blocks = engine._engine.vllm_config.cache_config.num_gpu_blocks or 0
        batch = kv_cache_tokens(
            budget=max_batch_tokens, size=max_batch_size, block_tokens=engine.block_tokens, room=0
        )
        engine.prefix_room = max(0, blocks * engine.block_tokens - batch)
        return engine

    # -- the loop's side ---------------------------------------------------------------------

    def tokenize(self, prompts: Sequence[str]) -> list[list[int]]:
        """Token ids of each prompt, with the model's special tokens (as vLLM would add them)."""
        ids: list[list[int]] = self.tokenizer(list(prompts), add_special_tokens=True)["input_ids"]
        return ids

    def constrain(self, fmt: ResponseFormat) -> Any:
        """vLLM's ``StructuredOutputsParams`` for a response format: vLLM compiles (and caches)
        the grammar itself, with its xgrammar backend, compact JSON as the other engines."""
        from vllm.sampling_params import StructuredOutputsParams

        spec: dict[str, Any]
        if fmt.type == "json_schema" and fmt.json_schema is not None:
            spec = {"json": fmt.json_schema.schema_}
        elif fmt.type == "json_object":
            spec = {"json": {"type": "object"}}
        elif fmt.type == "regex":
            spec = {"regex": fmt.regex}
        else:
            spec = {"choice": list(fmt.choice or ())}
        try:
            return StructuredOutputsParams(
                **spec, disable_any_whitespace=True, disable_additional_properties=True
            )
        except self._refusals as err:
            raise InvalidRequest(f"vLLM refused the response_format: {err}") from err

    def submit(self, key: str, row: GenerationInput) -> None:
        """Queue ``row`` for the engine; its output comes back from ``poll`` under ``key``."""
        from vllm.sampling_params import SamplingParams

        try:
            params = SamplingParams(
                max_tokens=row.max_new_tokens,
                n=row.n,
                temperature=row.temperature,
                top_p=row.top_p,
                top_k=row.top_k,
                seed=row.seed,
                stop=list(row.stop) or None,
                min_p=row.min_p,
                **_adjustments(row.adjust),
                logprobs=row.logprobs,
                structured_outputs=row.constraint,
                skip_special_tokens=True,
                output_kind=(
                    self._kinds.CUMULATIVE if row.on_text is not None else self._kinds.FINAL_ONLY
                ),
            )
        except self._refusals as err:  # e.g. vLLM's temperature range is [0, 2], genq's wider
            raise InvalidRequest(f"vLLM refused the request: {err}") from err
        self._rows[key] = row
        priority = VLLM_PRIORITY.get(row.priority, 1)
        lora = self.loras.get(row.adapter or BASE, self.loras.get(BASE))  # None: no adapters
        self._added[key] = ({"prompt_token_ids": row.prompt_ids}, params, priority, lora)
        self._start(key, key)

    def _start(self, key: str, run_id: str) -> None:
        self._run_of[key] = run_id
        self._key_of[run_id] = key
        self._command("add", run_id, self._added[key])

    def cancel(self, key: str) -> None:
        """Abort ``key`` inside the engine (its slot and KV blocks are freed at the next step);
        ``poll`` will not return it."""
        self._forget(key, abort=True)

    def _forget(self, key: str, *, abort: bool = False) -> None:
        """Drop what is kept for ``key``; ``abort``: and abort its run, unless paused."""
        self._sent.pop(key, None)
        self._added.pop(key, None)
        run_id = self._run_of.pop(key, None)
        if run_id is not None:
            self._key_of.pop(run_id, None)
        paused = key in self._paused
        self._paused.discard(key)
        if self._rows.pop(key, None) is not None and abort and run_id is not None and not paused:
            self._command("abort", run_id, None)

    def pause(self, key: str) -> bool:
        """Abort ``key``'s run inside the engine, keeping the request, its place free for
        another (preemption); ``resume`` runs it again from its prompt under a new run id.
        Greedy or seeded, it then generates exactly what it would have (vLLM keeps a generator
        per seed), and its stream sends nothing twice (``_sent``). False where it could not
        end the same (sampled without a seed) or is not running. If the run finished before
        its abort reached vLLM, its output still counts."""
        row = self._rows.get(key)
        if row is None or key in self._paused or (row.temperature > 0 and row.seed is None):
            return False
        self._paused.add(key)
        self._command("abort", self._run_of[key], None)
        return True

    def resume(self, key: str) -> None:
        """Run a paused request again, from its prompt (late outputs of its aborted run no
        longer count)."""
        if key not in self._paused:
            return
        self._paused.discard(key)
        self._key_of.pop(self._run_of[key], None)
        self._reruns += 1
        self._start(key, f"{key}~{self._reruns}")

    @property
    def in_flight(self) -> int:
        """Requests submitted and not yet returned by ``poll``."""
        return len(self._rows)

    def poll(self, timeout_s: float) -> list[tuple[str, GenerationOutput | str | GenqError]]:
        """Finished requests: (key, output) or (key, error message). Waits up to ``timeout_s``
        for the first engine output, then takes whatever else is ready; sends streaming text
        on the way. Raises EngineFailed once the engine thread has failed."""
        done: list[tuple[str, GenerationOutput | str | GenqError]] = []
        wait = timeout_s
        while True:
            try:
                item = self._outputs.get(timeout=wait) if wait > 0 else self._outputs.get_nowait()
            except queue.Empty:
                return done
            wait = 0.0
            if item is None:  # the engine thread failed
                raise EngineFailed(f"vLLM's engine failed: {self._failure!r}") from self._failure
            run_id, out = item
            key = self._key_of.get(run_id, "")
            row = self._rows.get(key)
            if row is None:  # a cancelled or replaced run's last words
                continue
            if isinstance(out, str | GenqError):
                self._forget(key)
                done.append((key, out))
                continue
            completion = out.outputs[0]
            if row.on_text is not None:
                self._stream(key, row, completion.text)
            if out.finished:
                self._forget(key)
                choices = [_generation_output(c, row.logprobs, self._decode) for c in out.outputs]
                for c in choices:  # the prompt's tokens vLLM's prefix cache had
                    c.cached_tokens = int(getattr(out, "num_cached_tokens", 0) or 0)
                done.append((key, choices[0] if row.n == 1 else combine_choices(choices)))

    def _decode(self, tokens: list[int]) -> str:
        text: str = self.tokenizer.decode(tokens, skip_special_tokens=True)
        return text

    def _stream(self, key: str, row: GenerationInput, text: str) -> None:
        """Send what ``text`` adds to what was sent; the first output sends a piece even when
        its token decodes to no text (empty), as ``vllm serve`` does: a client timing its
        first chunk sees the first token, not the first visible character."""
        sent = self._sent.get(key)
        if row.on_text is None:
            return
        if sent is None or (len(text) > len(sent) and text.startswith(sent)):
            self._sent[key] = text
            row.on_text(text[len(sent or "") :])

    def _command(self, what: str, key: str, payload: Any) -> None:
        if self._failure is not None:
            raise EngineFailed(f"vLLM's engine failed: {self._failure!r}") from self._failure
        self._commands.append((what, key, payload))
        self._wake_engine_thread()

    def _wake_engine_thread(self) -> None:
        """End the engine thread's wait: for the core's output, or for work."""
        self._wake.set()
        if self._arriving is not None:
            with self._arriving.not_empty:
                self._arriving.not_empty.notify_all()

    def generate(self, batch: Sequence[GenerationInput]) -> BatchReport:
        """Run ``batch`` to completion (for in-process use and benchmarks)."""
        return run_to_completion(self, batch)

    def close(self) -> None:
        """Stop the engine thread and vLLM's engine (its processes, if it has any)."""
        self._closing = True
        self._wake_engine_thread()
        self._thread.join(timeout=30)
        shutdown = getattr(self._engine.engine_core, "shutdown", None)
        if shutdown is not None:
            shutdown()
        stop_reaper(self.reaper)  # (vLLM's processes ended: a pool's next engine has its own)

    # -- the engine thread -------------------------------------------------------------------

    def _run(self) -> None:
        engine, arriving = self._engine, self._arriving
        try:
            while not self._closing:
                self._wake.clear()
                _apply_commands(engine, self._commands, self._outputs, self._refusals)
                if not engine.has_unfinished_requests():
                    self._wake.wait()
                    continue
                if arriving is not None and arriving.empty():
                    # vLLM's engine core steps on its own, in its process: wait for its next
                    # output here rather than inside step(), so that a request submitted
                    # meanwhile reaches the core now and joins its next step, as under
                    # `vllm serve`, and not the step after (~1 step of time to first token).
                    _wait_for_core(arriving, self._wake)
                    continue
                for out in engine.step():
                    self._outputs.put((out.request_id, out))
        except BaseException as err:  # the engine is broken: say so to the loop and stop
            log.exception("vLLM's engine failed")
            self._failure = err
            self._outputs.put(None)


def _apply_commands(
    engine: Any, commands: deque[tuple[str, Any, Any]], outputs: Any, refusals: Any
) -> None:
    """The engine thread's: send vLLM the requests added and aborted since its last step."""
    aborts = []
    while commands:
        what, key, payload = commands.popleft()
        if what == "abort":
            aborts.append(key)
            continue
        prompt, params, priority, lora = payload
        try:
            engine.add_request(key, prompt, params, priority=priority, lora_request=lora)
        except refusals as err:  # vLLM's refusal of this request alone
            outputs.put((key, InvalidRequest(f"vLLM refused the request: {err}")))
    if aborts:
        engine.abort_request(aborts)


def _wait_for_core(arriving: queue.Queue[Any], wake: threading.Event) -> None:
    """Block until the core's next output is in ``arriving`` or ``wake`` is set (a request
    submitted, or closing), at most ``CORE_WAIT_S``. The queue's own condition is what the
    core's output wakes (its ``put``) and what ``_wake_engine_thread`` notifies; ``wake`` is
    read under its lock, so no wake-up is lost between the look and the wait."""
    with arriving.not_empty:
        if not arriving.queue and not wake.is_set():  # (qsize() would take the same lock)
            arriving.not_empty.wait(CORE_WAIT_S)


def _core_outputs(engine: Any) -> queue.Queue[Any] | None:
    """The queue that vLLM's engine-core client fills with the core's outputs (its
    multiprocess client), or None (in-process: ``step()`` computes the step itself)."""
    found = getattr(getattr(engine, "engine_core", None), "outputs_queue", None)
    return found if isinstance(found, queue.Queue) else None


def _generation_output(
    completion: Any, top: int | None = None, decode: Callable[[list[int]], str] | None = None
) -> GenerationOutput:
    """genq's view of vLLM's final ``CompletionOutput``; with ``top`` (the row asked for
    logprobs), its log-probabilities, the eos that ended it left out."""
    reason: Literal["stop", "length"] = "length" if completion.finish_reason == "length" else "stop"
    out = GenerationOutput(
        text=completion.text, completion_tokens=len(completion.token_ids), finish_reason=reason
    )
    if top is not None and decode is not None and completion.logprobs is not None:
        ids = list(completion.token_ids)
        ended_on_eos = reason == "stop" and completion.stop_reason is None
        steps = []
        for token, ranked in zip(ids[: len(ids) - ended_on_eos], completion.logprobs, strict=False):
            likeliest = sorted(ranked.items(), key=lambda kv: kv[1].rank)
            best = [(t, lp.logprob) for t, lp in likeliest if lp.rank <= top][:top]
            steps.append((token, ranked[token].logprob, best))
        out.logprobs = logprob_entries(decode, steps)
    return out
