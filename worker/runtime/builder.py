"""Wiring: a worker's parts built from its settings and engine, and the worker made of them.

``build_worker`` is the one place that knows which part needs which: the Redis connections,
the reader (its round trip and the riders on it, the doorbell listener), the queue's writes
and the tenants' accounts, the policy units (look-ahead, order, budget, suspect gate, arrival
estimate), intake, runner, starter, writer, heartbeat, claim keeper and start spacing.
``Worker`` (``worker.py``) declares them as its fields and only runs them; this module imports
it, never the other way round. A new part is a field of ``Worker``, built here.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import redis
from genq.common.connection import connect, is_cluster, refresh_cluster_view
from genq.common.keys import Keys, Lanes
from genq.common.scripts import Applied
from genq.common.settings import WorkerSettings
from genq.common.tools import CALL_FORMAT_MARK
from genq.worker.engines.base import Engine, IterationEngine
from genq.worker.engines.pool import EnginePool
from genq.worker.policy.admission import Limits
from genq.worker.policy.budget import AdaptiveBudget
from genq.worker.policy.lookahead import Held, Lookahead
from genq.worker.policy.ordering import WaitingOrder, make_order
from genq.worker.policy.sizing import batch_limits
from genq.worker.policy.spacing import StartSpacing
from genq.worker.runtime import recovery
from genq.worker.runtime.availability import Availability
from genq.worker.runtime.continuous_runner import ContinuousRunner
from genq.worker.runtime.doorbell import DoorbellListener
from genq.worker.runtime.fair_share import TenantAccounts
from genq.worker.runtime.heartbeat import IDLE_HEARTBEAT_S, Counters, Heartbeat, Identity
from genq.worker.runtime.intake import Intake
from genq.worker.runtime.lanes import default_served, worker_lanes
from genq.worker.runtime.metrics import Metrics
from genq.worker.runtime.model_pool import EchoLoader, Loader, ModelPool, pool_rules
from genq.worker.runtime.outcomes import Outcome, Outcomes
from genq.worker.runtime.planner import Planner
from genq.worker.runtime.prefixes import PrefixAffinity
from genq.worker.runtime.queue_io import QueueIO, raw_read_reply
from genq.worker.runtime.read_asks import ReadAsks
from genq.worker.runtime.read_trip import ReadTrip
from genq.worker.runtime.reader import Reader
from genq.worker.runtime.runners import Runner, RunnerContext
from genq.worker.runtime.spacing import StaggeredStarts
from genq.worker.runtime.starting import Starter
from genq.worker.runtime.static_runner import StaticRunner
from genq.worker.runtime.streamed_text import TextSender
from genq.worker.runtime.worker import Worker
from genq.worker.runtime.writer import ResultWriter

log = logging.getLogger("genq.worker")


def build_worker(
    settings: WorkerSettings, engine: Engine, redis_client: redis.Redis | None = None
) -> Worker:
    """A worker with these settings serving ``engine``; on ``redis_client`` if given (its
    claim keeper shares it), else on connections of its own to ``settings.redis_url``."""
    settings = _sized(settings, engine)
    r = redis_client or _loop_connection(settings.redis_url)

    def side_connection() -> redis.Redis:  # a thread's own (the keeper's, the doorbell's)
        return connect(settings.redis_url) if redis_client is None else redis_client

    served = list(settings.pool) if settings.pool_models else [settings.served_model]
    keys = worker_lanes(r, settings.queue, [*served, *settings.adapters], list(settings.adapters))
    order = _order(settings)
    tenants = TenantAccounts(r, keys)
    prefixes = _prefixes(settings, engine, keys, tenants)
    trip = _trip(settings, r, keys, order, tenants, prefixes)
    queue = _queue(settings, r, keys, tenants, trip, prefixes)
    counters = Counters()
    metrics = Metrics(
        keys.queue, settings.metrics_port, settings.metrics_host, model=settings.served_model
    )
    lookahead = Lookahead.for_settings(settings, keys.streams())
    budget = AdaptiveBudget(full_tokens=settings.max_batch_tokens, backoff_s=settings.oom_backoff_s)
    default = default_served(r, keys, served)  # (who answers requests that name no model)
    outcomes = _outcomes(settings, engine, keys, default)
    one_step = not is_cluster(r)  # a step's pieces at once (in one slot only, on a Cluster)
    text = TextSender(lambda: r.pipeline(transaction=one_step), keys, settings.result_ttl_s)
    context = RunnerContext(
        outcomes=outcomes,
        counters=counters,
        metrics=metrics,
        send_delta=text.add,
        sharing=lambda: tenants.weights.sharing,
    )
    runner = make_runner(context, engine, budget, settings)
    stats = _heartbeat(settings, engine, queue, counters, lambda: _holdings(lookahead, runner))
    writer: ResultWriter[Outcome] = ResultWriter(
        _write_now(queue, stats, metrics, text),
        max_backlog=2 * settings.max_batch_size,
        on_away=lambda: refresh_cluster_view(r),
    )
    spacing = _spacing(settings, keys, r, trip, counters)
    pool = _pool(settings, engine, r, keys, served, default, queue, counters, metrics, stats)
    if pool is not None:  # (its look at every lane of the pool rides the read)
        trip.after.append(pool.ride)
    listener = DoorbellListener(side_connection(), keys.doorbells)
    reader = _reader(settings, trip, order, lookahead, runner, listener, counters, spacing, pool)
    planner = _planner(settings, lookahead, runner, writer, tenants, order, budget, spacing, pool)
    keeper = _keeper(
        settings,
        keys,
        side_connection(),
        lambda: reader.entries() + lookahead.entries() + runner.entries() + writer.entries(),
    )
    return Worker(
        settings=settings,
        queue=queue,
        reader=reader,
        tenants=tenants,
        prefixes=prefixes,
        availability=Availability(r, on_lost_group=queue.ensure_groups),
        counters=counters,
        metrics=metrics,
        lookahead=lookahead,
        planner=planner,
        intake=_intake(settings, engine, outcomes, keys),
        runner=runner,
        starter=_starter(settings, queue, tenants, outcomes, counters),
        writer=writer,
        text=text,
        stats=stats,
        keeper=keeper,
    )


def _reader(
    settings: WorkerSettings,
    trip: ReadTrip,
    order: WaitingOrder,
    lookahead: Lookahead,
    runner: Runner,
    doorbell: DoorbellListener,
    counters: Counters,
    spacing: StaggeredStarts,
    pool: ModelPool | None,
) -> Reader:
    """The reader: its round trip, what it asks for, the doorbell listener, and the batch-reads
    thread (which exchanges the start spacing's phases as a batch's window opens)."""
    return Reader(
        settings=settings,
        trip=trip,
        asks=ReadAsks(settings, lookahead, runner, order, trip.keys, pool),
        lookahead=lookahead,
        runner=runner,
        doorbell=doorbell,
        counters=counters,
        exchange=spacing.exchange,
        pool=pool,
    )


def _planner(
    settings: WorkerSettings,
    lookahead: Lookahead,
    runner: Runner,
    writer: ResultWriter[Outcome],
    tenants: TenantAccounts,
    order: WaitingOrder,
    budget: AdaptiveBudget,
    spacing: StaggeredStarts,
    pool: ModelPool | None,
) -> Planner:
    """The plan step over the policy units, with the tenants' weights."""
    return Planner(
        settings=settings,
        lookahead=lookahead,
        runner=runner,
        writer=writer,
        weights=tenants.weights,
        order=order,
        budget=budget,
        spacing=spacing,
        pool=pool,
    )


