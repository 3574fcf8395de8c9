"""The plan step: what to start now, from what waits and what runs, and what learns of each
start.

The suspect gate comes first (a request delivered before runs alone, after the writer caught
up: ``policy/suspects.py``); then the batching policy within the room the runner has left and
the budget (``policy/planning.py``), with the worker's order (who goes first), the arrival
estimate (whether waiting for a fuller batch pays) and the tenants' weights; then the start
spacing may hold a static worker's batch a moment (``spacing.py``). The order and the arrival
estimate are told of every decision, the arrival estimate of every arrival.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable

from genq.common.settings import WorkerSettings
from genq.worker.policy.arrivals import ArrivalEstimate
from genq.worker.policy.batching import BatchPolicy, Decision, batch_limits
from genq.worker.policy.budget import AdaptiveBudget
from genq.worker.policy.lookahead import Held, Lookahead
from genq.worker.policy.ordering import WaitingOrder
from genq.worker.policy.planning import plan_start
from genq.worker.policy.preemption import RANK
from genq.worker.policy.suspects import Gate, SuspectGate
from genq.worker.runtime.clock import now_ms
from genq.worker.runtime.fair_share import TenantWeights
from genq.worker.runtime.model_pool import ModelPool
from genq.worker.runtime.outcomes import Outcome
from genq.worker.runtime.runners import Runner
from genq.worker.runtime.spacing import StaggeredStarts
from genq.worker.runtime.writer import ResultWriter

log = logging.getLogger("genq.worker")

SETTLE_S = 1.0
"""How long a plan waits for the writer before a suspect starts (see ``policy/suspects.py``)."""


class Planner:
    """One worker's plan step over the policy units (see the module's docstring)."""

    def __init__(
        self,
        *,
        settings: WorkerSettings,
        lookahead: Lookahead,
        runner: Runner,
        writer: ResultWriter[Outcome],
        weights: TenantWeights,
        order: WaitingOrder,
        budget: AdaptiveBudget,
        spacing: StaggeredStarts,
        pool: ModelPool | None = None,
    ) -> None:
        self.settings = settings
        self.lookahead = lookahead
        self.runner = runner
        self.writer = writer
        self.weights = weights
        self.order = order  # who goes first among what waits (--tenant-policy)
        self.budget = budget
        self.spacing = spacing  # a saturated static fleet's starts spread over a turn
        self.pool = pool  # a pool of models: a batch is one model's
        self.gate = SuspectGate()
        self.arrivals = ArrivalEstimate()
        self.arrived = self.arrivals.observe
        """The arrival estimate learns when new arrivals were enqueued (``admit``)."""

    def plan(self, wait_to_fill: bool) -> Decision:
        """What to start now: the suspect alone when the gate lets it, else the batching
        policy within the room the runner has left (``policy/planning.py``), held a moment by
        the start spacing. The arrival estimate learns of a wait (scored when the next batch
        starts: did anyone come?), the order of a start."""
        suspect = self.lookahead.next_suspect() if self.lookahead.suspects else None
        running = self.runner.active() if self.runner.running else []
        gate = self.gate.check(
            suspect_waiting=suspect is not None,
            running=len(running),
            suspect_running=any(h.suspect for h in running),
        )
        if gate is Gate.CLOSED:
            return Decision(reason="suspect running")
        if gate is Gate.FLUSH_FIRST:
            if not self.writer.flush(SETTLE_S):
                return Decision(reason="writer behind")  # Redis away: next turn
            self.gate.passed(suspect=suspect is not None)
        if suspect is not None:
            decision = Decision(batch=[suspect.candidate], reason="suspect")
        else:
            waiting: Iterable[Held] = self.lookahead.waiting.values()
            floor = self.runner.stopped_rank  # (a batch that stopped for a higher one)
            if floor:
                waiting = [h for h in waiting if RANK[h.request.priority] > floor]
            if self.pool is not None:
                waiting = self.pool.one_model(waiting)
            planned = plan_start(
                [h.candidate for h in waiting],  # (``candidates``)
                now_ms=now_ms(),
                policy=batch_policy(self.settings, self.budget),
                running=len(running),
                running_tokens=sum(h.cost_tokens for h in running),
                wait_to_fill=wait_to_fill,
                arrivals=self.arrivals,
                order=self.order,
                weights=self.weights.now,
            )
            decision = self.spacing.held(planned, static=wait_to_fill)  # (a static worker)
        if decision.reason == "waiting":
            self.arrivals.waiting(now_ms())
        if decision.batch:
            if self.arrivals.in_wait:  # (``batch_started`` scores the wait under way)
                self.arrivals.batch_started()
            self.order.started(decision.batch)
        return decision


def batch_policy(settings: WorkerSettings, budget: AdaptiveBudget) -> BatchPolicy:
    """The batching policy now: the settings' limits, within the budget (restored once its
    backoff after an out-of-memory error is over)."""
    if budget.restore_at_s is not None and budget.restore_due(time.monotonic()):
        log.info("batch budget back to %d tokens", budget.full_tokens)
    s = settings
    return batch_limits(budget.tokens, s.max_batch_size, s.max_wait_ms, s.priority_aging_ms)
