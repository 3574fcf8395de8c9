"""The Redis key layout: every key genq uses is built here and nowhere else.

``Q`` is the queue name, ``ID`` a request id, ``C`` a worker's consumer name.

=====================  ======  ==========================  ==================  ===============
key                    type    written by                  read by             TTL
=====================  ======  ==========================  ==================  ===============
``genq:{Q}:high``      stream  client (XADD)               worker              none; entries
``genq:{Q}:normal``                                        (XREADGROUP)        are deleted
``genq:{Q}:low``                                                               when acked
``genq:{Q}:dead``      stream  worker (entries with no     ``genq dlq``        none; capped at
                               usable id; poison requests) (XRANGE)            ~10,000 entries
``genq:{Q}:doorbell``  stream  submit script; worker       idle workers        heartbeat_ttl_s,
                               (handing entries back; a    (XREADGROUP)        renewed by live
                               woken one passing the                           workers
                               ring on)
``genq:{Q}:config``    hash    worker at start             client (in the      none (one small
                               (``max_queue_depth``);      submit script)      hash per queue)
                               submit script (``groups``)
``genq:{Q}:tenants``   hash    ``genq tenants set``        workers, gateways,  none (one small
                               (tenant -> JSON: weight,    ``genq tenants      hash per queue)
                               tokens_per_minute,          list``, stats
                               max_queued, webhook_url)
``genq-secret:{Q}:``   hash    ``genq tenants set``        gateways only       none
``webhooks``                   (tenant -> webhook secret)
``genq:{Q}:idx:P:T``  list    submit script (new ids,     workers (PULL)      none
                               delivered to genq.queued,
                               each ``ID`` or ``ID KEY``:
                               its scoped prefix key);
                               hand-back (at the front)
``genq:{Q}:active:P``  set     submit, PULL scripts        PULL, stats         none
``genq:{Q}:vtc``       zset    workers (starts, refunds)   PULL, SUBMIT        none
``genq:{Q}:reserved``  zset    PULL (charges), workers     PULL                none
                               (starts, hand-back)
``genq:{Q}:window:T``  hash    PULL, workers (tokens per   PULL (tokens per    120 s
                               Unix second)                minute), stats
``genq:{Q}:bucket:T``  hash    PULL, workers (level,       PULL, stats         120 s
                               at_ms)
``genq:{Q}:served``    hash    workers (tokens, requests)  ``genq stats``      none
``genq:{Q}:waiting``   list    SUBMIT (+1 per request),    KEDA (LLEN), stats  none
                               PULL (-1 per request)
``genq:{Q}:models``    set     SUBMIT (a lane's first      ``genq stats``,     none
                               request), workers at start  the dashboard
                               (the names they serve)
``genq:{Q}:adapters``  set     workers at start (their     SUBMIT, PULL,       none
                               ``--lora`` names)           GIVE_BACK (an
                                                           adapter's entries
                                                           are keyed by it)
``genq:{Q}:m<M>:...``  -       the work keys of model M's  see the rows above  as above
                               lane: ``high``, ``normal``,
                               ``low``, ``doorbell``,
                               ``config``, ``idx:P:T``,
                               ``active:P``, ``waiting``
``genq:{Q}:worker:C``  hash    worker (heartbeat,          ``genq stats``,     heartbeat_ttl_s
                               counters)                   ``genq demo``
``genq:{Q}:holders``   hash    workers (HOLD: prefix key   PULL (affinity)     1 day after its
                               -> the workers holding it,                      last write
                               most recent first)
``genq:{Q}:slots``     hash    workers with ``--lora``     PULL (affinity: a   1 day after its
                               (HOLD: consumer -> free     cold adapter's      last write
                               adapter slots)              entries)
``genq:{Q}:load``      hash    workers at each heartbeat   PULL (affinity:     1 day after its
                               (consumer -> requests held) the load bound;     last write
                                                           drops dead ones)
``genq:{Q}:starts``   hash    static workers (a batch's   static workers      heartbeat_ttl_s
                               start, their turn)          (start spacing)
``genq:{Q}:hist:N``    hash    workers at each heartbeat   the dashboard       16 min (180
                               (HISTORY: requests, tokens, (SNAPSHOT)          buckets of 5 s
                               waits by bin, depth_max of                      are shown)
                               5-s bucket N of Unix time)
``genq:{Q}:sub:ID``    string  client (submit script;      client (submit      result_ttl_s
                               Redis Cluster only)         script)
``genq:res:{ID}``      string  client (queued, naming the  client (GET)        result_ttl_s
                               entry owning the id),
                               worker (running, final):
                               JSON
``genq:ev:{ID}``       stream  worker (deltas if           client (XREAD       result_ttl_s
                               streaming, final event;     BLOCK)
                               none for a wave batch's
                               line)
``genq:att:{ID}``      string  worker (``STARTS P/E        worker (poison      result_ttl_s;
                               TOKEN``: +1 at each start,  check, duplicate    deleted at end
                               the entry owning the id,    entries)
                               once per token; DEL at the
                               end)
``genq:batch:{B}``     hash    ``genq batch submit``;      ``genq batch``      result_ttl_s
                               APPLY (``open`` -1, the
                               counters: batch_counts.py)
``genq:batch:{B}:items`` list  ``genq batch submit``       ``genq batch``      result_ttl_s
``genq:batch:{B}:rejected``    ``genq batch submit``       ``genq batch``      result_ttl_s
                       list    (refused lines)
``genq:{Q}:batches``   zset    batch submit (id, scored    ``GET /v1/batches`` members older
                               by creation time)                               than result_ttl_s
                                                                               dropped on read
``genq:file:{F}``      hash    ``POST /v1/files``          ``/v1/files``,      result_ttl_s
                               (content, filename, ...)    ``/v1/batches``
``genq:{Q}:hooks``     stream  APPLY, cancel (a response gateways (group     none; entries
                               became final: type, id,     ``deliverers``)     deleted when
                               tenant)                                         delivered
``genq:{Q}:hooks:done``  hash  gateways (ENTRY ENDPOINT:   gateways            fields deleted
                               delivered)                                      with the event
``genq:{Q}:hooks:dead``        gateways (deliveries that   ``genq webhooks``   none; capped at
                       stream  gave up)                                        ~10,000 entries
``genq:{Q}:stored:T:K`` zset  gateways (a file, batch    gateways (quotas)   result_ttl_s
                               or stored response of T:                        after its last
                               its id, a file's with its                       write
                               size; scored by expiry)
``genq:{Q}:wake:R``    stream  a gateway (a request        that gateway's      1 h after its
                               joined reader R while it    result reader R     last write;
                               blocked: one entry)         (XREAD)             deleted at exit
``genq:resp:{ID}``     string  ``POST /v1/responses``      ``/v1/responses``   result_ttl_s;
                               (the record: input, options deleted by DELETE
                               and context, JSON)          /v1/responses/ID
=====================  ======  ==========================  ==================  ===============

Lanes: a request that names a model (``model`` in its body) waits in that model's lane,
``genq:{Q}:m<M>:``, whose work keys mirror the unnamed lane's (``genq:{Q}:high``, ...), where
requests that name none wait, and those that name the queue's default model (``default_model``
in ``genq:{Q}:config``). A worker reads only its lanes (``Lanes``): its served names', the
default model's workers the unnamed lane instead (``genq.worker.runtime.lanes``). Tenants'
settings and accounts (``vtc``, ``reserved``, ``window``, ``bucket``, ``served``), the queue's
limits, workers, prefix holders and results are the queue's, shared by its lanes.

Every priority stream of a queue has a consumer group named ``workers`` (``GROUP``). Entries a
worker hands back unstarted are pending for the consumer ``genq.returned`` (``RETURNED``) until
a worker takes them.

Why the braces: they are Redis Cluster hash tags. The three streams of a queue share the tag
``{Q}`` so one XREADGROUP can read them all in Cluster too; result, event and attempts keys are
tagged by request id, so they spread over the cluster while a request's own keys stay together
(one script can change them atomically). On a cluster the submit script cannot reach the
result key from the queue's slot, so it marks the id as submitted with ``genq:{Q}:sub:ID``
instead (the one-request-per-id check), and the client then writes the ``queued`` state with
SET NX (never over a worker's newer state).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import cached_property

from genq.common.errors import ConfigError
from genq.common.models import PRIORITIES, Priority, model_problem

PREFIX = "genq"
SECRETS_PREFIX = "genq-secret"
"""The prefix of the keys that hold secrets: outside ``genq:*`` so that an ACL user with
``~genq:*`` (producers, workers) cannot read them; gateways' users add ``~genq-secret:*``."""
GROUP = "workers"
"""The consumer group every worker of a queue joins, on each priority stream."""
QUEUED = "genq.queued"
"""The consumer that holds every entry waiting for a worker: the submit script delivers each new
entry to it at once and appends its id to its tenant's index, and a worker's read claims the
next ids of the tenant with the least service (see ``scripts.PULL``). Not a process."""
RETURNED = "genq.returned"
"""The consumer that holds entries a worker handed back unstarted (it was about to be busy for
a while): every worker takes these first when it reads. Not a process: no heartbeat."""

