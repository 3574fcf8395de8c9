"""The worker loop: small named steps around one Redis connection and one engine.

    start:  ensure_groups, resume (this consumer's own pending entries)
    loop:   reclaim (entries of dead workers) -> read -> admit -> plan -> start (mark running;
            drop cancelled, expire late) -> run -> write (results + events + ack + delete +
            stats, one round trip; the ack and the result are one atomic script)
    beside: a ClaimKeeper thread renews this worker's claims and heartbeat (recovery.py)
    stop:   SIGTERM stops reading, runs what is already held for up to shutdown_grace_s,
            writes, exits; a second signal exits at once. Whatever is left stays pending and
            is taken over by other workers.

Redis going away (a dropped connection, a restarting redis-server) never loses work: each
command is retried with backoff, the loop waits and retries on top of that, and results not yet
written are kept and written first once Redis is back (writing is idempotent).

A worker holds at most ``max_lookahead`` undelivered requests per priority, so the rest of
the queue stays available to other workers in the group.
"""

from __future__ import annotations

import contextlib
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

import orjson
import redis
from genq.common.connection import (
    REDIS_ERRORS,
    TRANSIENT_ERRORS,
    connect,
    is_cluster,
    refresh_cluster_view,
)
from genq.common.errors import GenerationError, GenqError, PoisonRequest
from genq.common.keys import GROUP, Keys
from genq.common.models import (
    FINAL_STATUSES,
    ErrorInfo,
    Request,
    Result,
    Timings,
    now_ms,
)
from genq.common.scripts import MAX_QUEUE_DEPTH_FIELD, apply
from genq.common.settings import WorkerSettings
from genq.common.wire import (
    UndecodableEntry,
    decode_request,
    encode_delta_event,
    encode_request,
)
from genq.worker import recovery
from genq.worker.admission import Limits, check_limits, deadline_passed, entry_time_ms
from genq.worker.batching import PRIORITY_RANK, BatchPolicy, Candidate, next_batch
from genq.worker.chat import prompt_text
from genq.worker.dead_letter import add_to_pipeline, dead_letter_fields
from genq.worker.engines.base import (
    BatchReport,
    Engine,
    GenerationInput,
    GenerationOutput,
    IterationEngine,
)
from genq.worker.metrics import Metrics
from genq.worker.stats import derived
from genq.worker.writer import ResultWriter

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
    deliveries: int = 1
    """How many times Redis has delivered the entry. Above 1, a worker died holding it: it
    runs alone, so that if it is what kills workers, it takes no batch-mates with it (their
    delivery counts would grow too, and they would fail as poison with it)."""

    key: str = field(init=False)
    """Unique among held entries: entry ids are unique only within one stream."""
    candidate: Candidate = field(init=False)
    """The request as the batching policy sees it (built once: the policy runs each turn)."""

    def __post_init__(self) -> None:
        self.key = held_key(self.stream, self.entry_id)
        self.candidate = Candidate(
            key=self.key,
            prompt_tokens=len(self.prompt_ids),
            max_new_tokens=self.request.max_new_tokens,
            enqueued_ms=self.enqueued_ms,
            priority_rank=PRIORITY_RANK[self.request.priority],
        )

    @property
    def suspect(self) -> bool:
        """Delivered before: run alone."""
        return self.deliveries > 1


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
CANCEL_CHECK_S = 0.25
"""How often the continuous loop looks for cancelled running requests."""
SETTLE_S = 1.0
"""How long a turn waits for the writer before a suspect runs (see ``Worker._ready_for``)."""


@dataclass
class Outcome:
    """A final result to write (already as JSON: this is the hot path), and the entry to
    acknowledge for it."""

    stream: str
    entry_id: str
    request_id: str
    status: str
    priority: str
    state_json: str
    queue_wait_ms: int | None = None
    completion_tokens: int = 0

    @classmethod
    def of(cls, stream: str, entry_id: str, result: Result) -> Outcome:
        """The outcome that writes ``result``."""
        return cls(
            stream, entry_id, result.id, result.status, result.priority or "normal",
            result.model_dump_json(), result.timings.queue_wait_ms,
            result.usage.completion_tokens,
        )  # fmt: skip


