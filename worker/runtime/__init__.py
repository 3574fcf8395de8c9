"""The worker at run time: the loop and everything that talks to Redis or an engine.

- ``builder``: every part of a worker built from its settings and engine, and wired;
- ``worker``: lifecycle and the turn (read, plan, launch, advance); ``signals``: SIGTERM
  and SIGINT stop it, and end an idle wait on the doorbell at once;
- ``reader``: every way a worker gets requests (the read, the carried read, the reads beside
  a batch, reclaim, resume, the idle wait); ``read_trip``: one read's round trip, with what
  rides it, and the doorbell wait; ``read_asks``: what a read asks for (room, probe), from what
  the worker holds;
- ``planner``: the plan step (the suspect gate, the batching policy within the budget, the
  order, the arrival estimate, the start spacing);
- ``queue_io``: the consumer group's writes (join, mark running, hand back, final states,
  dead-letter, stats); ``lanes``: which lanes (a model's requests) the worker reads;
  ``model_pool``: a worker's pool of models, the lanes it reads of them, and its swaps;
- ``availability``: the loop's retry while Redis is away, and a full Redis;
- ``prefixes``: the prefixes this worker holds, told to the fleet with each start and read;
- ``fair_share``: the fair share's calls: the tenants' weights and what goes back to their
  shares (corrections, starts, refunds);
- ``intake``: the admit step (decode, verdicts, tokenize); ``starting``: the start step (mark
  running, expired and poison sorted out, hand-back);
- ``runners``: engines behind one interface; ``static_runner``: a batch per ``generate``, which
  stops for a higher priority; ``continuous_runner``: iteration-level engines, with preemption
  and time slices;
- ``outcomes``: final results as the worker writes them;
- ``writer``: the thread that writes results; ``streamed_text``: the thread that sends
  streaming requests' text, a step's pieces in one round trip; ``recovery``: claims and
  takeover;
- ``doorbell``: the idle wait's doorbell, and the thread that wakes a generating loop when a
  request arrives; ``batch_reads``: the thread that reads while a short static batch runs;
  ``spacing``: the
  fleet's phases exchanged through Redis, and a batch held for them (staggered starts);
- ``heartbeat``: counters and the stats hash; ``metrics``: Prometheus;
- ``clock``: Redis' clock, which everything the worker records is in;
- ``redis_checks``: the eviction policy checked before a model loads;
- ``dead_letter``: the dead-letter stream; ``launcher``: one worker per GPU.
"""