def _pool(
    settings: WorkerSettings,
    engine: Engine,
    r: redis.Redis,
    keys: Lanes,
    served: list[str],
    default: str,
    queue: QueueIO,
    counters: Counters,
    metrics: Metrics,
    stats: Heartbeat,
) -> ModelPool | None:
    """A pool of models (``--model`` repeated; None: one model): the echo engine's (all of its
    models resident unless ``--resident-models`` says fewer) or a real engine's (``engine`` is
    an ``EnginePool``: as many resident as fit in memory unless it says)."""
    if not settings.pool_models:
        return None
    loader: Loader = EchoLoader(settings.echo_load_ms)
    capacity = settings.resident_models or len(served)
    if isinstance(engine, EnginePool):
        loader, engine.default = engine, default
        capacity = settings.resident_models or engine.fit
    return ModelPool(
        r=r,
        keys=keys,
        models=served,
        default_model=default,
        rules=pool_rules(settings, capacity),
        loader=loader,
        queue=queue,
        counters=counters,
        metrics=metrics,
        fields=stats.identity.fields,
        consumer=settings.consumer_name,
    )


def _trip(
    settings: WorkerSettings,
    r: redis.Redis,
    keys: Keys,
    order: WaitingOrder,
    tenants: TenantAccounts,
    prefixes: PrefixAffinity,
) -> ReadTrip:
    """The read's round trip, with what rides every read: the tenants' deferred corrections
    and the prefixes held before it, the tenants' weights after it."""
    return ReadTrip(
        r=r,
        keys=keys,
        settings=settings,
        read_rule=order.read_rule,
        before=[tenants.ride, prefixes.ride],
        after=[tenants.weights.ride],
    )


