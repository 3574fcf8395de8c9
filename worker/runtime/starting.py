"""The start step: mark a batch running in one APPLY call, and sort out what must not run;
then, if the batch will keep the worker busy, hand back what waits (work-conserving pulling).

A request whose deadline passed ends ``expired``; one started ``max_attempts`` times already,
every time by a worker that died, is poison: it ends ``failed`` and is copied to the dead-letter
stream; one already final (cancelled, or finished elsewhere) is acknowledged by the script and
dropped. The rest run.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from genq.common import states
from genq.common.connection import REDIS_ERRORS
from genq.common.errors import PoisonRequest
from genq.common.scripts import Applied
from genq.common.wire import encode_request
from genq.worker.policy.admission import deadline_passed
from genq.worker.policy.fair_share import Refund
from genq.worker.policy.lookahead import Held, Lookahead
from genq.worker.runtime.clock import now_ms
from genq.worker.runtime.dead_letter import dead_letter_fields
from genq.worker.runtime.fair_share import TenantAccounts
from genq.worker.runtime.heartbeat import Counters
from genq.worker.runtime.outcomes import Outcome, Outcomes
from genq.worker.runtime.queue_io import QueueIO, Reading
from genq.worker.runtime.read_trip import Delivered
from genq.worker.runtime.runners import Runner

log = logging.getLogger("genq.worker")

MAX_RINGS = 8
"""Most idle workers a hand-back wakes at once (one per batch's worth of entries)."""


class Starter:
    """Marks one worker's batches running."""

    def __init__(
        self,
        *,
        queue: QueueIO,
        tenants: TenantAccounts,
        outcomes: Outcomes,
        counters: Counters,
        consumer: str,
        dead_letter_stream: str,
        max_attempts: int,
        hand_back_after_ms: int,
        max_batch_size: int,
    ) -> None:
        self.queue = queue
        self.tenants = tenants
        self.outcomes = outcomes
        self.counters = counters
        self.consumer = consumer
        self.dead_letter_stream = dead_letter_stream
        self.max_attempts = max_attempts
        self.hand_back_after_ms = hand_back_after_ms
        self.max_batch_size = max_batch_size

    def mark_running(
        self, batch: Sequence[Held], started_ms: int, read: Reading = None
    ) -> tuple[list[Held], list[Outcome], Delivered | None]:
        """Mark ``batch`` running in one script call. Returns the requests to run, the
        outcomes of those that must not: a deadline that passed (expired), a request started
        ``max_attempts`` times already (poison), and what ``read`` brought (the next batch's,
        in the same round trip; None: not sent). One already final (cancelled, or finished
        elsewhere) is acknowledged by the script and dropped."""
        outcomes = self.outcomes
        now = now_ms()
        late: list[Held] = []
        todo: list[Held] = []
        for h in batch:
            (late if deadline_passed(h.request, now, h.enqueued_ms) else todo).append(h)
        items = [
            (
                h.request.id,
                h.stream,
                h.entry_id,
                states.running(
                    request_id=h.request.id,
                    priority=h.request.priority,
                    tenant=h.request.tenant,
                    metadata=h.request.metadata,
                    queued_ms=h.enqueued_ms,
                    started_ms=started_ms,
                    worker=self.consumer,
                ),
            )
            for h in todo
        ]
        token = f"{self.consumer}:{started_ms}"
        answers, fetched = self.queue.mark_running(items, token=token, held=todo, read=read)
        live = [h for h, a in zip(todo, answers, strict=True) if a == Applied.WRITTEN]
        poison = [h for h, a in zip(todo, answers, strict=True) if a == Applied.POISON]
        gone = (Applied.ALREADY_FINAL, Applied.DUPLICATE)  # acknowledged: nothing runs
        refunds = [
            Refund(tenant=h.request.tenant, charged=h.charge)  # moved to served just now
            for h, a in zip(todo, answers, strict=True)
            if a in gone
        ]
        if refunds:
            self.tenants.refund(refunds)
        if Applied.ALREADY_FINAL in answers or Applied.DUPLICATE in answers:
            self.counters.count_answers(answers)
        ended = [
            outcomes.expired(
                stream=h.stream, entry_id=h.entry_id, request=h.request, charge=h.charge
            )
            for h in late
        ]
        return live, ended + [self._poison(h) for h in poison], fetched

    def _poison(self, h: Held) -> Outcome:
        """A request started ``max_attempts`` times, every time by a worker that died: fail it
        and copy it to the dead-letter stream instead of letting it kill another worker."""
        attempts = self.max_attempts
        err = PoisonRequest(
            f"{attempts} workers started this request and every one stopped "
            f"before finishing it (killed, crashed, out of memory?); it will not be started "
            f"again. It was copied to {self.dead_letter_stream}: genq dlq list shows it, "
            "genq dlq retry puts it back"
        )
        record = dead_letter_fields(
            stream=h.stream,
            entry_id=h.entry_id,
            fields=dict(encode_request(h.request)),
            error=str(err),
            worker=self.consumer,
            request_id=h.request.id,
        )
        self.dead_letter(record, ack=False)
        return self.outcomes.failed_held(h, err, charged_as_started=True)

    def dead_letter(self, record: dict[str, str | int], *, ack: bool) -> None:
        """Record an entry in the dead-letter stream (``ack``: and drop it from its stream)."""
        self.queue.dead_letter(record, ack=ack)
        self.counters.dead_lettered += 1
        log.warning(
            "dead-lettered entry %s of %s: %s",
            record["entry_id"],
            record["stream"],
            record["error"],
        )

    def hand_back(self, lookahead: Lookahead, runner: Runner) -> None:
        """About to be busy with a batch for ``hand_back_after_ms`` or more (as the runner
        expects from its measured time per step): give what waits here back to the group, so
        that a worker that is free sooner takes it (work-conserving: nothing waits on a busy
        worker while another idles).
        The next read here takes back whatever no one else took, so a lone worker still
        chooses among the same candidates."""
        if not (runner.hands_back and lookahead.waiting):
            return
        busy_ms = runner.holds_loop_ms
        if busy_ms is None or busy_ms < self.hand_back_after_ms:
            return
        batch = lookahead.take(list(lookahead.waiting))
        rings = min(MAX_RINGS, -(-len(batch) // self.max_batch_size))
        try:
            self.queue.hand_back(batch, rings=rings)
        except REDIS_ERRORS:
            lookahead.put_back(batch)
            raise
        lookahead.started(batch)
        self.counters.handed_back += len(batch)
