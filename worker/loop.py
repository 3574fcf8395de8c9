"""The worker loop: small named steps around one Redis connection and one engine.

    start:  ensure_groups, resume (this consumer's own pending entries)
    loop:   read -> admit -> plan -> run -> write (results + events + ack + delete + stats,
            one round trip)
    stop:   SIGTERM stops reading, runs what is already held, writes, exits; a second
            signal exits at once.

A worker holds at most ``max_lookahead`` undelivered requests per priority, so the rest of
the queue stays available to other workers in the group.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

import redis
from genq.common.errors import GenerationError, GenqError
from genq.common.keys import DEAD_LETTER_MAX_ENTRIES, GROUP, Keys
from genq.common.models import ErrorInfo, Request, Result, Timings, Usage, now_ms
from genq.common.settings import WorkerSettings
from genq.common.wire import (
    UndecodableEntry,
    decode_request,
    encode_delta_event,
    encode_final_event,
)
from genq.worker.admission import Limits, check_limits, deadline_passed, entry_time_ms
from genq.worker.batching import PRIORITY_RANK, BatchPolicy, Candidate, next_batch
from genq.worker.engines.base import (
    BatchReport,
    Engine,
    GenerationInput,
    GenerationOutput,
    IterationEngine,
)
from genq.worker.stats import derived

log = logging.getLogger("genq.worker")

Entry = tuple[str, dict[bytes, bytes]]


@dataclass
class Held:
    """A request this worker has read and admitted, waiting in its look-ahead."""

    stream: str
    entry_id: str
    request: Request
    prompt_ids: list[int]
    enqueued_ms: int

    @property
    def key(self) -> str:
        """Unique among held entries: entry ids are unique only within one stream."""
        return held_key(self.stream, self.entry_id)


def held_key(stream: str, entry_id: str) -> str:
    """The look-ahead's key for an entry."""
    return f"{stream} {entry_id}"


@dataclass
class Running:
    """A request started in an iteration-level engine."""

    held: Held
    started: int
    cost_tokens: int


POLL_S = 0.02
"""How long the continuous loop waits for a finished request before checking Redis again."""


@dataclass
class Outcome:
    """A final result to write, and the entry to acknowledge for it."""

    stream: str
    entry_id: str
    result: Result


@dataclass
class Counters:
    """What the worker has done since it started; published in its stats hash."""

    batches: int = 0
    succeeded: int = 0
    failed: int = 0
    expired: int = 0
    dead_lettered: int = 0
    prompt_tokens: int = 0
    padded_prompt_tokens: int = 0
    completion_tokens: int = 0
    decode_slots: int = 0
    generation_ms: int = 0
    batch_sizes: list[int] = field(default_factory=list)

    def as_hash(self) -> dict[str, int]:
        return {k: v for k, v in vars(self).items() if isinstance(v, int)}

    def summary(self) -> str:
        d = derived(self.as_hash())
        return (
            f"succeeded={self.succeeded} failed={self.failed} expired={self.expired} "
            f"dead_lettered={self.dead_lettered} batches={self.batches} "
            f"mean_batch_size={d['mean_batch_size']:.1f} "
            f"padding_fraction={d['padding_fraction']:.3f} tokens_per_s={d['tokens_per_s']:.1f}"
        )