def _queue(
    settings: WorkerSettings,
    r: redis.Redis,
    keys: Keys,
    tenants: TenantAccounts,
    trip: ReadTrip,
    prefixes: PrefixAffinity,
) -> QueueIO:
    """The queue's writes, on the loop's connection (the history is kept while reads leave a
    backlog; the prefixes are told with each start)."""
    return QueueIO(
        r=r,
        keys=keys,
        consumer=settings.consumer_name,
        settings=settings,
        tenants=tenants,
        left_waiting=lambda: trip.left_waiting,
        affinity=prefixes,
    )


def _keeper(
    settings: WorkerSettings,
    keys: Keys,
    r: redis.Redis,
    claimed: Callable[[], list[tuple[str, str]]],
) -> recovery.ClaimKeeper:
    """The claim keeper, on its own connection: renews what ``claimed()`` lists (every entry
    the worker holds, wherever it is) and the heartbeat."""
    return recovery.ClaimKeeper(
        r=r,
        keys=keys,
        consumer=settings.consumer_name,
        claim_idle_ms=settings.claim_idle_ms,
        heartbeat_ttl_s=settings.heartbeat_ttl_s,
        claimed=claimed,
    )


def _spacing(
    settings: WorkerSettings, keys: Keys, r: redis.Redis, trip: ReadTrip, counters: Counters
) -> StaggeredStarts:
    """The start spacing (``--stagger-starts``), on the loop's connection (the batch-reads
    thread's exchange takes a connection of the pool), its phases in the first lane's hash."""
    return StaggeredStarts(
        r,
        keys.lanes()[0].starts,
        settings.consumer_name,
        StartSpacing(enabled=settings.stagger_starts),
        saturated=lambda: trip.left_waiting > 0,
        counters=counters,
        ttl_s=settings.heartbeat_ttl_s,
    )


def _prefixes(
    settings: WorkerSettings, engine: Engine, keys: Keys, tenants: TenantAccounts
) -> PrefixAffinity:
    """What this worker holds for the read's affinity: prefixes and LoRA adapters."""
    return PrefixAffinity(
        keys=keys,
        consumer=settings.consumer_name,
        capacity_tokens=_prefix_capacity(settings, engine),
        enabled=settings.prefix_aware,
        sharing=lambda: tenants.weights.sharing,
        adapters=list(settings.adapters),
        max_loras=settings.max_loras,
    )


def _prefix_capacity(settings: WorkerSettings, engine: Engine) -> int:
    """How many prompt tokens of prefixes this worker counts itself as holding: the setting,
    else what its engine keeps beyond the batch (``Engine.prefix_room``)."""
    if settings.prefix_cache_tokens is not None:
        return settings.prefix_cache_tokens
    return int(getattr(engine, "prefix_room", 0))


def _loop_connection(url: str) -> redis.Redis:
    """The loop's own connection. Entries come as Redis sends them: redis-py's parsing into
    dicts cost a tenth of the worker's time on the hot path, and ``decode_request`` reads the
    flat field list (not on a cluster, whose client parses replies itself)."""
    r = connect(url)
    if not is_cluster(r):
        r.set_response_callback("XREADGROUP", raw_read_reply)
    return r


def _outcomes(settings: WorkerSettings, engine: Engine, keys: Keys, default: str) -> Outcomes:
    """How this worker's results are written (tool calls read from the text when the model's
    chat template teaches the Hermes call format; ``default``: the model that answers the
    requests that name none)."""
    template = getattr(engine.tokenizer, "chat_template", None)
    reads = isinstance(template, str) and CALL_FORMAT_MARK in template
    return Outcomes(
        worker=settings.consumer_name,
        keys=keys,
        model=default,
        reads_tool_calls=engine.reads_tool_calls if isinstance(engine, EnginePool) else reads,
        keys_next_turns=settings.prefix_aware,
    )


def _heartbeat(
    settings: WorkerSettings,
    engine: Engine,
    queue: QueueIO,
    counters: Counters,
    holdings: Callable[[], tuple[list[Held], list[Held]]],
) -> Heartbeat:
    """The stats hash, with who this worker is."""
    identity = Identity(
        consumer=settings.consumer_name,
        engine=engine.name,
        model=" ".join(settings.pool) if settings.pool_models else settings.served_model,
        device="-" if engine.name == "echo" else settings.device,
        adapters=list(settings.adapters),
        kind=_kind(engine),
        model_kinds=getattr(engine, "kinds", None),
    )
    return Heartbeat(
        queue=queue,
        identity=identity,
        counters=counters,
        holdings=holdings,
        idle_every_s=min(IDLE_HEARTBEAT_S, settings.heartbeat_ttl_s / 3),
    )


