"""What one worker costs Redis, counted by Redis itself (INFO commandstats: the commands inside
scripts included; INFO stats total_net_input_bytes): idle, per request in a closed loop (one
request after another), and per request in a burst (all submitted at once).

    python benchmarks/redis_cost.py [--idle-s 30] [--loop 200] [--burst 5000]

One echo worker (``genq worker --engine echo``) on a private redis-server; the client's own
commands are counted too in the loop and burst (they are part of a request's cost), not in the
idle count (nothing runs then but the worker and the count itself).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from typing import Any

import redis
from genq.producer import Client
from genq.worker.devtools.redis_server import RedisServer

MINE = ("cmdstat_info", "cmdstat_config|resetstat")


def counted(r: redis.Redis) -> tuple[int, int]:
    """(commands, bytes into Redis) since the last reset, less this script's counting."""
    stats: Any = r.info("commandstats")
    net: Any = r.info("stats")
    calls = sum(int(v["calls"]) for k, v in stats.items() if k not in MINE)
    return calls, int(net["total_net_input_bytes"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--idle-s", type=float, default=30.0)
    parser.add_argument("--loop", type=int, default=200)
    parser.add_argument("--burst", type=int, default=5000)
    args = parser.parse_args()
    with RedisServer() as server:
        flags = ["--redis-url", server.url, "--queue", "cost", "--engine", "echo"]
        worker = subprocess.Popen(
            [sys.executable, "-m", "genq.worker", "worker", *flags], stderr=subprocess.DEVNULL
        )
        r = redis.Redis.from_url(server.url)
        try:
            client = Client.from_url(server.url, "cost")
            client.generate("warm up", timeout=60)
            time.sleep(12)  # past the busy heartbeats: idle from here
            r.config_resetstat()
            time.sleep(args.idle_s)
            idle, _ = counted(r)
            print(f"idle worker: {idle / args.idle_s:.2f} commands/s over {args.idle_s:.0f} s")
            r.config_resetstat()
            before = counted(r)[1]
            for i in range(args.loop):
                client.generate(f"loop {i}", max_new_tokens=4, timeout=60)
            calls, net = counted(r)
            print(
                f"closed loop of {args.loop}: {calls / args.loop:.1f} commands and "
                f"{(net - before) / args.loop:,.0f} bytes into Redis per request"
            )
            r.config_resetstat()
            before = counted(r)[1]
            ids = client.submit_many([f"burst {i}" for i in range(args.burst)], max_new_tokens=4)
            client.results(ids, timeout=600)
            calls, net = counted(r)
            print(
                f"burst of {args.burst}: {calls / args.burst:.1f} commands and "
                f"{(net - before) / args.burst:,.0f} bytes into Redis per request"
            )
            client.close()
        finally:
            worker.terminate()
            worker.wait(timeout=60)
            r.close()


if __name__ == "__main__":
    main()
