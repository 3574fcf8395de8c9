"""Workers on separate "hosts": each host is a network namespace made by the test (``ip netns``)
with a veth link of its own to the machine running redis-server. The hosts share the work fairly;
cutting one host's link, or killing its workers, loses nothing. Skipped, with the reason, where
namespaces cannot be made (no root, no ``ip``, a container without CAP_NET_ADMIN)."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
from genq.common.keys import Keys
from genq.producer import Client
from genq.worker.devtools.redis_server import RedisServer

from tests.conftest import WorkerProcess, wait_until

SUBNET = f"10.{60 + os.getpid() % 50}"
"""10.X.N.0/24 per host N; X varies with the pid so parallel runs do not collide."""


def _ip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=False)


def _why_no_netns() -> str | None:
    if shutil.which("ip") is None:
        return "the `ip` command (iproute2) is not installed"
    name = f"genq-probe-{os.getpid()}"
    made = _ip("netns", "add", name)
    if made.returncode != 0:
        return f"cannot make network namespaces here: {made.stderr.strip()}"
    _ip("netns", "del", name)
    return None


_WHY = _why_no_netns()
pytestmark = pytest.mark.skipif(_WHY is not None, reason=_WHY or "")


@dataclass
class Host:
    """A network namespace with a veth link to the root namespace."""

    n: int

    @property
    def name(self) -> str:
        return f"genq-h{self.n}-{os.getpid()}"

    @property
    def link(self) -> str:  # the root side of the veth pair (interface names: max 15 chars)
        return f"gq{os.getpid() % 100000}h{self.n}"

    @property
    def gateway(self) -> str:
        """The root namespace's address on this host's link (where redis-server listens)."""
        return f"{SUBNET}.{self.n}.1"

    def create(self) -> None:
        inside = f"{self.link}i"
        for args in (
            ("netns", "add", self.name),
            ("link", "add", self.link, "type", "veth", "peer", "name", inside),
            ("link", "set", inside, "netns", self.name),
            ("addr", "add", f"{self.gateway}/24", "dev", self.link),
            ("link", "set", self.link, "up"),
            ("-n", self.name, "addr", "add", f"{SUBNET}.{self.n}.2/24", "dev", inside),
            ("-n", self.name, "link", "set", inside, "up"),
            ("-n", self.name, "link", "set", "lo", "up"),
        ):
            done = _ip(*args)
            assert done.returncode == 0, f"ip {' '.join(args)}: {done.stderr}"

    def cut(self) -> None:
        assert _ip("link", "set", self.link, "down").returncode == 0

    def restore(self) -> None:
        assert _ip("link", "set", self.link, "up").returncode == 0

    def destroy(self) -> None:
        _ip("link", "del", self.link)
        _ip("netns", "del", self.name)


@pytest.fixture()
def hosts() -> Iterator[list[Host]]:
    made = [Host(1), Host(2)]
    try:
        for h in made:
            h.create()
        yield made
    finally:
        for h in made:
            h.destroy()


@pytest.fixture()
def shared_redis(hosts: list[Host]) -> Iterator[RedisServer]:
    """A redis-server reachable from every host over its link."""
    binds = ["127.0.0.1", *(h.gateway for h in hosts)]
    with RedisServer(["--bind", *binds, "--protected-mode", "no"]) as server:
        yield server


def start_host_worker(
    host: Host, server: RedisServer, queue: str, name: str, log_dir: Path, *args: str
) -> WorkerProcess:
    url = f"redis://{host.gateway}:{server.port}/0"
    return WorkerProcess(
        ["--redis-url", url, "--queue", queue, "--consumer", name, *args],
        log_dir / f"{name}.log",
        wrapper=("ip", "netns", "exec", host.name),
    )


WORKER_ARGS = (
    "--engine",
    "echo",
    "--echo-step-ms",
    "2",
    "--max-batch-size",
    "8",
    "--max-lookahead",
    "8",
    "--claim-idle-ms",
    "1000",
)


def test_hosts_share_the_work_fairly_and_losing_one_loses_nothing(
    hosts: list[Host], shared_redis: RedisServer, tmp_path: Path, queue: str
) -> None:
    client = Client.from_url(shared_redis.url, queue)
    r = redis.Redis.from_url(shared_redis.url)
    workers = {
        f"h{h.n}w{i}": start_host_worker(
            h, shared_redis, queue, f"h{h.n}w{i}", tmp_path, *WORKER_ARGS
        )
        for h in hosts
        for i in (0, 1)
    }
    try:
        wait_until(lambda: all(r.exists(Keys(queue).worker(n)) for n in workers), 60)

        # Shared, and fairly: each host does a fair part (not all to whichever read first).
        ids = client.submit_many([f"fair {i}" for i in range(600)], max_new_tokens=4)
        results = client.results(ids, timeout=120)
        assert {x.status for x in results} == {"succeeded"}
        by_host = Counter(x.worker[:2] for x in results if x.worker)
        assert set(by_host) == {"h1", "h2"}
        assert min(by_host.values()) >= 0.25 * len(ids), by_host

        # Cut host 1's link mid-work: host 2 takes over what host 1 held; nothing is lost and
        # every request has exactly one final event.
        ids = client.submit_many([f"cut {i}" for i in range(600)], max_new_tokens=20)
        wait_until(lambda: sum(_held(r, queue, f"h1w{i}") for i in (0, 1)) > 0, 30)
        hosts[0].cut()
        results = client.results(ids, timeout=180)
        assert {x.status for x in results} == {"succeeded"}
        assert all(r.xlen(Keys.events(i)) == 1 for i in ids)
        assert Counter(x.worker[:2] for x in results if x.worker)["h2"] > 0
        hosts[0].restore()

        # Kill host 2's workers (SIGKILL): host 1, reconnected, finishes everything.
        ids = client.submit_many([f"kill {i}" for i in range(300)], max_new_tokens=20)
        wait_until(lambda: sum(_held(r, queue, f"h2w{i}") for i in (0, 1)) > 0, 30)
        for i in (0, 1):
            workers[f"h2w{i}"].kill()
        results = client.results(ids, timeout=180)
        assert {x.status for x in results} == {"succeeded"}
        assert all(r.xlen(Keys.events(i)) == 1 for i in ids)
    finally:
        hosts[0].restore()
        for w in workers.values():
            w.stop(timeout_s=30)
        r.close()


def _held(r: redis.Redis, queue: str, consumer: str) -> int:
    total = 0
    for stream in Keys(queue).streams():
        try:
            total += len(r.xpending_range(stream, "workers", "-", "+", 1000, consumername=consumer))
        except redis.ResponseError:
            continue
    return total
