"""Tools for developing and measuring genq, apart from the runtime.

- ``redis_server``: a private redis-server (tests, the demo, benchmarks);
- ``worker_process``, ``gateway_process``: a worker or gateway in a subprocess;
- ``webhook_receiver``: an HTTP endpoint that records the webhook deliveries it gets;
- the scenarios behind ``genq bench``: ``bench_modes`` (in-process against through the queue),
  ``bench_priority``, ``bench_fleet`` (against an ideal central queue), ``bench_gateway``,
  ``bench_vllm`` (vLLM alone against vLLM through the queue), ``bench_tenants`` and
  ``bench_structured`` (a JSON schema against free text, per engine; compile costs),
  ``bench_webhooks`` (webhook delivery latency and deliveries per second), ``bench_dashboard``
  (a dashboard refresh's cost in Redis, and its render time, on a busy queue).
"""
