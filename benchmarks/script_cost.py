"""What the queue's four scripts cost Redis per request, with nothing else running: the
client's submission (SUBMIT), a worker's read (PULL, a lone tenant's path), the running mark
(APPLY ``running``) and the final write (APPLY ``final``), each over a batch of ``--batch``
requests, ``--rounds`` batches; Redis' own time for the call (INFO commandstats, what the
script calls included), µs a request, the median and the lowest of the rounds (the first two
left out: the scripts' first calls load them).

``queue_speed_stages.py`` says where a whole run's time goes; this isolates the scripts, for
changes to their Lua (a round of the two is quick: run it on each tree, taking turns).

    python benchmarks/script_cost.py --batch 256 --rounds 30
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import redis
from genq.common import script_calls, states
from genq.common.keys import Keys
from genq.common.lua.read import PULL
from genq.common.scripts import apply
from genq.producer import Client
from genq.worker.devtools.redis_server import RedisServer

WARM_ROUNDS = 2
"""Rounds left out of the figures: the first calls of each script load it (EVAL)."""


def scripts_usec(r: redis.Redis) -> float:
    """Redis' microseconds in scripts so far (EVALSHA and EVAL)."""
    stats = r.info("commandstats")
    return float(
        sum(v["usec"] for k, v in stats.items() if k in ("cmdstat_evalsha", "cmdstat_eval"))
    )


def measure(batch: int, rounds: int) -> dict[str, list[float]]:
    """µs a request of each script, per round."""
    out: dict[str, list[float]] = {"submit": [], "pull": [], "running": [], "final": []}
    with RedisServer() as server:
        r = redis.Redis(port=server.port)
        keys = Keys("cost")
        client = Client.from_url(server.url, "cost")
        streams = keys.streams()
        for k in range(rounds):
            before = scripts_usec(r)  # one SUBMIT call a round (--batch at most 500)
            client.submit_many([f"job {k} {i} " for i in range(batch)], max_new_tokens=16)
            out["submit"].append((scripts_usec(r) - before) / batch)
            now_ms = int(time.time() * 1000)
            room = [batch] * len(streams)
            args = [keys.config, *streams, "w0", "fair", now_ms, 100_000, *room, batch, 0, 0, 150]
            before = scripts_usec(r)
            got = script_calls.call(r, PULL, 1 + len(streams), *args)
            out["pull"].append((scripts_usec(r) - before) / batch)
            entries = [(s.decode(), e) for s, es in got for e in es]
            ids = [(fields[1].decode(), s, eid.decode()) for s, (eid, fields) in entries]
            who = {"priority": "normal", "tenant": "default", "metadata": {}, "worker": "w0"}
            times = {"queued_ms": 1, "started_ms": 2}
            running = [
                (rid, s, eid, states.running(request_id=rid, **who, **times)) for rid, s, eid in ids
            ]
            before = scripts_usec(r)
            apply(r, keys, 86_400, "running", running, 3, token=f"w0:{k}", streams=streams)
            out["running"].append((scripts_usec(r) - before) / batch)
            ended = {"text": "t", "finish_reason": "length", "prompt_tokens": 1, "model": "echo"}
            ended |= {"completion_tokens": 1, "finished_ms": 3, "generation_ms": 1}
            final = [
                (
                    rid,
                    s,
                    eid,
                    states.succeeded(request_id=rid, **who, **times, **ended, batch_size=batch),
                )
                for rid, s, eid in ids
            ]
            before = scripts_usec(r)
            apply(r, keys, 86_400, "final", final, streams=streams)
            out["final"].append((scripts_usec(r) - before) / batch)
    return {name: v[WARM_ROUNDS:] for name, v in out.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--json", action="store_true", help="one JSON line: the medians")
    a = p.parse_args()
    got = measure(a.batch, max(a.rounds, WARM_ROUNDS + 1))
    if a.json:
        print(json.dumps({name: statistics.median(v) for name, v in got.items()}))
        return
    print("| script | µs a request, median | lowest |\n|---|---:|---:|")
    for name, v in got.items():
        print(f"| {name} | {statistics.median(v):.2f} | {min(v):.2f} |")


if __name__ == "__main__":
    main()
