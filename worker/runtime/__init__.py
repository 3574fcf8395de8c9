"""The worker at run time: the loop and everything that talks to Redis or an engine.

- ``worker``: lifecycle, signals and the turn (reclaim, read, admit, plan, start, collect, write);
- ``queue_io``: the consumer group's reads and writes (join, resume, reclaim, read, mark
  running, dead-letter);
- ``runners``: static and continuous engines behind one interface;
- ``outcomes``: final results as the worker writes them;
- ``writer``: the thread that writes results; ``recovery``: claims and takeover;
- ``heartbeat``: counters and the stats hash; ``metrics``: Prometheus;
- ``dead_letter``: the dead-letter stream; ``launcher``: one worker per GPU.
"""