def _kind(engine: Engine) -> str:
    """What the worker's model does, as ``GET /v1/models`` says it: ``generation``,
    ``embedding`` or ``score`` (a cross-encoder)."""
    if getattr(engine, "scores", False):
        return "score"
    return "embedding" if getattr(engine, "embeds", False) else "generation"


def _order(settings: WorkerSettings) -> WaitingOrder:
    """The worker's order (``--tenant-policy``), with the affinity rule for its prefixes
    (``--prefix-aware``) and its adapters (``--lora``, ``--max-loras``)."""
    return make_order(
        settings.tenant_policy,
        prefix_aware=settings.prefix_aware,
        adapters=list(settings.adapters),
        max_loras=settings.max_loras,
    )


def _sized(settings: WorkerSettings, engine: Engine) -> WorkerSettings:
    """The settings with ``auto`` batch limits replaced by the engine's (``make_engine`` sized
    them to its device), or a CPU's for an engine built directly (logged once), and the idle
    wait within a third of the heartbeat's TTL and the reclaim's cadence."""
    limits = engine.limits or batch_limits(
        tokens=settings.max_batch_tokens, size=settings.max_batch_size, device=None
    )
    log.info("batch limits: %s", limits.why)
    return settings.model_copy(
        update={"max_batch_tokens": limits.tokens, "max_batch_size": limits.size}
    )


def _intake(settings: WorkerSettings, engine: Engine, outcomes: Outcomes, keys: Keys) -> Intake:
    """Admission with the settings' limits and the engine's context length."""
    limits = Limits(
        max_new_tokens=settings.max_new_tokens_limit,
        max_prompt_tokens=settings.max_prompt_tokens,
        max_context_tokens=engine.max_context_tokens,
        max_batch_tokens=settings.max_batch_tokens,
        vocab_size=None if engine.tokenizer is None else len(engine.tokenizer),
        models=frozenset([*settings.pool, settings.served_model, *settings.adapters]),
    )
    return Intake(
        engine=engine,
        limits=limits,
        outcomes=outcomes,
        keys=keys,
        consumer=settings.consumer_name,
    )


def _starter(
    settings: WorkerSettings,
    queue: QueueIO,
    tenants: TenantAccounts,
    outcomes: Outcomes,
    counters: Counters,
) -> Starter:
    """Marking batches running, with the settings' attempts and hand-back limits."""
    return Starter(
        queue=queue,
        tenants=tenants,
        outcomes=outcomes,
        counters=counters,
        consumer=settings.consumer_name,
        dead_letter_stream=queue.keys.dead_letter,
        max_attempts=settings.max_attempts,
        hand_back_after_ms=settings.hand_back_after_ms,
        max_batch_size=settings.max_batch_size,
    )


def _holdings(lookahead: Lookahead, runner: Runner) -> tuple[list[Held], list[Held]]:
    """(waiting, in flight) for the stats hash: the claim keeper renews what these hold (with
    the writer's), so the claim keeper's thread and the heartbeat see the same requests."""
    in_flight = [*lookahead.starting.values(), *runner.running.values()]
    return list(lookahead.waiting.values()), in_flight


def _write_now(
    queue: QueueIO, stats: Heartbeat, metrics: Metrics, text: TextSender
) -> Callable[[list[Outcome]], list[int]]:
    """The writer thread's call: the streamed text queued so far (so each request's pieces
    come before its final event), then one APPLY over a batch plus the latest stats; then the
    Prometheus metrics (thread-safe) of the requests it ended."""

    def write(batch: list[Outcome]) -> list[int]:
        text.flush()
        answers = queue.write_final(batch, also=stats.add_latest)
        if metrics.enabled:  # (off without --metrics-port: nothing to count)
            metrics.ended([o for o, a in zip(batch, answers, strict=True) if a == Applied.WRITTEN])
        return answers

    return write


def make_runner(
    context: RunnerContext, engine: Engine, budget: AdaptiveBudget, settings: WorkerSettings
) -> Runner:
    """The runner for ``engine``: continuous for an iteration-level engine (preempting with
    ``--preempt`` where the engine can pause, with ``--time-slice-ms``), else static."""
    if isinstance(engine, IterationEngine):
        return ContinuousRunner(
            context,
            engine=engine,
            preempt=settings.preempt,
            time_slice_ms=settings.time_slice_ms,
        )
    return StaticRunner(context, engine=engine, budget=budget, preempt=settings.preempt)