class Worker:
    """One worker process's loop. ``run()`` until ``stop()`` (or SIGTERM/SIGINT)."""

    def __init__(
        self,
        settings: WorkerSettings,
        engine: Engine,
        redis_client: redis.Redis | None = None,
    ) -> None:
        self.settings = settings
        self.engine = engine
        self.redis = redis_client or redis.Redis.from_url(settings.redis_url)
        self.keys = Keys(settings.queue)
        self.consumer = settings.consumer_name
        self.policy = BatchPolicy(
            max_batch_tokens=settings.max_batch_tokens,
            max_batch_size=settings.max_batch_size,
            max_wait_ms=settings.max_wait_ms,
            priority_aging_ms=settings.priority_aging_ms,
        )
        self.limits = Limits(
            max_new_tokens=settings.max_new_tokens_limit,
            max_prompt_tokens=settings.max_prompt_tokens,
            max_context_tokens=engine.max_context_tokens,
            max_batch_tokens=settings.max_batch_tokens,
        )
        self.held: dict[str, Held] = {}  # by held_key(stream, entry id)
        self.running: dict[str, Running] = {}  # in an iteration-level engine, by held key
        self.counters = Counters()
        self._stopping = threading.Event()
        self._signals = 0
        self._last_heartbeat = 0.0
        self.started_ms = now_ms()

    # -- lifecycle -----------------------------------------------------------------------

    def run(self) -> None:
        """Serve until stopped; then run what is held, write it, and log one summary line."""
        self._install_signal_handlers()
        self.ensure_groups()
        self.heartbeat(force=True)
        self.resume()
        log.info(
            "worker %s serving queue %r with engine %s",
            self.consumer,
            self.keys.queue,
            self.engine.name,
        )
        continuous = isinstance(self.engine, IterationEngine)
        step = self.step_continuous if continuous else self.step
        while not self._stopping.is_set():
            step()
        self.drain()
        self.redis.delete(self.keys.worker(self.consumer))
        log.info("worker %s stopped: %s", self.consumer, self.counters.summary())

    def stop(self) -> None:
        """Ask the loop to stop after the current step. Idempotent."""
        self._stopping.set()

    def _install_signal_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return

        def on_signal(signum: int, frame: FrameType | None) -> None:
            self._signals += 1
            if self._signals > 1:
                log.warning("second signal: exiting now; held entries stay pending")
                os._exit(1)
            log.info("signal %d: finishing held work, then exiting", signum)
            self.stop()

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)

    def step(self) -> None:
        """One turn of the loop: read, plan, and run a batch or wait for more."""
        self.heartbeat()
        self.admit(self.read(block_ms=None))
        decision = next_batch(self.candidates(), now_ms(), self.policy)
        if decision.batch:
            self.write(self.run_batch([self.held.pop(c.key) for c in decision.batch]))
        else:
            wait_ms = decision.wait_ms if self.held else self.settings.read_block_ms
            self.admit(self.read(block_ms=max(1, wait_ms)))

    def drain(self) -> None:
        """Run everything still held (no more reading), as a stopping worker must."""
        engine = self.engine
        if isinstance(engine, IterationEngine):
            while self.held or self.running:
                self.write(self.start_requests(engine))
                self.write(self.finish_requests(engine, POLL_S))
            engine.close()
            return
        no_waiting = dataclasses.replace(self.policy, max_wait_ms=0)  # nothing more will arrive
        while self.held:
            decision = next_batch(self.candidates(), now_ms(), no_waiting)
            self.write(self.run_batch([self.held.pop(c.key) for c in decision.batch]))

    # -- Redis steps -----------------------------------------------------------------------

    def ensure_groups(self) -> None:
        """Create the consumer group on every priority stream (and the streams) if missing.
        The group starts at the beginning, so requests sent before any worker ran are served."""
        for stream in self.keys.streams():
            try:
                self.redis.xgroup_create(stream, GROUP, id="0", mkstream=True)
            except redis.ResponseError as err:
                if "BUSYGROUP" not in str(err):
                    raise

    def resume(self) -> None:
        """Take back this consumer's own pending entries (a restart under the same name).
        Entries deleted while pending come back without fields: they are acknowledged."""
        total = 0
        for stream in self.keys.streams():
            start = "0"
            while self._room(stream) > 0:
                resp: Any = self.redis.xreadgroup(
                    GROUP, self.consumer, {stream: start}, count=self._room(stream)
                )
                entries = resp[0][1] if resp else []
                if not entries:
                    break
                start = entries[-1][0].decode()
                gone = [e[0] for e in entries if not e[1]]
                if gone:
                    self.redis.xack(stream, GROUP, *gone)
                live = [e for e in entries if e[1]]
                total += len(live)
                self.admit([(stream, live)])
        if total:
            log.info("resumed %d pending entries of consumer %s", total, self.consumer)

    def read(self, block_ms: int | None) -> list[tuple[Any, list[Any]]]:
        """New entries for this consumer. Non-blocking: one pipelined XREADGROUP per priority,
        each for as many as that priority has room for. Blocking: one XREADGROUP over all
        streams, woken by the first entry to arrive (used only when idle or waiting)."""
        room = {s: self._room(s) for s in self.keys.streams()}
        if block_ms is None:
            pipe = self.redis.pipeline(transaction=False)
            asked = [s for s, n in room.items() if n > 0]
            for s in asked:
                pipe.xreadgroup(GROUP, self.consumer, {s: ">"}, count=room[s])
            return [x for resp in pipe.execute() for x in (resp or [])] if asked else []
        streams: dict[Any, Any] = {s: ">" for s, n in room.items() if n > 0}
        if not streams:
            time.sleep(block_ms / 1000)
            return []
        count = min(room[s] for s in streams)
        resp: Any = self.redis.xreadgroup(
            GROUP, self.consumer, streams, count=count, block=block_ms
        )
        return resp or []

    def _room(self, stream: str) -> int:
        held = sum(1 for h in self.held.values() if h.stream == stream)
        return max(0, self.settings.max_lookahead - held)

    def write(self, outcomes: Sequence[Outcome]) -> None:
        """Write final results, their events, acks, deletes and stats in one round trip, as
        one MULTI/EXEC: a client that sees a result never sees its entry still pending."""
        if not outcomes:
            return
        ttl = self.settings.result_ttl_s
        pipe = self.redis.pipeline(transaction=True)
        for o in outcomes:
            data = o.result.model_dump_json()
            pipe.set(self.keys.result(o.result.id), data, ex=ttl)
            events = self.keys.events(o.result.id)
            pipe.xadd(events, encode_final_event(o.result))  # type: ignore[arg-type]
            pipe.expire(events, ttl)
        by_stream: dict[str, list[str]] = {}
        for o in outcomes:
            by_stream.setdefault(o.stream, []).append(o.entry_id)
        for stream, ids in by_stream.items():
            pipe.xack(stream, GROUP, *ids)
            pipe.xdel(stream, *ids)
        self._add_stats(pipe)
        pipe.execute()

    def heartbeat(self, force: bool = False) -> None:
        """Refresh this worker's stats key (at most once a second unless forced)."""
        now = time.monotonic()
        if not force and now - self._last_heartbeat < 1.0:
            return
        pipe = self.redis.pipeline(transaction=False)
        self._add_stats(pipe)
        pipe.execute()

    def _add_stats(self, pipe: Any) -> None:
        self._last_heartbeat = time.monotonic()
        key = self.keys.worker(self.consumer)
        recent = self.counters.batch_sizes[-100:]
        pipe.hset(
            key,
            mapping={
                **self.counters.as_hash(),
                "consumer": self.consumer,
                "host": socket.gethostname(),
                "pid": os.getpid(),
                "engine": self.engine.name,
                "model": self.settings.model if self.engine.name != "echo" else "-",
                "started_unix_ms": self.started_ms,
                "last_seen_unix_ms": now_ms(),
                "held": len(self.held),
                "recent_batch_sizes": json.dumps(recent),
            },
        )
        pipe.expire(key, self.settings.heartbeat_ttl_s)

    def dead_letter(self, stream: str, entry_id: str, fields: dict[Any, Any], why: str) -> None:
        """Record an entry with no usable id in the dead-letter stream, and drop it."""
        shown = {
            (k.decode("utf-8", "replace") if isinstance(k, bytes) else str(k)): (
                v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)
            )[:1000]
            for k, v in list(fields.items())[:20]
        }
        pipe = self.redis.pipeline(transaction=False)
        pipe.xadd(
            self.keys.dead_letter,
            {
                "stream": stream,
                "entry_id": entry_id,
                "error": why,
                "fields": json.dumps(shown),
                "worker": self.consumer,
                "at_unix_ms": now_ms(),
            },
            maxlen=DEAD_LETTER_MAX_ENTRIES,
            approximate=True,
        )
        pipe.xack(stream, GROUP, entry_id)
        pipe.xdel(stream, entry_id)
        pipe.execute()
        self.counters.dead_lettered += 1
        log.warning("dead-lettered entry %s of %s: %s", entry_id, stream, why)

    # -- admission -------------------------------------------------------------------------

    def admit(self, response: Sequence[tuple[Any, list[Any]]]) -> None:
        """Decode and check newly read entries. Runnable ones join the look-ahead; the rest
        are finished at once (failed, expired) or dead-lettered, and written together."""
        decoded: list[tuple[str, str, Request]] = []
        outcomes: list[Outcome] = []
        now = now_ms()
        for raw_stream, entries in response:
            stream = raw_stream.decode() if isinstance(raw_stream, bytes) else raw_stream
            priority = self.keys.priority_of(stream)
            for raw_id, fields in entries:
                entry_id = raw_id.decode() if isinstance(raw_id, bytes) else raw_id
                if held_key(stream, entry_id) in self.held:
                    continue
                req = decode_request(priority, fields or {})
                if isinstance(req, UndecodableEntry):
                    if req.request_id is None:
                        self.dead_letter(stream, entry_id, fields or {}, str(req.error))
                    else:
                        outcomes.append(self._failed(stream, entry_id, req.request_id, req.error))
                elif deadline_passed(req, now):
                    outcomes.append(self._expired(stream, entry_id, req))
                else:
                    decoded.append((stream, entry_id, req))
        if decoded:
            token_ids = self.engine.tokenize([r.prompt for _, _, r in decoded])
            for (stream, entry_id, req), ids in zip(decoded, token_ids, strict=True):
                problem = check_limits(req, len(ids), self.limits)
                if problem is not None:
                    outcomes.append(self._failed(stream, entry_id, req.id, problem, req))
                    continue
                held = Held(stream, entry_id, req, ids, entry_time_ms(entry_id))
                self.held[held.key] = held
        self.write(outcomes)

    def candidates(self) -> list[Candidate]:
        """The look-ahead as the batching policy sees it."""
        return [
            Candidate(
                key=h.key,
                prompt_tokens=len(h.prompt_ids),
                max_new_tokens=h.request.max_new_tokens,
                enqueued_ms=h.enqueued_ms,
                priority_rank=PRIORITY_RANK[h.request.priority],
            )
            for h in self.held.values()
        ]

    # -- running ---------------------------------------------------------------------------

    def run_batch(self, batch: Sequence[Held]) -> list[Outcome]:
        """Run one batch in the engine; a failing batch is retried row by row so that one bad
        request cannot fail its batch-mates."""
        if not batch:
            return []
        started = now_ms()
        self._mark_running(batch, started)
        t0 = time.perf_counter()
        try:
            report = self.engine.generate([self._input(h) for h in batch])
        except Exception as err:  # an engine can raise anything; isolate the culprit(s)
            if len(batch) == 1:
                log.warning("request %s failed in the engine: %r", batch[0].request.id, err)
                return [
                    self._failed(
                        batch[0].stream,
                        batch[0].entry_id,
                        batch[0].request.id,
                        GenerationError(f"the engine failed on this request: {err}"),
                        batch[0].request,
                        started,
                    )
                ]
            log.warning("batch of %d failed (%r); retrying each request alone", len(batch), err)
            return [o for h in batch for o in self.run_batch([h])]
        generation_ms = int((time.perf_counter() - t0) * 1000)
        self._count_batch(report, len(batch), generation_ms)
        finished = now_ms()
        outcomes = [
            self._succeeded(h, out, started, finished, generation_ms, len(batch))
            for h, out in zip(batch, report.outputs, strict=True)
        ]
        return outcomes

    def _succeeded(
        self,
        h: Held,
        out: GenerationOutput,
        started: int,
        finished: int,
        generation_ms: int,
        batch_size: int,
    ) -> Outcome:
        self.counters.succeeded += 1
        result = Result(
            id=h.request.id,
            status="succeeded",
            priority=h.request.priority,
            text=out.text,
            finish_reason=out.finish_reason,
            usage=Usage(prompt_tokens=len(h.prompt_ids), completion_tokens=out.completion_tokens),
            timings=Timings(
                queued_unix_ms=h.enqueued_ms,
                started_unix_ms=started,
                finished_unix_ms=finished,
                queue_wait_ms=max(0, started - h.enqueued_ms),
                generation_ms=generation_ms,
            ),
            worker=self.consumer,
            batch_size=batch_size,
            metadata=h.request.metadata,
        )
        return Outcome(h.stream, h.entry_id, result)

    # -- continuous batching ---------------------------------------------------------------

    def step_continuous(self) -> None:
        """One turn with an iteration-level engine: top up the look-ahead, start requests while
        the token budget has room, and write each result as soon as it finishes."""
        engine = self.engine
        if not isinstance(engine, IterationEngine):
            raise TypeError(f"engine {engine.name!r} does not batch per iteration")
        self.heartbeat()
        self.admit(self.read(block_ms=None))
        self.write(self.start_requests(engine))
        self.write(self.finish_requests(engine, POLL_S if self.running else 0.0))
        if not self.running and not self.held:
            self.admit(self.read(block_ms=self.settings.read_block_ms))

    def start_requests(self, engine: IterationEngine) -> list[Outcome]:
        """Admit held requests into the running engine, by the batching policy, within what
        is left of the token budget and batch size."""
        used_tokens = sum(r.cost_tokens for r in self.running.values())
        free_tokens = self.policy.max_batch_tokens - used_tokens
        free_slots = self.policy.max_batch_size - len(self.running)
        if not self.held or free_slots <= 0 or free_tokens <= 0:
            return []
        policy = dataclasses.replace(
            self.policy, max_batch_tokens=free_tokens, max_batch_size=free_slots, max_wait_ms=0
        )
        decision = next_batch(self.candidates(), now_ms(), policy)
        if self.running and decision.tokens > free_tokens:
            return []  # the most urgent request does not fit yet: wait for room
        started = now_ms()
        batch = [self.held.pop(c.key) for c in decision.batch]
        self._mark_running(batch, started)
        outcomes = []
        for h in batch:
            try:
                engine.submit(h.key, self._input(h))
            except GenqError as err:
                outcomes.append(
                    self._failed(h.stream, h.entry_id, h.request.id, err, h.request, started)
                )
                continue
            self.running[h.key] = Running(h, started, len(h.prompt_ids) + h.request.max_new_tokens)
        self.counters.batches += 1
        self.counters.batch_sizes.append(len(self.running))
        del self.counters.batch_sizes[:-1000]
        return outcomes

    def finish_requests(self, engine: IterationEngine, timeout_s: float) -> list[Outcome]:
        """Results of the requests that finished (waiting up to ``timeout_s`` for one)."""
        if not self.running:
            return []
        t0 = time.perf_counter()
        done = engine.poll(timeout_s)
        self.counters.generation_ms += int((time.perf_counter() - t0) * 1000)
        finished = now_ms()
        outcomes = []
        for key, out in done:
            run = self.running.pop(key, None)
            if run is None:
                continue
            h = run.held
            if isinstance(out, str):
                err = GenerationError(f"the engine failed on this request: {out}")
                outcomes.append(
                    self._failed(h.stream, h.entry_id, h.request.id, err, h.request, run.started)
                )
                continue
            c = self.counters
            c.prompt_tokens += len(h.prompt_ids)
            c.padded_prompt_tokens += len(h.prompt_ids)
            c.completion_tokens += out.completion_tokens
            c.decode_slots += out.completion_tokens
            outcomes.append(
                self._succeeded(
                    h, out, run.started, finished, finished - run.started, len(self.running) + 1
                )
            )
        return outcomes

    def _input(self, h: Held) -> GenerationInput:
        """The engine's view of a held request; a streaming one sends its text as it comes."""
        if not h.request.stream:
            return _input(h)
        events = self.keys.events(h.request.id)
        ttl = self.settings.result_ttl_s

        def send(text: str) -> None:
            # One round trip per piece: streaming is opt-in, and a piece per decode step is
            # what a streaming client asked for.
            pipe = self.redis.pipeline(transaction=False)
            pipe.xadd(events, encode_delta_event(text))  # type: ignore[arg-type]
            pipe.expire(events, ttl)
            pipe.execute()

        return _input(h, send)

    def _mark_running(self, batch: Sequence[Held], started: int) -> None:
        pipe = self.redis.pipeline(transaction=False)
        for h in batch:
            running = Result(
                id=h.request.id,
                status="running",
                priority=h.request.priority,
                timings=Timings(queued_unix_ms=h.enqueued_ms, started_unix_ms=started),
                worker=self.consumer,
                metadata=h.request.metadata,
            )
            # XX: only if the request still has a state to update; KEEPTTL: the client's TTL.
            pipe.set(
                self.keys.result(h.request.id), running.model_dump_json(), xx=True, keepttl=True
            )
        pipe.execute()

    def _count_batch(self, report: BatchReport, size: int, generation_ms: int) -> None:
        c = self.counters
        c.batches += 1
        c.batch_sizes.append(size)
        del c.batch_sizes[:-1000]
        c.prompt_tokens += report.prompt_tokens
        c.padded_prompt_tokens += report.padded_prompt_tokens
        c.completion_tokens += report.completion_tokens
        c.decode_slots += report.decode_slots
        c.generation_ms += generation_ms

    def _failed(
        self,
        stream: str,
        entry_id: str,
        request_id: str,
        error: GenqError,
        request: Request | None = None,
        started: int | None = None,
    ) -> Outcome:
        self.counters.failed += 1
        log.info("request %s failed: %s", request_id, error)
        return Outcome(
            stream,
            entry_id,
            self._final(
                stream,
                entry_id,
                request_id,
                "failed",
                request,
                ErrorInfo(code=error.code, message=str(error)),
                started,
            ),
        )

    def _expired(self, stream: str, entry_id: str, request: Request) -> Outcome:
        self.counters.expired += 1
        return Outcome(
            stream,
            entry_id,
            self._final(
                stream,
                entry_id,
                request.id,
                "expired",
                request,
                ErrorInfo(
                    code="expired", message="the request's deadline passed before it started"
                ),
                None,
            ),
        )

    def _final(
        self,
        stream: str,
        entry_id: str,
        request_id: str,
        status: Any,
        request: Request | None,
        error: ErrorInfo,
        started: int | None,
    ) -> Result:
        finished = now_ms()
        queued = entry_time_ms(entry_id)
        return Result(
            id=request_id,
            status=status,
            priority=request.priority if request else self.keys.priority_of(stream),
            error=error,
            timings=Timings(
                queued_unix_ms=queued,
                started_unix_ms=started,
                finished_unix_ms=finished,
                queue_wait_ms=None if started is None else max(0, started - queued),
            ),
            worker=self.consumer,
            metadata=request.metadata if request else {},
        )


def _input(h: Held, on_text: Callable[[str], None] | None = None) -> GenerationInput:
    r = h.request
    return GenerationInput(
        on_text=on_text,
        prompt_ids=h.prompt_ids,
        max_new_tokens=r.max_new_tokens,
        temperature=r.temperature,
        top_p=r.top_p,
        top_k=r.top_k,
        seed=r.seed,
        stop=tuple(r.stop),
    )
