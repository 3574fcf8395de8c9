"""The whole path against a real Redis Cluster on loopback (three primaries, three replicas made
with ``redis-cli --cluster create``): submit, workers, results, cancel, stats, and a primary
failover under load."""

from __future__ import annotations

import asyncio
import functools
import json
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from genq.common.errors import RequestNotFound
from genq.common.keys import Keys
from genq.common.models import Result
from genq.producer import AsyncClient, Client

from tests.cluster import LocalCluster
from tests.conftest import ROOT, WorkerProcess, wait_until, workers_on

pytestmark = pytest.mark.skipif(
    shutil.which("redis-cli") is None, reason="redis-cli (Debian's redis-tools) is not installed"
)


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    c = LocalCluster().start()
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture()
def cluster_worker(
    cluster: LocalCluster, tmp_path: Path, queue: str
) -> Iterator[Callable[..., WorkerProcess]]:
    with workers_on(cluster.url, tmp_path, prefix="c") as start:
        yield functools.partial(start, queue)


def test_the_whole_path_runs_on_a_redis_cluster(
    cluster: LocalCluster, queue: str, cluster_worker: Callable[..., WorkerProcess]
) -> None:
    client = Client.from_url(cluster.url, queue)
    ids = client.submit_many([f"prompt {i}" for i in range(300)], max_new_tokens=4)
    cluster_worker("--engine", "echo")
    cluster_worker("--engine", "echo")
    results = client.results(ids, timeout=60)
    assert [x.status for x in results] == ["succeeded"] * 300
    assert {x.worker for x in results} <= {"c0", "c1"}
    # Per-request keys spread over the primaries; the queue's streams sit together.
    homes = {cluster.primary_for(Keys.result(i)).port for i in ids}
    assert len(homes) == 3
    assert len({cluster.primary_for(s).port for s in Keys(queue).streams()}) == 1


def test_cancel_status_stream_and_stats_on_a_redis_cluster(
    cluster: LocalCluster, queue: str, cluster_worker: Callable[..., WorkerProcess]
) -> None:
    client = Client.from_url(cluster.url, queue)
    doomed = client.submit("never run", max_new_tokens=4)
    assert client.status(doomed).status == "queued"
    assert client.cancel(doomed) is True
    assert client.result(doomed, timeout=5).status == "cancelled"
    cluster_worker("--engine", "echo", "--echo-step-ms", "5")
    streamed = client.submit("stream me", max_new_tokens=6, stream=True)
    pieces = list(client.stream(streamed, timeout=30))
    final = pieces[-1]
    assert isinstance(final, Result) and final.status == "succeeded"
    assert "".join(p for p in pieces[:-1] if isinstance(p, str)) == final.text
    stats = subprocess.run(
        [
            sys.executable,
            "-m",
            "genq.worker",
            "stats",
            "--redis-url",
            cluster.url,
            "--queue",
            queue,
            "--json",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        check=True,
    )
    doc = json.loads(stats.stdout)
    assert "c0" in json.dumps(doc)


@pytest.mark.parametrize("how", ["coordinated", "sigkill"])
def test_a_primary_failover_under_load_loses_nothing_here(
    cluster: LocalCluster, queue: str, cluster_worker: Callable[..., WorkerProcess], how: str
) -> None:
    """The queue's primary fails over while a worker is busy: the replica takes over, the
    clients follow, and every request ends succeeded. (On loopback replication lags by
    microseconds; see docs/deployment.md for what a real failover can lose.)"""
    client = Client.from_url(cluster.url, queue)
    cluster_worker("--engine", "echo", "--echo-step-ms", "10", "--max-batch-size", "8")
    ids = client.submit_many([f"p{i}" for i in range(200)], max_new_tokens=4)
    wait_until(lambda: sum(r.status == "succeeded" for r in _states(client, ids)) >= 20)
    primary = cluster.primary_for(Keys(queue).stream("normal"))
    if how == "coordinated":
        replica = cluster.replica_of(primary)
        cluster.node_client(replica).execute_command("CLUSTER", "FAILOVER")
    else:
        assert primary.process is not None
        primary.process.kill()
        primary.process.wait()
    wait_until(lambda: cluster.primary_for(Keys(queue).stream("normal")) is not primary, 30)
    results = client.results(ids, timeout=120)
    failed = [(x.id, x.error) for x in results if x.status != "succeeded"]
    assert not failed, failed[:3]
    after = client.submit_many([f"after {i}" for i in range(20)], max_new_tokens=2)
    assert {x.status for x in client.results(after, timeout=60)} == {"succeeded"}
    if how == "sigkill":  # bring the node back (as a replica) for the next tests
        primary.start()
        cluster.wait_ok()


def _states(client: Client, ids: list[str]) -> list[Result]:
    out = []
    for i in ids:
        try:
            out.append(client.status(i))
        except RequestNotFound:
            continue
    return out


def test_the_asyncio_client_on_a_redis_cluster(
    cluster: LocalCluster, queue: str, cluster_worker: Callable[..., WorkerProcess]
) -> None:
    cluster_worker("--engine", "echo")

    async def go() -> tuple[list[Result], bool]:
        async with AsyncClient.from_url(cluster.url, queue) as c:
            ids = await c.submit_many([f"async {i}" for i in range(100)], max_new_tokens=3)
            results = await c.results(ids, timeout=60)
            return results, await c.cancel(ids[0])

    results, cancelled = asyncio.run(go())
    assert [x.status for x in results] == ["succeeded"] * 100
    assert cancelled is False  # already final


def test_redis_functions_on_a_redis_cluster(
    cluster: LocalCluster, queue: str, cluster_worker: Callable[..., WorkerProcess]
) -> None:
    """A worker's start loads the library on every primary; genq_submit's cluster form (the
    queue's marker in place of the state key), then the state written with SET NX, as the
    functions section of docs/wire-format.md says."""
    from genq.common import functions, states

    cluster_worker("--engine", "echo")
    primaries = [
        cluster.node_client(n)
        for n in cluster.nodes
        if cluster.node_client(n).execute_command("ROLE")[0] == b"master"
    ]
    assert len(primaries) == 3

    def loaded_everywhere() -> bool:
        return all(p.execute_command("FUNCTION", "LIST", "LIBRARYNAME", "genq") for p in primaries)

    wait_until(loaded_everywhere, timeout_s=30)
    for p in primaries:
        assert p.execute_command("FCALL", "genq_version", 0) == functions.VERSION
    keys, rid = Keys(queue), f"{queue}-fn"
    client = Client.from_url(cluster.url, queue)
    script_keys = [keys.config, *keys.streams(), keys.submitted(rid)]
    body = '{"prompt": "from another language", "max_new_tokens": 40}'
    [entry] = client.redis.execute_command(
        "FCALL", "genq_submit", len(script_keys), *script_keys, 600, rid, "normal", body, ""
    )
    queued = states.queued(request_id=rid, priority="normal", metadata={})
    owned = states.with_entry(queued, f"normal/{entry.decode()}")
    client.redis.set(keys.result(rid), owned, nx=True, ex=600)
    assert client.result(rid, timeout=30).text == "from another language"