@dataclass
class Counters:
    """What the worker has done since it started; published in its stats hash."""

    batches: int = 0
    succeeded: int = 0
    failed: int = 0
    expired: int = 0
    dead_lettered: int = 0
    already_final: int = 0
    """Requests found final when about to start or write (cancelled, or finished elsewhere)."""
    reclaimed: int = 0
    oom_splits: int = 0
    prompt_tokens: int = 0
    padded_prompt_tokens: int = 0
    completion_tokens: int = 0
    decode_slots: int = 0
    generation_ms: int = 0
    batch_sizes: list[int] = field(default_factory=list)
    recent_waits_ms: list[int] = field(default_factory=list)
    """Queue waits of the last 1,000 requests that started (for the published percentiles)."""

    def as_hash(self) -> dict[str, int]:
        return {k: v for k, v in vars(self).items() if isinstance(v, int)}

    def summary(self) -> str:
        d = derived(self.as_hash())
        return (
            f"succeeded={self.succeeded} failed={self.failed} expired={self.expired} "
            f"dead_lettered={self.dead_lettered} already_final={self.already_final} "
            f"reclaimed={self.reclaimed} batches={self.batches} "
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
        self.redis = redis_client or connect(settings.redis_url)
        if redis_client is None and not is_cluster(self.redis):
            # Entries as Redis sends them: redis-py's parsing into dicts cost a tenth of the
            # worker's time on the hot path, and decode_request reads the flat field list.
            self.redis.set_response_callback("XREADGROUP", raw_read_reply)
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
        # Every entry this worker holds is in exactly one of: held (waiting), in_batch (in a
        # static batch), running (in an iteration-level engine), the writer (its result waits
        # to be written). The ClaimKeeper renews only these, so an entry dropped by mistake
        # would go idle and be taken over, never stuck.
        self.held: dict[str, Held] = {}  # by held_key(stream, entry id)
        self.in_batch: dict[str, Held] = {}
        self.running: dict[str, Running] = {}  # in an iteration-level engine, by held key
        self.writer: ResultWriter[Outcome] = ResultWriter(
            self._write_now,
            max_backlog=2 * settings.max_batch_size,
            on_away=lambda: refresh_cluster_view(self.redis),
        )
        self._stats_fields: dict[str, Any] = {}  # the latest, for the writer to publish
        self.counters = Counters()
        self._stopping = threading.Event()
        self._signals = 0
        self._last_heartbeat = 0.0
        self._last_reclaim = 0.0
        self._last_cancel_check = 0.0
        self._claim_cursors = dict.fromkeys(self.keys.streams(), "0-0")
        self._full_budget = settings.max_batch_tokens
        self._budget_restore_at: float | None = None
        self._after_suspect = False
        self.started_ms = now_ms()
        self._host, self._pid = socket.gethostname(), os.getpid()  # for the stats, each batch
        self.metrics = Metrics(self.keys.queue, settings.metrics_port)
        self.keeper = recovery.ClaimKeeper(
            connect(settings.redis_url) if redis_client is None else redis_client,
            self.keys,
            self.consumer,
            settings.claim_idle_ms,
            settings.heartbeat_ttl_s,
            self.claimed_entries,
        )

    # -- lifecycle -----------------------------------------------------------------------

    def run(self) -> None:
        """Serve until stopped; then run what is held, write it, and log one summary line."""
        self._install_signal_handlers()
        self._retrying(self.join)
        self.keeper.start()
        log.info(
            "worker %s serving queue %r with engine %s",
            self.consumer,
            self.keys.queue,
            self.engine.name,
        )
        continuous = isinstance(self.engine, IterationEngine)
        step = self.step_continuous if continuous else self.step
        while not self._stopping.is_set():
            self._retrying(step, once=True)
        try:
            self.drain()
        finally:
            self.writer.stop()
        self.account_written()
        self.keeper.stop()
        self.metrics.close()
        with contextlib.suppress(redis.RedisError):  # else the key expires on its own
            self.redis.delete(self.keys.worker(self.consumer))
        left = len(self.held) + len(self.running) + len(self.writer)
        tail = f" left_pending={left}" if left else ""
        log.info("worker %s stopped: %s%s", self.consumer, self.counters.summary(), tail)

    def join(self) -> None:
        """Join the queue: groups, queue config, heartbeat, then this consumer's own pending."""
        self.ensure_groups()
        self.heartbeat(force=True)
        self.resume()

    def _retrying(self, step: Callable[[], None], once: bool = False) -> None:
        """Run ``step``; while Redis is unreachable, wait with backoff and try again (once:
        return after one failed try, for the main loop to go round). A lost consumer group
        (a redis-server that restarted without its data) is recreated."""
        delay = 0.1
        while True:
            try:
                step()
                return
            except TRANSIENT_ERRORS as err:
                log.warning("Redis unreachable (%s); retrying in %.1f s", err, delay)
                refresh_cluster_view(self.redis)
            except redis.ResponseError as err:
                if "NOGROUP" not in str(err):
                    raise
                log.warning("consumer group missing (Redis lost its data?); recreating it")
                with contextlib.suppress(redis.RedisError):
                    self.ensure_groups()
            if self._stopping.wait(delay) or once:
                return
            delay = min(5.0, delay * 2)

    def claimed_entries(self) -> list[tuple[str, str]]:
        """(stream, entry id) of every entry this worker holds, in any stage. Called from the
        ClaimKeeper thread: dict.copy() and list() of a list are atomic under the GIL."""
        out = [(h.stream, h.entry_id) for h in self.held.copy().values()]
        out += [(h.stream, h.entry_id) for h in self.in_batch.copy().values()]
        out += [(r.held.stream, r.held.entry_id) for r in self.running.copy().values()]
        out += self.writer.entries()
        return out

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
        """One turn of the loop: reclaim, read, plan, and run a batch or wait for more."""
        self.heartbeat()
        self.reclaim()
        self.admit(self.read(block_ms=None))
        suspect = self.next_suspect()
        if not self._ready_for(suspect):
            return
        if suspect is not None:
            self.write(self.run_batch([self.held.pop(suspect.key)]))
            return
        decision = next_batch(self.candidates(), now_ms(), self.current_policy())
        if decision.batch:
            self.write(self.run_batch([self.held.pop(c.key) for c in decision.batch]))
        else:
            wait_ms = decision.wait_ms if self.held else self.settings.read_block_ms
            self.admit(self.read(block_ms=max(1, wait_ms)))

    def drain(self) -> None:
        """Run what is still held (no more reading) for up to ``shutdown_grace_s``; what is
        left after that stays pending in Redis and is taken over by other workers."""
        deadline = time.monotonic() + self.settings.shutdown_grace_s
        engine = self.engine
        if isinstance(engine, IterationEngine):
            while (self.held or self.running) and time.monotonic() < deadline:
                self._retrying(lambda: self.write(self.start_requests(engine)), once=True)
                self._retrying(lambda: self.write(self.finish_requests(engine, POLL_S)), once=True)
            engine.close()
        else:
            no_waiting = dataclasses.replace(self.current_policy(), max_wait_ms=0)

            def one_batch() -> None:
                suspect = self.next_suspect()
                if not self._ready_for(suspect):
                    return
                if suspect is not None:
                    self.write(self.run_batch([self.held.pop(suspect.key)]))
                    return
                decision = next_batch(self.candidates(), now_ms(), no_waiting)
                self.write(self.run_batch([self.held.pop(c.key) for c in decision.batch]))

            while self.held and time.monotonic() < deadline:
                self._retrying(one_batch, once=True)
        self.writer.flush(max(0.0, deadline - time.monotonic()))
        if self.held or self.running or len(self.writer):
            log.warning(
                "grace period over: %d held, %d running, %d unwritten requests stay pending "
                "for other workers",
                len(self.held),
                len(self.running),
                len(self.writer),
            )

    def _ready_for(self, suspect: Held | None) -> bool:
        """Whether the next batch may start. A request delivered before (a suspect: maybe
        the one that kills workers) starts only once every result handed to the writer is
        written, and so does the batch after it: a crash must not take finished results with
        it, or their requests would be started again and counted towards poison. Waits up to
        ``SETTLE_S`` for the writer (False: Redis is away, try again next turn)."""
        if suspect is None and not self._after_suspect:
            return True
        if not self.writer.flush(SETTLE_S):
            return False
        self._after_suspect = suspect is not None
        return True

    def next_suspect(self) -> Held | None:
        """The oldest held request that was delivered before (it runs alone), if any."""
        suspects = [h for h in self.held.values() if h.suspect]
        return min(suspects, key=lambda h: h.enqueued_ms) if suspects else None

    def current_policy(self) -> BatchPolicy:
        """The batching policy now: after an out-of-memory error the budget is halved for
        ``oom_backoff_s``, then restored."""
        if self._budget_restore_at is not None and time.monotonic() >= self._budget_restore_at:
            self._budget_restore_at = None
            self.policy = dataclasses.replace(self.policy, max_batch_tokens=self._full_budget)
            log.info("batch budget back to %d tokens", self._full_budget)
        return self.policy

    # -- Redis steps -----------------------------------------------------------------------

    def ensure_groups(self) -> None:
        """Create the consumer group on every priority stream (and the streams) if missing, and
        publish the queue's limits that producers enforce. The group starts at the beginning,
        so requests sent before any worker ran are served."""
        for stream in self.keys.streams():
            try:
                self.redis.xgroup_create(stream, GROUP, id="0", mkstream=True)
            except redis.ResponseError as err:
                if "BUSYGROUP" not in str(err):
                    raise
        self.redis.hset(self.keys.config, MAX_QUEUE_DEPTH_FIELD, str(self.settings.max_queue_depth))

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
                self.admit_delivered(stream, live)
        if total:
            log.info("resumed %d pending entries of consumer %s", total, self.consumer)

    def reclaim(self) -> None:
        """Take over entries idle for ``claim_idle_ms`` (their worker died: live workers renew
        theirs), at most every ``claim_idle_ms / 4`` and within this worker's look-ahead room."""
        now = time.monotonic()
        if now - self._last_reclaim < self.settings.claim_idle_ms / 4000:
            return
        self._last_reclaim = now
        for stream in self.keys.streams():
            room = self._room(stream)
            if room <= 0:
                continue
            cursor, entries = recovery.autoclaim(
                self.redis, stream, self.consumer, self.settings.claim_idle_ms, room,
                self._claim_cursors[stream],
            )  # fmt: skip
            self._claim_cursors[stream] = cursor
            if entries:
                self.counters.reclaimed += len(entries)
                log.info("took over %d entries of %s from dead workers", len(entries), stream)
                self.admit_delivered(stream, entries)

    def admit_delivered(self, stream: str, entries: list[Any]) -> None:
        """Admit entries delivered before (resumed or taken over). Each remembers how often it
        was delivered: one delivered before runs alone (``Held.suspect``)."""
        ids = [_text(e[0]) for e in entries]
        self.admit(
            [(stream, entries)], recovery.delivery_counts(self.redis, stream, self.consumer, ids)
        )

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
        """Hand final results to the writer (``worker/writer.py``), which writes them with their
        events, acknowledges and deletes their entries (one atomic script: no entry is
        acknowledged without its result) and publishes the stats, while the loop goes on. A
        request that is already final (cancelled, or finished by a worker that took it over)
        keeps its result; its entry is just acknowledged. Blocks while the writer is behind
        by more than two batches."""
        self.account_written()
        if not outcomes:
            return
        waits = self.counters.recent_waits_ms
        waits += [o.queue_wait_ms for o in outcomes if o.queue_wait_ms is not None]
        del waits[:-1000]
        self._stats_fields = self._stats()
        self.writer.put(list(outcomes))

    def _write_now(self, batch: list[Outcome]) -> list[int]:
        """The writer thread's call: one APPLY over ``batch`` plus the latest stats; then the
        Prometheus metrics (thread-safe) of the requests it ended."""
        items = [(o.request_id, o.stream, o.entry_id, o.state_json) for o in batch]
        fields = self._stats_fields
        written = apply(
            self.redis, self.keys, self.settings.result_ttl_s, "final", items,
            also=lambda pipe: self._add_stats(pipe, fields),
        )  # fmt: skip
        self.metrics.ended([o for o, w in zip(batch, written, strict=True) if w == 1])
        return written

    def account_written(self) -> None:
        """Count what the writer found already final since the last call (the counters are
        the loop's own: the writer thread never touches them)."""
        for _batch, written in self.writer.take_written():
            self.counters.already_final += sum(1 for w in written if w == 0)

    def heartbeat(self, force: bool = False) -> None:
        """Refresh this worker's stats key (at most once a second unless forced)."""
        self.account_written()
        now = time.monotonic()
        if not force and now - self._last_heartbeat < 1.0:
            return
        pipe = self.redis.pipeline(transaction=False)
        self._add_stats(pipe, self._stats())
        pipe.execute()
        c = self.counters
        held = len(self.held) + len(self.running) + len(self.in_batch)
        self.metrics.state(held, c.prompt_tokens, c.padded_prompt_tokens)

    def _add_stats(self, pipe: Any, fields: dict[str, Any]) -> None:
        self._last_heartbeat = time.monotonic()
        key = self.keys.worker(self.consumer)
        pipe.hset(key, mapping=fields)
        pipe.expire(key, self.settings.heartbeat_ttl_s)

    def _stats(self) -> dict[str, Any]:
        """The fields of this worker's stats hash, now."""
        recent = self.counters.batch_sizes[-100:]
        waits = sorted(self.counters.recent_waits_ms)
        in_flight = [*self.in_batch.values(), *(r.held for r in self.running.values())]
        return {
            **self.counters.as_hash(),
            "consumer": self.consumer,
            "host": self._host,
            "pid": self._pid,
            "engine": self.engine.name,
            "model": self.settings.model if self.engine.name != "echo" else "-",
            "started_unix_ms": self.started_ms,
            "last_seen_unix_ms": now_ms(),
            "held": len(self.held),
            "in_flight": len(in_flight),
            "in_flight_tokens": sum(
                len(h.prompt_ids) + h.request.max_new_tokens for h in in_flight
            ),
            "wait_p50_ms": waits[len(waits) // 2] if waits else 0,
            "wait_p99_ms": waits[min(len(waits) - 1, len(waits) * 99 // 100)] if waits else 0,
            "recent_batch_sizes": json.dumps(recent),
        }

    def dead_letter(
        self,
        stream: str,
        entry_id: str,
        fields: dict[Any, Any],
        why: str,
        request_id: str | None = None,
        ack: bool = True,
    ) -> None:
        """Record an entry in the dead-letter stream; with ``ack``, also drop it (an entry with
        no usable id: there is no result to write)."""
        pipe = self.redis.pipeline(transaction=True)
        record = dead_letter_fields(stream, entry_id, fields, why, self.consumer, request_id)
        add_to_pipeline(pipe, self.keys, record)
        if ack:
            pipe.xack(stream, GROUP, entry_id)
            pipe.xdel(stream, entry_id)
        pipe.execute()
        self.counters.dead_lettered += 1
        log.warning("dead-lettered entry %s of %s: %s", entry_id, stream, why)

    # -- admission -------------------------------------------------------------------------

    def admit(
        self, response: Sequence[tuple[Any, list[Any]]], deliveries: dict[str, int] | None = None
    ) -> None:
        """Decode and check newly read entries. Runnable ones join the look-ahead; the rest
        are finished at once (failed, expired) or dead-lettered, and written together."""
        decoded: list[tuple[str, str, Request]] = []
        outcomes: list[Outcome] = []
        now = now_ms()
        writing = {held_key(*e) for e in self.writer.entries()} if response else set()
        for raw_stream, entries in response:
            stream = raw_stream.decode() if isinstance(raw_stream, bytes) else raw_stream
            priority = self.keys.priority_of(stream)
            for raw_id, fields in entries:
                entry_id = raw_id.decode() if isinstance(raw_id, bytes) else raw_id
                if self._holding(held_key(stream, entry_id), writing):
                    continue
                req = decode_request(priority, fields or {})
                if isinstance(req, UndecodableEntry):
                    if req.request_id is None:
                        self.dead_letter(stream, entry_id, as_dict(fields), str(req.error))
                    else:
                        outcomes.append(self._failed(stream, entry_id, req.request_id, req.error))
                elif deadline_passed(req, now):
                    outcomes.append(self._expired(stream, entry_id, req))
                else:
                    decoded.append((stream, entry_id, req))
        if decoded:
            texts = [prompt_text(r, getattr(self.engine, "tokenizer", None)) for _, _, r in decoded]
            token_ids = self.engine.tokenize(texts)
            for (stream, entry_id, req), ids in zip(decoded, token_ids, strict=True):
                problem = check_limits(req, len(ids), self.limits)
                if problem is not None:
                    outcomes.append(self._failed(stream, entry_id, req.id, problem, req))
                    continue
                held = Held(
                    stream, entry_id, req, ids, entry_time_ms(entry_id),
                    (deliveries or {}).get(entry_id, 1),
                )  # fmt: skip
                self.held[held.key] = held
        self.write(outcomes)

    def candidates(self) -> list[Candidate]:
        """The look-ahead as the batching policy sees it."""
        return [h.candidate for h in self.held.values()]

    # -- running ---------------------------------------------------------------------------

    def _holding(self, key: str, writing: set[str]) -> bool:
        return key in self.held or key in self.in_batch or key in self.running or key in writing

    def run_batch(self, batch: Sequence[Held]) -> list[Outcome]:
        """Start ``batch`` (requests already final are dropped, late ones expire) and run it in
        the engine."""
        self.in_batch.update((h.key, h) for h in batch)
        try:
            started = now_ms()
            try:
                live, outcomes = self.mark_running(batch, started)
            except REDIS_ERRORS:
                self.held.update((h.key, h) for h in batch)  # not started: keep them
                raise
            return outcomes + self._generate(live, started)
        finally:
            for h in batch:
                self.in_batch.pop(h.key, None)

    def _generate(self, batch: Sequence[Held], started: int) -> list[Outcome]:
        """Run ``batch``. If the engine raises, split the batch in halves and run each, down to
        single requests, so the culprit fails with the error and its batch-mates succeed. Out of
        memory also halves the worker's budget for ``oom_backoff_s``; only a request that runs
        out of memory alone fails."""
        if not batch:
            return []
        t0 = time.perf_counter()
        try:
            report = self.engine.generate([self._input(h) for h in batch])
        except Exception as err:  # an engine can raise anything; isolate the culprit(s)
            oom = _is_out_of_memory(err)
            if oom:
                self._lower_budget(sum(len(h.prompt_ids) + h.request.max_new_tokens for h in batch))
            if len(batch) == 1:
                h = batch[0]
                log.warning("request %s failed in the engine: %r", h.request.id, err)
                why = (
                    f"out of memory even alone ({len(h.prompt_ids)} prompt tokens + "
                    f"{h.request.max_new_tokens} new): ask for fewer tokens, or run a worker "
                    "with more memory"
                    if oom
                    else f"the engine failed on this request: {err}"
                )
                return [
                    self._failed(
                        h.stream, h.entry_id, h.request.id, GenerationError(why), h.request,
                        started,
                    )
                ]  # fmt: skip
            half = len(batch) // 2
            log.warning(
                "batch of %d failed (%s); splitting it in two", len(batch), type(err).__name__
            )
            return self._generate(batch[:half], started) + self._generate(batch[half:], started)
        generation_ms = int((time.perf_counter() - t0) * 1000)
        self._count_batch(report, len(batch), generation_ms)
        finished = now_ms()
        return [
            self._succeeded(h, out, started, finished, generation_ms, len(batch))
            for h, out in zip(batch, report.outputs, strict=True)
        ]

    def _lower_budget(self, failed_tokens: int) -> None:
        """Run with half the budget (at most half the batch that failed) for a while."""
        self.counters.oom_splits += 1
        budget = max(1, min(self.policy.max_batch_tokens, failed_tokens) // 2)
        self.policy = dataclasses.replace(self.policy, max_batch_tokens=budget)
        self._budget_restore_at = time.monotonic() + self.settings.oom_backoff_s
        log.warning(
            "out of memory: batch budget lowered to %d tokens for %.0f s",
            budget,
            self.settings.oom_backoff_s,
        )

    def mark_running(self, batch: Sequence[Held], started: int) -> tuple[list[Held], list[Outcome]]:
        """Mark ``batch`` running, in one script call. Returns the requests to run, and the
        outcomes of those that must not run: a deadline that passed (expired). A request
        already final (cancelled, or a duplicate finished elsewhere) is acknowledged by the
        script and dropped."""
        now = now_ms()
        late = [h for h in batch if deadline_passed(h.request, now)]
        todo = [h for h in batch if not deadline_passed(h.request, now)]
        items = []
        for h in todo:
            running = {
                "id": h.request.id,
                "status": "running",
                "priority": h.request.priority,
                "timings": {"queued_unix_ms": h.enqueued_ms, "started_unix_ms": started},
                "worker": self.consumer,
                "metadata": h.request.metadata,
            }  # a Result's JSON, written directly (see _succeeded)
            items.append((h.request.id, h.stream, h.entry_id, orjson.dumps(running).decode()))
        written: Any = []
        if items:
            written = apply(
                self.redis, self.keys, self.settings.result_ttl_s, "running", items,
                self.settings.max_attempts, token=f"{self.consumer}:{started}",
            )  # fmt: skip
        live = [h for h, w in zip(todo, written, strict=True) if w == 1]
        poison = [h for h, w in zip(todo, written, strict=True) if w == -2]
        self.counters.already_final += sum(1 for w in written if w == 0)
        outcomes = [self._expired(h.stream, h.entry_id, h.request) for h in late]
        return live, outcomes + [self._poison(h) for h in poison]

    def _poison(self, h: Held) -> Outcome:
        """A request started ``max_attempts`` times, every time by a worker that died: fail it
        and copy it to the dead-letter stream instead of letting it kill another worker."""
        n = self.settings.max_attempts
        err = PoisonRequest(
            f"{n} workers started this request and every one stopped before finishing it "
            f"(killed, crashed, out of memory?); it will not be started again. It was copied to "
            f"{self.keys.dead_letter}: genq dlq list shows it, genq dlq retry puts it back"
        )
        fields = encode_request(h.request)
        self.dead_letter(h.stream, h.entry_id, dict(fields), str(err), h.request.id, ack=False)
        return self._failed(h.stream, h.entry_id, h.request.id, err, h.request)

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
        wait_ms = max(0, started - h.enqueued_ms)
        # A Result's JSON, written directly: building pydantic models cost more than the rest of
        # the worker's per-request work. Clients parse it with the strict Result model, so every
        # end-to-end test checks its shape.
        state = {
            "id": h.request.id,
            "status": "succeeded",
            "priority": h.request.priority,
            "text": out.text,
            "finish_reason": out.finish_reason,
            "usage": {"prompt_tokens": len(h.prompt_ids),
                      "completion_tokens": out.completion_tokens},
            "timings": {"queued_unix_ms": h.enqueued_ms, "started_unix_ms": started,
                        "finished_unix_ms": finished, "queue_wait_ms": wait_ms,
                        "generation_ms": generation_ms},
            "worker": self.consumer,
            "batch_size": batch_size,
            "metadata": h.request.metadata,
        }  # fmt: skip
        return Outcome(
            h.stream, h.entry_id, h.request.id, "succeeded", h.request.priority,
            orjson.dumps(state).decode(), wait_ms, out.completion_tokens,
        )  # fmt: skip

    # -- continuous batching ---------------------------------------------------------------

    def step_continuous(self) -> None:
        """One turn with an iteration-level engine: top up the look-ahead, start requests while
        the token budget has room, and write each result as soon as it finishes."""
        engine = self.engine
        if not isinstance(engine, IterationEngine):
            raise TypeError(f"engine {engine.name!r} does not batch per iteration")
        self.heartbeat()
        self.reclaim()
        self.admit(self.read(block_ms=None))
        self.write(self.start_requests(engine))
        self.write(self.finish_requests(engine, POLL_S if self.running else 0.0))
        self.write(self.drop_cancelled(engine))
        if not self.running and not self.held:
            self.admit(self.read(block_ms=self.settings.read_block_ms))

    def start_requests(self, engine: IterationEngine) -> list[Outcome]:
        """Admit held requests into the running engine, by the batching policy, within what
        is left of the token budget and batch size. A request delivered before runs alone:
        it waits for the running ones to finish, and nothing starts beside it."""
        if any(r.held.suspect for r in self.running.values()):
            return []
        suspect = self.next_suspect()
        if suspect is not None and self.running:
            return []
        if not self._ready_for(suspect):
            return []
        if suspect is not None:
            batch = [self.held.pop(suspect.key)]
        else:
            policy = self.current_policy()
            used_tokens = sum(r.cost_tokens for r in self.running.values())
            free_tokens = policy.max_batch_tokens - used_tokens
            free_slots = policy.max_batch_size - len(self.running)
            if not self.held or free_slots <= 0 or free_tokens <= 0:
                return []
            policy = dataclasses.replace(
                policy, max_batch_tokens=free_tokens, max_batch_size=free_slots, max_wait_ms=0
            )
            decision = next_batch(self.candidates(), now_ms(), policy)
            if self.running and decision.tokens > free_tokens:
                return []  # the most urgent request does not fit yet: wait for room
            batch = [self.held.pop(c.key) for c in decision.batch]
        started = now_ms()
        try:
            live, outcomes = self.mark_running(batch, started)
        except redis.RedisError:
            self.held.update((h.key, h) for h in batch)  # not started: keep them
            raise
        for h in live:
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
            self.metrics.batch(1, 0, (finished - run.started) / 1000)
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

    def drop_cancelled(self, engine: IterationEngine) -> list[Outcome]:
        """Stop running requests that became final meanwhile (cancelled by a client), freeing
        their place in the batch; checked every CANCEL_CHECK_S. Their entries are just
        acknowledged: the final state is the client's."""
        now = time.monotonic()
        if not self.running or now - self._last_cancel_check < CANCEL_CHECK_S:
            return []
        self._last_cancel_check = now
        runs = list(self.running.values())
        raws = self.redis.mget([self.keys.result(r.held.request.id) for r in runs])
        outcomes = []
        for run, raw in zip(runs, raws, strict=True):
            if raw is None or json.loads(raw).get("status") not in FINAL_STATUSES:
                continue
            h = run.held
            engine.cancel(h.key)
            del self.running[h.key]
            log.info("request %s became final while running (cancelled?)", h.request.id)
            outcomes.append(self._cancelled(h))
        return outcomes

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
        tokens = report.prompt_tokens + report.completion_tokens
        self.metrics.batch(size, tokens, generation_ms / 1000)

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
        return Outcome.of(
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

    def _cancelled(self, h: Held) -> Outcome:
        """The outcome of a request cancelled while running: only its entry is acknowledged
        (its state is already final, so the script writes nothing)."""
        info = ErrorInfo(code="cancelled", message="cancelled by a client")
        result = self._final(h.stream, h.entry_id, h.request.id, "cancelled", h.request, info, None)
        return Outcome.of(h.stream, h.entry_id, result)

    def _expired(self, stream: str, entry_id: str, request: Request) -> Outcome:
        self.counters.expired += 1
        return Outcome.of(
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


def raw_read_reply(response: Any, **options: Any) -> Any:
    """XREADGROUP's reply as ``[[stream, [[entry id, [field, value, ...]], ...]], ...]`` (the
    RESP2 shape; RESP3's map of streams is turned into it)."""
    return list(response.items()) if isinstance(response, dict) else response


def as_dict(fields: Any) -> dict[Any, Any]:
    """An entry's fields as a dict, from a flat list or a dict (or None: deleted)."""
    if not fields:
        return {}
    if isinstance(fields, dict):
        return fields
    return dict(zip(fields[::2], fields[1::2], strict=True))


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _is_out_of_memory(err: BaseException) -> bool:
    """torch.OutOfMemoryError (CUDA, MPS) or the allocator's message, without importing torch."""
    return type(err).__name__ == "OutOfMemoryError" or "out of memory" in str(err).lower()
