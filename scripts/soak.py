"""Soak run for RELIABILITY.md: workers SIGKILLed and replaced, redis-server SIGKILLed and
restarted (AOF, appendfsync always), Redis made full (maxmemory, noeviction) for a few seconds
now and then, a producer submitting all along. At the end every accepted request must be final
and succeeded, with exactly one final event, and nothing pending.

    .venv/bin/python scripts/soak.py --minutes 5 [--workers 3] [--kill-every-s 3]
        [--redis-restart-every-s 60] [--redis-full-every-s 40] [--redis-full-for-s 5] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import redis
from genq.common.keys import GROUP, Keys
from genq.producer import Client, SubmitFailed
from genq.worker.devtools.redis_server import RedisServer

QUEUE = "soak"


def start_worker(url: str, n: int, logs: Path) -> subprocess.Popen[bytes]:
    args = [
        sys.executable, "-m", "genq.worker", "worker", "--redis-url", url, "--queue", QUEUE,
        "--consumer", f"soak{n}", "--engine", "echo", "--echo-step-ms", "2",
        "--max-batch-size", "16", "--claim-idle-ms", "2000",
    ]  # fmt: skip
    log = (logs / f"soak{n}.log").open("wb")
    return subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--minutes", type=float, default=5)
    p.add_argument("--workers", type=int, default=3)
    p.add_argument("--kill-every-s", type=float, default=3)
    p.add_argument("--redis-restart-every-s", type=float, default=60)
    p.add_argument("--redis-full-every-s", type=float, default=40)
    p.add_argument("--redis-full-for-s", type=float, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    rng = random.Random(a.seed)
    logs = Path(tempfile.mkdtemp(prefix="genq-soak-"))
    server = RedisServer(["--appendonly", "yes", "--appendfsync", "always"]).start()
    url = server.url
    counter = iter(range(10**9))
    workers = {next(counter): start_worker(url, 0, logs) for _ in range(a.workers)}
    client = Client.from_url(url, QUEUE)
    accepted: list[str] = []
    refused = 0
    stop = threading.Event()

    def produce() -> None:
        nonlocal refused
        i = 0
        while not stop.is_set():
            batch = [
                {"prompt": f"soak {i}-{j}", "max_new_tokens": rng.randint(4, 40),
                 "priority": rng.choice(["high", "normal", "low"])}
                for j in range(20)
            ]  # fmt: skip
            try:
                accepted.extend(client.submit_many(batch))
            except SubmitFailed as err:  # Redis full: told exactly which went in
                accepted.extend(err.submitted)
                refused += len(err.not_submitted)
            except redis.ConnectionError:
                refused += len(batch)  # the caller is told: not accepted
            i += 1
            time.sleep(0.05)

    producer = threading.Thread(target=produce)
    producer.start()
    t_end = time.monotonic() + a.minutes * 60
    kills = restarts = fills = 0
    next_kill = time.monotonic() + a.kill_every_s
    next_restart = time.monotonic() + a.redis_restart_every_s
    next_full = time.monotonic() + a.redis_full_every_s
    full_until: float | None = None
    while time.monotonic() < t_end:
        time.sleep(0.1)
        if time.monotonic() >= next_kill:
            victim = rng.choice(list(workers))
            workers.pop(victim).kill()
            kills += 1
            n = next(counter)
            workers[n] = start_worker(url, n, logs)
            next_kill += a.kill_every_s
        if full_until is None and time.monotonic() >= next_full:
            with contextlib.suppress(redis.RedisError):
                redis.Redis.from_url(url).config_set("maxmemory", 1)  # full: writes refused
                fills += 1
                full_until = time.monotonic() + a.redis_full_for_s
            next_full += a.redis_full_every_s
        if full_until is not None and time.monotonic() >= full_until:
            with contextlib.suppress(redis.RedisError):
                redis.Redis.from_url(url).config_set("maxmemory", 0)
                full_until = None
        if time.monotonic() >= next_restart:
            assert server.process is not None
            server.process.kill()
            server.stop(remove_dir=False)
            time.sleep(0.5)
            server.start()
            full_until = None  # a restarted Redis has its configured maxmemory (none)
            restarts += 1
            next_restart += a.redis_restart_every_s
    stop.set()
    producer.join()
    t0 = time.monotonic()
    results = client.results(accepted, timeout=600)
    drain_s = time.monotonic() - t0
    r = redis.Redis.from_url(url)
    keys = Keys(QUEUE)
    pending = sum(int(r.xpending(s, GROUP)["pending"]) for s in keys.streams())
    statuses: dict[str, int] = {}
    for x in results:
        statuses[x.status] = statuses.get(x.status, 0) + 1
    pipe = r.pipeline(transaction=False)
    for i in accepted:
        pipe.xlen(keys.events(i))
    events = pipe.execute()
    report = {
        "minutes": a.minutes, "workers": a.workers, "accepted": len(accepted),
        "refused_while_redis_down_or_full": refused, "worker_kills": kills,
        "redis_restarts": restarts, "redis_full_episodes": fills,
        "statuses": statuses, "lost": len(accepted) - statuses.get("succeeded", 0),
        "requests_with_more_than_one_final_event": sum(1 for e in events if e != 1),
        "pending_left": pending, "drain_after_stop_s": round(drain_s, 1),
    }  # fmt: skip
    for w in workers.values():
        w.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            w.wait(timeout=30)
    server.stop()
    print(json.dumps(report, indent=2) if a.json else report)
    sys.exit(0 if report["lost"] == 0 and pending == 0 else 1)


if __name__ == "__main__":
    main()
