"""The worker's decisions, as pure functions and small state machines: no Redis, no torch, no
clock (time is an argument). Each is unit-tested on plain data.

- ``admission``: what a delivered entry becomes (runnable, failed, expired);
- ``lookahead``: what the worker holds (waiting, starting) and how much more it may read;
- ``ordering``: who goes first among what waits (the seam a policy plugs into: ``fifo``;
  ``fair`` is ``fair_share.FairShare``);
- ``batching``: which waiting requests form the next batch (priority with aging, length,
  budget, wait-to-fill);
- ``planning``: the batching policy within the room a running batch leaves;
- ``arrivals``: whether another arrival is expected within a wait-to-fill window;
- ``fair_share``: the fair share's whole rule: what a read charges a tenant and an end
  refunds, a worker's own account, the anchor and fill of a fair batch, the ``fair`` order;
- ``prefixes``: what prefixes a worker holds (an LRU in tokens);
- ``affinity``: what the engine holds goes first, over an order that still picks the anchor:
  the prefix rule (same prefix in one batch, warm before cold) and the adapter rule (the
  anchor's LoRA adapter, resident ones, then cold ones);
- ``budget``: the token budget, halved for a while after an out-of-memory error;
- ``sizing``: the batch limits ``auto`` picks (fixed on a CPU, from free memory on a GPU);
- ``suspects``: when a request delivered before (maybe the one that kills workers) may start;
- ``spacing``: how long a saturated static worker holds a batch so that the fleet's starts
  spread over a turn (staggered starts);
- ``preemption``: which running requests yield their places to higher-priority waiting ones,
  and which paused ones run again;
- ``model_pool``: which of a worker's models it keeps loaded, and when it swaps (by the
  backlog, the oldest request, or draining the resident models first).
"""
