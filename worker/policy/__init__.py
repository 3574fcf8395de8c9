"""The worker's decisions, as pure functions and small state machines: no Redis, no torch, no
clock (time is an argument). Each is unit-tested on plain data.

- ``admission``: what a delivered entry becomes (runnable, failed, expired);
- ``batching``: which waiting requests form the next batch;
- ``lookahead``: what the worker holds (waiting, starting, running) and how much more it may read;
- ``budget``: the token budget, halved for a while after an out-of-memory error;
- ``suspects``: when a request delivered before (maybe the one that kills workers) may start.
"""
