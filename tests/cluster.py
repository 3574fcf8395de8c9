"""A real Redis Cluster on loopback for the tests: three primaries and three replicas, made with
``redis-cli --cluster create`` from Debian's redis-server."""

from __future__ import annotations

import random
import socket
import subprocess
import time

import redis
from genq.worker.devtools.redis_server import RedisServer

NODE_TIMEOUT_MS = 1000
"""cluster-node-timeout: a replica takes over about this long after its primary stops answering."""


def _port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _cluster_ports(n: int) -> list[int]:
    """``n`` ports whose cluster bus ports (port + 10000) are free too."""
    ports: list[int] = []
    while len(ports) < n:
        p = random.randint(20000, 29999)
        if p not in ports and _port_is_free(p) and _port_is_free(p + 10000):
            ports.append(p)
    return ports


class LocalCluster:
    """Six redis-server nodes in cluster mode; ``url`` is genq's ``redis+cluster://`` URL."""

    def __init__(self, primaries: int = 3, replicas_per_primary: int = 1) -> None:
        self.replicas = replicas_per_primary
        ports = _cluster_ports(primaries * (1 + replicas_per_primary))
        extra = [
            "--cluster-enabled",
            "yes",
            "--cluster-node-timeout",
            str(NODE_TIMEOUT_MS),
            "--cluster-config-file",
            "nodes.conf",
            "--repl-diskless-sync-delay",
            "0",
        ]
        self.nodes = [RedisServer(extra, port=p) for p in ports]

    @property
    def url(self) -> str:
        return f"redis+cluster://127.0.0.1:{self.nodes[0].port}"

    def start(self) -> LocalCluster:
        for node in self.nodes:
            node.start()
        subprocess.run(
            [
                "redis-cli",
                "--cluster",
                "create",
                *(f"127.0.0.1:{n.port}" for n in self.nodes),
                "--cluster-replicas",
                str(self.replicas),
                "--cluster-yes",
            ],
            check=True,
            capture_output=True,
            timeout=60,
        )
        self.wait_ok()
        return self

    def node_client(self, node: RedisServer) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=node.port, socket_connect_timeout=0.5)

    def wait_ok(self, timeout_s: float = 30.0) -> None:
        """Until every live node says cluster_state:ok and every replica is in sync (a replica
        that never synced cannot take over)."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                live = [n for n in self.nodes if n.process and n.process.poll() is None]
                infos = [self.node_client(n).cluster("info") for n in live]
                repl = [self.node_client(n).info("replication") for n in live]
                synced = all(i.get("master_link_status", "up") == "up" for i in repl)
                if synced and all(i["cluster_state"] == "ok" for i in infos):
                    return
            except redis.RedisError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("the cluster did not become ok")
            time.sleep(0.1)

    def primary_for(self, key: str) -> RedisServer:
        """The node that serves ``key``'s slot now (asked of any live node)."""
        live = (n for n in self.nodes if n.process is not None and n.process.poll() is None)
        client = self.node_client(next(live))
        try:
            slot = int(client.cluster("keyslot", key))
            for start, end, primary, *_ in client.execute_command("CLUSTER", "SLOTS"):
                if int(start) <= slot <= int(end):
                    return next(n for n in self.nodes if n.port == int(primary[1]))
        finally:
            client.close()
        raise RuntimeError(f"no primary serves {key!r}")

    def replica_of(self, primary: RedisServer) -> RedisServer:
        """A replica of ``primary`` (asked of the primary itself)."""
        client = self.node_client(primary)
        try:
            info = client.info("replication")
        finally:
            client.close()
        port = int(info["slave0"]["port"])
        return next(n for n in self.nodes if n.port == port)

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()
