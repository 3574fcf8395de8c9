"""Helpers for developing genq, apart from the runtime: what tests, the demo and the benches start.

- ``redis_server``: a private redis-server (tests, the demo, benchmarks);
- ``worker_process``, ``gateway_process``: a worker or gateway in a subprocess;
- ``webhook_receiver``: an HTTP endpoint that records the webhook deliveries it gets;
- ``gpu_check``: the prepared GPU check's cases and its one table (``scripts/gpu_check.sh``).

The bench scenarios themselves are in ``genq.worker.bench``.
"""