DEFAULT_MODEL_FIELD = "default_model"
"""The field of the queue's config hash naming its default model: the one whose workers read
the unnamed lane (requests that name no model; ``genq.worker.runtime.lanes``)."""

WEBHOOK_GROUP = "deliverers"
"""The consumer group of the webhook outbox: every gateway that delivers webhooks joins it."""

DEAD_LETTER_MAX_ENTRIES = 10_000
"""The dead-letter stream is trimmed (approximately) to this many entries."""

_QUEUE_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")


def check_queue_name(queue: str) -> str:
    """Return ``queue`` if it is a valid queue name, else raise ConfigError."""
    if not _QUEUE_NAME.match(queue):
        raise ConfigError(
            f"queue name {queue!r} is not allowed: use 1-64 letters, digits, '_', '.' or '-'"
        )
    return queue


class Keys:
    """The keys of one queue, and of the requests in it."""

    def __init__(self, queue: str = "default", model: str | None = None) -> None:
        self.queue = check_queue_name(queue)
        self._base = f"{PREFIX}:{{{queue}}}"
        self.model = model
        """The lane these keys' work keys are of: a model's (``lane``), or None, the unnamed
        lane of requests that name no model."""
        if model is not None:
            problem = model_problem(model)
            if problem is not None:
                raise ConfigError(problem)
        self._lane = self._base if model is None else f"{self._base}:m<{model}>"

    def lane(self, model: str | None) -> Keys:
        """The keys of one model's lane of this queue (None: the unnamed lane). A lane has
        its own work streams, doorbell, per-tenant indexes, active sets, backlog list and
        groups marker (``lane_config``); everything else (tenants and their accounts, the
        queue's config, workers, results) is the queue's. ``<`` and ``>`` are in no model
        name, so no lane's keys can be another's."""
        return self if model == self.model else Keys(self.queue, model)

    @cached_property
    def models(self) -> str:
        """The named lanes the queue has (a set of model names): added by the submit script
        when it makes a lane's groups, and by a worker's start for the lanes it serves."""
        return f"{self._base}:models"

    @cached_property
    def adapters(self) -> str:
        """The names workers serve as LoRA adapters (a set, added at their start): an entry
        for one that carries no prefix key is indexed with its adapter's key
        (``prefixes.adapter_key``), so the read places it as it places a prefix."""
        return f"{self._base}:adapters"

    @cached_property
    def lane_config(self) -> str:
        """A lane's own small hash (``groups``: the submit script made its consumer groups);
        the unnamed lane's is the queue's ``config``."""
        return f"{self._lane}:config"

    def stream(self, priority: Priority) -> str:
        """The work stream of one priority (in this lane)."""
        return f"{self._lane}:{priority}"

    def lanes(self) -> list[Keys]:
        """The lanes these keys read: this one (a worker's ``Lanes``: each of its lanes)."""
        return [self]

    def streams(self) -> list[str]:
        """All work streams of the lanes, lane by lane, each highest priority first."""
        return list(self._stream_map)

    @cached_property
    def _stream_map(self) -> dict[str, tuple[Keys, Priority]]:
        """Each work stream's lane and priority, in ``streams()``' order (built once)."""
        return {k.stream(p): (k, p) for k in self.lanes() for p in PRIORITIES}

    def _where(self, stream: str) -> tuple[Keys, Priority]:
        try:
            return self._stream_map[stream]
        except KeyError:
            raise ValueError(f"{stream!r} is not a work stream of {self.queue!r}") from None

    def lane_of(self, stream: str) -> Keys:
        """The lane a work stream is in."""
        return self._where(stream)[0]

    def priority_of(self, stream: str) -> Priority:
        """The priority a work stream key stands for."""
        return (self._stream_map.get(stream) or self._where(stream))[1]  # (every entry's path)

    @cached_property
    def doorbells(self) -> tuple[str, ...]:
        """Each lane's doorbell."""
        return tuple(k.doorbell for k in self.lanes())

    @cached_property
    def dead_letter(self) -> str:
        """Entries that could not be decoded into a request with an id, and poison requests
        (started ``max_attempts`` times, every time by a worker that died)."""
        return f"{self._base}:dead"

    @cached_property
    def doorbell(self) -> str:
        """Rung at submits and hand-backs: idle workers block on it, so one wakes at once."""
        return f"{self._lane}:doorbell"

    @cached_property
    def config(self) -> str:
        """The queue's limits that producers enforce (``max_queue_depth``)."""
        return f"{self._base}:config"

    @cached_property
    def tenants(self) -> str:
        """Each tenant's settings (weight, tokens per minute, most queued) as JSON, by name;
        a tenant not in it has the defaults (``genq.common.tenants``)."""
        return f"{self._base}:tenants"

    def tenant_index(self, priority: Priority, tenant: str) -> str:
        """The ids of a tenant's waiting entries of one priority, oldest first (a list)."""
        return f"{self._lane}:idx:{priority}:{tenant}"

    def active(self, priority: Priority) -> str:
        """The tenants with waiting entries of one priority (a set)."""
        return f"{self._lane}:active:{priority}"

    @cached_property
    def vtc(self) -> str:
        """Each tenant's weighted tokens served (prompt + 2 x generated; a sorted set) by the
        requests workers started: the next read serves the active tenant with the least, with
        its ``reserved``, per unit of weight; a tenant back from idle is lifted to the lowest."""
        return f"{self._base}:vtc"

    @cached_property
    def reserved(self) -> str:
        """Each tenant's weighted tokens charged for requests workers have read and not yet
        started (a sorted set): moved to ``vtc`` at the start, returned at a hand-back."""
        return f"{self._base}:reserved"

    def window(self, tenant: str) -> str:
        """Tokens served to a tenant per second of the last minute (a hash: Unix second ->
        tokens), for its tokens-per-minute limit and ``genq stats``."""
        return f"{self._base}:window:{tenant}"

    def bucket(self, tenant: str) -> str:
        """A tenant's token bucket for its tokens-per-minute (a hash: ``level``, ``at_ms``, and
        ``held_back_ms``, when a read last left its requests waiting for it): refilled at its
        limit a minute, the tenant is read while it holds the next request's charge."""
        return f"{self._base}:bucket:{tenant}"

    @cached_property
    def served(self) -> str:
        """Tokens (prompt + generated) and requests served per tenant (``T``, ``T:requests``)."""
        return f"{self._base}:served"

    @cached_property
    def waiting(self) -> str:
        """One item per request waiting for a worker (a list: its length, the lane's backlog)."""
        return f"{self._lane}:waiting"

    def submitted(self, request_id: str) -> str:
        """Redis Cluster only: the id was submitted to this queue (in the queue's slot, where
        the submit script checks and adds atomically)."""
        return f"{self._base}:sub:{request_id}"

    def worker(self, consumer: str) -> str:
        """A worker's heartbeat and counters."""
        return f"{self._base}:worker:{consumer}"

    @cached_property
    def holders(self) -> str:
        """Which workers hold each prefix key in their engines' caches (a hash: scoped key ->
        consumers, most recent first; ``genq.common.prefixes``): the read prefers entries whose
        key the reader holds and leaves another holder's to it for ``--prefix-wait-ms``."""
        return f"{self._base}:holders"

    @cached_property
    def adapter_slots(self) -> str:
        """Each worker's free LoRA adapter slots (a hash: consumer -> ``--max-loras`` less the
        adapters it holds): a cold adapter goes to a reader with one (``common/prefixes.py``)."""
        return f"{self._base}:slots"

    @cached_property
    def load(self) -> str:
        """Each worker's requests held (consumer -> count; heartbeat): the affinity's load bound."""
        return f"{self._base}:load"

    @cached_property
    def starts(self) -> str:
        """A lane's static workers' phases (consumer -> "START_MS TURN_MS"): they space their
        batches' starts over a turn (``worker/policy/spacing.py``)."""
        return f"{self._lane}:starts"

    def history(self, bucket: int | str) -> str:
        """The queue's history for one 5-s bucket of Redis' Unix time (``unix_s // 5``), a
        hash every worker adds to at its heartbeat (``genq.common.history``). ``history("")``
        is the prefix the scripts append a bucket number to."""
        return f"{self._base}:hist:{bucket}"

    @staticmethod
    def result(request_id: str) -> str:
        """The request's current state, a Result as JSON."""
        return f"{PREFIX}:res:{{{request_id}}}"

    @staticmethod
    def batch(batch_id: str) -> str:
        """A batch file's record: id, queue, created_at, total, input name, model, cancelled,
        ``open`` (requests not yet final: APPLY counts it down; the last adds the webhook
        event) and the counters of what they came to, added where each ends (batch_counts)."""
        return f"{PREFIX}:batch:{{{batch_id}}}"

    @staticmethod
    def batch_items(batch_id: str) -> str:
        """A batch file's requests, in input order: "REQUEST_ID ENDPOINT" per line."""
        return f"{PREFIX}:batch:{{{batch_id}}}:items"

    @staticmethod
    def batch_open(batch_id: str) -> str:
        """A wave batch's requests fed, not yet written out (id -> endpoint; ``batch_waves.py``)."""
        return f"{PREFIX}:batch:{{{batch_id}}}:open"

    @staticmethod
    def batch_done(batch_id: str) -> str:
        """A wave batch's ended requests to write out (ids; the scripts' ``tally`` adds them)."""
        return f"{PREFIX}:batch:{{{batch_id}}}:done"

    @staticmethod
    def batch_lease(batch_id: str) -> str:
        """Who runs a wave batch's rounds now (a gateway or ``genq batch``; a string, TTL'd)."""
        return f"{PREFIX}:batch:{{{batch_id}}}:lease"

    @cached_property
    def batches_running(self) -> str:
        """The wave batches still fed or written out (a set of ids: gateways run their rounds)."""
        return f"{self._base}:batches:running"

    @cached_property
    def batches(self) -> str:
        """The queue's batches by creation time (a sorted set: ``GET /v1/batches`` lists it)."""
        return f"{self._base}:batches"

    @staticmethod
    def file(file_id: str) -> str:
        """A file uploaded to ``genq serve`` (``POST /v1/files``): its record (name, size, lines,
        owner, queue, and where its bytes are: ``store`` and ``path`` in the file store, never in
        Redis)."""
        return f"{PREFIX}:file:{{{file_id}}}"

    @cached_property
    def files(self) -> str:
        """The queue's uploaded files by expiry (a zset, Unix s): gateways delete expired ones."""
        return f"{self._base}:files"

    @staticmethod
    def batch_rejected(batch_id: str) -> str:
        """A batch file's lines refused at submission, as their error-file lines (JSON); for a
        wave batch, the error-file lines waiting to be written to the file store."""
        return f"{PREFIX}:batch:{{{batch_id}}}:rejected"

    @staticmethod
    def attempts(request_id: str) -> str:
        """How many times workers have started the request, and which work entry owns its id
        (``PRIORITY/ENTRY_ID``: another entry with the id is a duplicate); deleted when it
        ends."""
        return f"{PREFIX}:att:{{{request_id}}}"

    @cached_property
    def webhook_events(self) -> str:
        """The webhook outbox: one entry per event to deliver (``type``, ``id``, ``tenant``),
        added where the state is decided (APPLY); read by gateways (consumer group
        ``WEBHOOK_GROUP``), deleted once every endpoint has it or gave up."""
        return f"{self._base}:hooks"

    @cached_property
    def webhook_secrets(self) -> str:
        """The tenants' webhook secrets (a hash: tenant -> ``whsec_...``), apart from their other
        settings (``tenants``) so that only gateways' ACL users read them
        (``SECRETS_PREFIX``)."""
        return f"{SECRETS_PREFIX}:{{{self.queue}}}:webhooks"

    @cached_property
    def webhook_done(self) -> str:
        """Which endpoints took which pending webhook event (``ENTRY ENDPOINT``): retries skip."""
        return f"{self._base}:hooks:done"

    @cached_property
    def webhook_dead(self) -> str:
        """Webhook deliveries that gave up (a stream: event, endpoint, why)."""
        return f"{self._base}:hooks:dead"

    def stored(self, tenant: str, kind: str) -> str:
        """What a tenant keeps via gateways, per kind (files, ...; scored by expiry: quotas)."""
        return f"{self._base}:stored:{tenant}:{kind}"

    def reader_wake(self, reader: str) -> str:
        """A gateway's result reader's wake stream (an entry ends its blocked read)."""
        return f"{self._base}:wake:{reader}"

    @staticmethod
    def response(request_id: str) -> str:
        """A ``/v1/responses`` response's record (its id is ``resp_`` + the request's id): in
        the request's slot, so one MGET reads it with the request's state."""
        return f"{PREFIX}:resp:{{{request_id}}}"

    @staticmethod
    def events(request_id: str) -> str:
        """The request's event stream; its last event carries the final Result."""
        return f"{PREFIX}:ev:{{{request_id}}}"

    @staticmethod
    def request_keys(request_id: str) -> tuple[str, str, str, str]:
        """``result``, ``events``, ``attempts``, ``response`` at once (a write names all four)."""
        i = f"{{{request_id}}}"
        return f"{PREFIX}:res:{i}", f"{PREFIX}:ev:{i}", f"{PREFIX}:att:{i}", f"{PREFIX}:resp:{i}"


class Lanes(Keys):
    """The keys one worker uses: the queue's, and the work keys of the lanes it reads (its
    served names', and the unnamed lane when its model is the queue's default), in order. Its
    ``streams()`` are every lane's, lane by lane; a lane's own keys are ``lane_of(stream)``'s."""

    def __init__(self, queue: str, models: Sequence[str | None]) -> None:
        super().__init__(queue)
        if not models:
            raise ConfigError("a worker reads at least one lane")
        self._lanes = [Keys(queue, m) for m in models]

    def lanes(self) -> list[Keys]:
        return list(self._lanes)

    @property
    def doorbell(self) -> str:
        raise TypeError("a worker's lanes have a doorbell each: use doorbells")

    @property
    def waiting(self) -> str:
        raise TypeError("a worker's lanes have a backlog each: use lane.waiting")
