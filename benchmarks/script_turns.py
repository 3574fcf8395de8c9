"""The queue's scripts of another revision against this checkout's, in one redis-server, taking
turns call by call: SUBMIT (``--batch`` requests a call), PULL (a lone tenant's read of them),
APPLY ``running`` and APPLY ``final``; Redis' own time per request (INFO commandstats, what the
script calls included).

``script_cost.py`` gives one tree's figures; on this shared machine two of its runs differ by
more than a change to the Lua saves. Here both trees' scripts run against the same server, the
same keys and the same requests, each round's first call alternating between them, and the
table gives the median of the rounds' differences: a difference of a microsecond shows (an
A/A run, a revision against itself, differs by up to ±1 µs). The arguments are built by this
checkout, so the revision's scripts must take the same KEYS and ARGV (a change to the Lua, not
to what it is given).

    python benchmarks/script_turns.py --rev c40a5d3 --rounds 40
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis
from genq.common import states
from genq.common.keys import Keys
from genq.common.lua.read import PULL
from genq.common.scripts import APPLY, SUBMIT, apply_args
from genq.producer.building import prepare_many
from genq.producer.submitting import submit_calls
from genq.worker.devtools.redis_server import RedisServer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from queue_speed_turns import tree

SCRIPTS = ("submit", "pull", "running", "final")
CHECKOUT = "checkout"
"""This checkout's tree, in the table."""
WARM_ROUNDS = 4
"""Rounds left out: the first calls of each script load it."""
SOURCES = """
import json
try:
    from genq.common.lua.read import PULL
except ImportError:  # a revision before genq.common.lua
    from genq.common.fair_share import PULL
from genq.common.scripts import APPLY, SUBMIT
print(json.dumps({"SUBMIT": SUBMIT, "PULL": PULL, "APPLY": APPLY}))
"""


def scripts_of(rev: str) -> dict[str, str]:
    """The Lua of SUBMIT, PULL and APPLY as ``rev`` has them."""
    with tempfile.TemporaryDirectory(prefix="genq-scripts-") as tmp:
        path = tree(rev, Path(tmp))
        done = subprocess.run(
            [sys.executable, "-c", SOURCES],
            capture_output=True,
            text=True,
            check=True,
            cwd=path,
            env={**os.environ, "PYTHONPATH": str(path)},
        )
    sources: dict[str, str] = json.loads(done.stdout)
    return sources


def scripts_usec(r: redis.Redis) -> float:
    """Redis' microseconds in scripts so far."""
    stats: dict[str, Any] = r.info("commandstats")
    return float(
        sum(v["usec"] for k, v in stats.items() if k in ("cmdstat_eval", "cmdstat_evalsha"))
    )


def one_round(
    r: redis.Redis, keys: Keys, lua: dict[str, str], batch: int, tag: str
) -> dict[str, float]:
    """One tree's four calls over ``batch`` fresh requests: µs a request of each."""
    out: dict[str, float] = {}

    def timed(name: str, source: str, script_keys: list[str], args: list[Any]) -> Any:
        before = scripts_usec(r)
        reply = r.eval(source, len(script_keys), *script_keys, *args)
        out[name] = (scripts_usec(r) - before) / batch
        return reply

    streams = keys.streams()
    requests = prepare_many([f"job {tag} {i} " for i in range(batch)], {"max_new_tokens": 16})
    ((script_keys, args),) = submit_calls(keys, requests, 86_400)
    timed("submit", lua["SUBMIT"], script_keys, args)
    now_ms = int(time.time() * 1000)
    read = [keys.config, *streams]
    got = timed("pull", lua["PULL"], read, ["w0", "fair", now_ms, 100_000, *[batch] * 4, 0, 0, 150])
    ids = [
        (fields[fields.index(b"id") + 1].decode(), stream.decode(), entry_id.decode())
        for stream, entries in got
        for entry_id, fields in entries
    ]
    assert len(ids) == batch, f"the read took {len(ids)} of {batch}"
    who: dict[str, Any] = {"priority": "normal", "tenant": "default", "metadata": {}}
    times: dict[str, Any] = {"queued_ms": 1, "started_ms": 2}
    running = [
        (rid, s, eid, states.running(request_id=rid, worker="w0", **who, **times))
        for rid, s, eid in ids
    ]
    script_keys, args = apply_args(keys, 86_400, "running", running, 3, tag, streams=streams)
    assert all(x == 1 for x in timed("running", lua["APPLY"], script_keys, args))
    ended: dict[str, Any] = {"prompt_tokens": 1, "completion_tokens": 1, "finished_ms": 3}
    ended |= {"generation_ms": 1, "worker": "w0", "model": "echo", "batch_size": batch, **times}

    def final_state(rid: str) -> str:
        return states.succeeded(rid, "normal", "default", {}, "t", "length", **ended)

    final = [(rid, s, eid, final_state(rid)) for rid, s, eid in ids]
    script_keys, args = apply_args(keys, 86_400, "final", final, streams=streams)
    assert all(x == 1 for x in timed("final", lua["APPLY"], script_keys, args))
    return out


def take_turns(
    trees: dict[str, dict[str, str]], batch: int, rounds: int
) -> dict[str, list[dict[str, float]]]:
    """Each tree's rounds, their calls in turns on one server (the first alternating)."""
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    names = list(trees)
    with RedisServer() as server:
        r = redis.Redis(port=server.port)
        keys = Keys("turns")
        for k in range(rounds):
            for name in names if k % 2 == 0 else names[::-1]:
                runs[name].append(one_round(r, keys, trees[name], batch, f"{k}-{name}"))
    return {name: v[WARM_ROUNDS:] for name, v in runs.items()}


def table(rev: str, runs: dict[str, list[dict[str, float]]], batch: int) -> str:
    """The medians and the median of the rounds' differences, in markdown."""
    old, new = runs[rev], runs[CHECKOUT]
    median: Callable[[list[float]], float] = statistics.median
    lines = [
        f"Command: `python benchmarks/script_turns.py --rev {rev} --rounds "
        f"{len(old) + WARM_ROUNDS} --batch {batch}` (µs a request in Redis)",
        "",
        f"| script | {rev} | {CHECKOUT} | difference, median of rounds | {CHECKOUT} faster in |",
        "|---|---:|---:|---:|---:|",
    ]
    for name in SCRIPTS:
        a, b = [x[name] for x in old], [x[name] for x in new]
        diffs = [y - x for x, y in zip(a, b, strict=True)]
        lines.append(
            f"| {name} | {median(a):.2f} | {median(b):.2f} | {median(diffs):+.2f} | "
            f"{sum(d < 0 for d in diffs)} of {len(diffs)} |"
        )
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rev", required=True, help="the revision to compare this checkout with")
    p.add_argument("--batch", type=int, default=256, help="requests a call (at most 500)")
    p.add_argument("--rounds", type=int, default=40)
    a = p.parse_args()
    mine = {"SUBMIT": SUBMIT, "PULL": PULL, "APPLY": APPLY}
    trees = {a.rev: scripts_of(a.rev), CHECKOUT: mine}
    batch = min(a.batch, 500)  # one SUBMIT call
    runs = take_turns(trees, batch, max(a.rounds, WARM_ROUNDS + 1))
    print(table(a.rev, runs, batch))


if __name__ == "__main__":
    main()
