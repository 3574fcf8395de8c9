"""``genq worker --metrics-port N``: a Prometheus endpoint with the worker's own metrics.

Names follow Prometheus conventions (base units, ``_total`` for counters). Every metric carries
the worker's ``queue`` and ``model`` labels (its served name: a sum by ``model`` is per model;
its adapters' requests count under it); requests also carry ``priority``, ``status`` and
``tenant``, and generated tokens ``tenant``. Cardinality: one series per tenant (x status x
priority) per metric; a fleet with thousands of tenants should scrape ``genq stats --json``
instead.

=====================================  =========  =============================================
metric                                 type       what
=====================================  =========  =============================================
``genq_requests_total``                counter    requests ended, by status, priority, tenant
``genq_queue_wait_seconds``            histogram  enqueue to start, by priority
``genq_generation_seconds``            histogram  engine time per static batch, or per request
                                                  (continuous)
``genq_batch_size``                    histogram  requests per batch (static) or running at a
                                                  start (continuous)
``genq_batch_tokens``                  histogram  prompt + completion tokens per batch
``genq_generated_tokens_total``        counter    completion tokens returned, by tenant
``genq_in_flight_requests``            gauge      requests this worker holds (waiting + running)
``genq_padding_ratio``                 gauge      padded prompt positions / all, since start
``genq_prefix_cache_hit_ratio``        gauge      prompt tokens taken from the engine's prefix
                                                  cache / all prompt tokens, since start
``genq_embedded_inputs_total``         counter    embedding inputs answered (repeats counted)
``genq_embedded_tokens_total``         counter    input tokens computed for them (a repeat once)
``genq_embedding_saved_inputs_total``  counter    inputs not computed: an identical one of
                                                  their tenant (or sharing tenants) was
``genq_model_loads_total``             counter    a pool's loads, by model (the ``model`` label
                                                  is the model loaded)
``genq_model_evictions_total``         counter    a pool's evictions, by model
``genq_model_load_seconds``            histogram  a pool's load times, by model
``genq_model_loading``                 gauge      1 while a pool's model loads, by model
=====================================  =========  =============================================

Without ``--metrics-port`` nothing is imported or served.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any, Protocol


class Ended(Protocol):
    """What the metrics need of a request that ended (the worker's Outcome)."""

    status: str
    priority: str
    queue_wait_ms: int | None
    completion_tokens: int

    @property
    def tenant(self) -> str: ...


_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
_TOKEN_BUCKETS = (64, 256, 1024, 4096, 16384, 65536)
_LOAD_BUCKETS = (0.1, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160)


class Metrics:
    """The worker's Prometheus metrics; every method is a no-op when disabled."""

    def __init__(
        self, queue: str, port: int | None, host: str = "0.0.0.0", model: str = "-"
    ) -> None:
        self.enabled = port is not None
        self.queue = queue
        self.model = model
        if port is None:
            return
        import prometheus_client as pc

        self.registry = pc.CollectorRegistry()
        q = ["queue", "model"]
        self.requests = pc.Counter(
            "genq_requests_total",
            "Requests ended, by final status",
            [*q, "status", "priority", "tenant"],
            registry=self.registry,
        )
        self.wait = pc.Histogram(
            "genq_queue_wait_seconds",
            "Time from enqueue to start",
            [*q, "priority"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.generation = pc.Histogram(
            "genq_generation_seconds",
            "Engine time per batch (static) or request (continuous)",
            q,
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.batch_size = pc.Histogram(
            "genq_batch_size",
            "Requests per batch",
            q,
            buckets=_SIZE_BUCKETS,
            registry=self.registry,
        )
        self.batch_tokens = pc.Histogram(
            "genq_batch_tokens",
            "Prompt + completion tokens per batch",
            q,
            buckets=_TOKEN_BUCKETS,
            registry=self.registry,
        )
        self.tokens = pc.Counter(
            "genq_generated_tokens",
            "Completion tokens returned",
            [*q, "tenant"],
            registry=self.registry,
        )
        self.in_flight = pc.Gauge(
            "genq_in_flight_requests",
            "Requests held (waiting + running)",
            q,
            registry=self.registry,
        )
        self.cache_hits = pc.Gauge(
            "genq_prefix_cache_hit_ratio",
            "Prompt tokens taken from the engine's prefix cache / all prompt tokens, since start",
            q,
            registry=self.registry,
        )
        self.padding = pc.Gauge(
            "genq_padding_ratio",
            "Padded prompt positions / all, since start",
            q,
            registry=self.registry,
        )
        self._pool_metrics(pc, q)
        self._embedding_metrics(pc, q)
        self.server: Any
        self.server, _ = pc.start_http_server(port, addr=host, registry=self.registry)

    def _pool_metrics(self, pc: Any, q: list[str]) -> None:
        """A pool's: its loads, evictions and load times, by the model loaded."""
        self.pool_loads = pc.Counter(
            "genq_model_loads", "Loads of a pool's model", q, registry=self.registry
        )
        self.pool_evictions = pc.Counter(
            "genq_model_evictions", "Evictions of a pool's model", q, registry=self.registry
        )
        self.pool_load = pc.Histogram(
            "genq_model_load_seconds",
            "Time a load of a pool's model took",
            q,
            buckets=_LOAD_BUCKETS,
            registry=self.registry,
        )
        self.pool_loading = pc.Gauge(
            "genq_model_loading", "1 while a pool's model loads", q, registry=self.registry
        )

    def _embedding_metrics(self, pc: Any, q: list[str]) -> None:
        """An embedding engine's: inputs, their tokens, and repeats not computed (inputs/s is
        ``rate(genq_embedded_inputs_total[1m])``)."""
        self.embedded_inputs = pc.Counter(
            "genq_embedded_inputs", "Embedding inputs answered", q, registry=self.registry
        )
        self.embedded_tokens = pc.Counter(
            "genq_embedded_tokens",
            "Input tokens computed for embedding inputs",
            q,
            registry=self.registry,
        )
        self.saved_inputs = pc.Counter(
            "genq_embedding_saved_inputs",
            "Embedding inputs not computed: an identical one of their scope was",
            q,
            registry=self.registry,
        )

    def embedded(self, inputs: int, tokens: int, saved: int) -> None:
        """A batch of an embedding engine answered ``inputs`` (``saved`` of them repeats)."""
        if self.enabled:
            self.embedded_inputs.labels(self.queue, self.model).inc(inputs)
            self.embedded_tokens.labels(self.queue, self.model).inc(tokens)
            self.saved_inputs.labels(self.queue, self.model).inc(saved)

    def ended(self, outcomes: Sequence[Ended]) -> None:
        """Count requests that reached a final state (and their waits and tokens)."""
        if not self.enabled:
            return
        # One label lookup per label set, not per request: a batch is hundreds of requests.
        counts = Counter((o.status, o.priority, o.tenant) for o in outcomes)
        for (status, priority, tenant), n in counts.items():
            self.requests.labels(self.queue, self.model, status, priority, tenant).inc(n)
        for priority in {o.priority for o in outcomes}:
            wait = self.wait.labels(self.queue, self.model, priority)
            for o in outcomes:
                if o.priority == priority and o.queue_wait_ms is not None:
                    wait.observe(o.queue_wait_ms / 1000)
        tokens: Counter[str] = Counter()
        for o in outcomes:
            tokens[o.tenant] += o.completion_tokens
        for tenant, n in tokens.items():
            if n:
                self.tokens.labels(self.queue, self.model, tenant).inc(n)

    def batch(self, size: int, tokens: int, seconds: float | None) -> None:
        """Record one batch (static) or one started set (continuous)."""
        if not self.enabled:
            return
        self.batch_size.labels(self.queue, self.model).observe(size)
        if tokens:
            self.batch_tokens.labels(self.queue, self.model).observe(tokens)
        if seconds is not None:
            self.generation.labels(self.queue, self.model).observe(seconds)

    def state(
        self,
        in_flight: int,
        prompt_tokens: int,
        padded_prompt_tokens: int,
        cached_tokens: int = 0,
    ) -> None:
        """Refresh the gauges."""
        if not self.enabled:
            return
        self.in_flight.labels(self.queue, self.model).set(in_flight)
        if padded_prompt_tokens:
            self.padding.labels(self.queue, self.model).set(
                1 - prompt_tokens / padded_prompt_tokens
            )
        if prompt_tokens:
            self.cache_hits.labels(self.queue, self.model).set(cached_tokens / prompt_tokens)

    def model_loaded(self, model: str, seconds: float) -> None:
        """A pool's ``model`` was loaded in ``seconds`` (its ``model`` label: that model)."""
        if self.enabled:
            self.pool_loads.labels(self.queue, model).inc()
            self.pool_load.labels(self.queue, model).observe(seconds)

    def model_evicted(self, model: str) -> None:
        """A pool's ``model`` was evicted."""
        if self.enabled:
            self.pool_evictions.labels(self.queue, model).inc()

    def model_loading(self, model: str, loading: bool) -> None:
        """A pool's ``model`` started loading, or its load ended."""
        if self.enabled:
            self.pool_loading.labels(self.queue, model).set(1 if loading else 0)

    def close(self) -> None:
        """Stop serving."""
        if self.enabled:
            self.server.shutdown()
