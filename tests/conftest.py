"""Shared fixtures: a real redis-server on a free loopback port, worker processes, waiting."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import redis

# The README's command runs the tests two at a time (pytest -n 2, one process each): one thread
# each for torch's CPU kernels, here and in the workers they start, or two processes of two
# spinning threads on two cores run a model test ten times slower (4 s alone, 51 s beside another).
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")

from genq.common.keys import GROUP, Keys
from genq.common.settings import WorkerSettings
from genq.worker.devtools.redis_server import RedisServer

if TYPE_CHECKING:
    from genq.worker.engines.base import Engine
    from genq.worker.runtime.worker import Worker

ROOT = Path(__file__).resolve().parent.parent
_queue_names = itertools.count()

SLOWEST_FILES = (
    "test_vllm_engine.py",
    "test_bench.py",
    "test_gpu_check.py",
    "test_model_pool_engines.py",
    "test_preemption.py",
)
"""Collected first. pytest-xdist hands whole files to its two processes in collection order
(``--dist loadfile --no-loadscope-reorder``, pyproject.toml): a long file handed out last runs
alone at the end. By ``--durations`` the first three took 454, 421 and 175 s of 2,550 (the
model pool's real engines take about 110 s); a simulation of the schedule from those times
ended the longer process at 1,281 s with them first, against 1,332 s by number of tests. Only
the order changes, never what runs."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The files of ``SLOWEST_FILES`` first, in that order; the rest as collected."""
    rank = {name: i for i, name in enumerate(SLOWEST_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # (stable)


def wait_until(
    predicate: Callable[[], object], timeout_s: float = 30.0, every_s: float = 0.02
) -> None:
    """Wait for ``predicate()`` to be truthy instead of sleeping a guessed time."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout_s} s")
        time.sleep(every_s)


@pytest.fixture(scope="session", autouse=True)
def files_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The file store of every gateway and ``genq batch`` the tests start (``GENQ_FILES_DIR``,
    inherited), so that they share one, and not the user's ``~/.local/share/genq/files``."""
    path = tmp_path_factory.mktemp("files")
    os.environ["GENQ_FILES_DIR"] = str(path)
    return path


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """One real redis-server for the whole session (tests use their own queue names)."""
    with RedisServer() as server:
        yield server


@pytest.fixture()
def redis_url(redis_server: RedisServer) -> str:
    return redis_server.url


@pytest.fixture()
def r(redis_server: RedisServer) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_server.url)
    yield client
    client.close()


@pytest.fixture()
def queue() -> str:
    """A queue name no other test uses."""
    return f"t{os.getpid()}-{next(_queue_names)}"


class WorkerProcess:
    """A ``genq worker`` subprocess with its log captured to a file."""

    def __init__(
        self,
        args: list[str],
        log_path: Path,
        command: tuple[str, ...] = ("genq.worker", "worker"),
        wrapper: tuple[str, ...] = (),
    ) -> None:
        """``wrapper``: a command that runs the worker, e.g. ``ip netns exec NAME``."""
        self.log_path = log_path
        self._log = log_path.open("wb")
        self.proc = subprocess.Popen(
            [*wrapper, sys.executable, "-m", *command, *args],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
        )

    def kill(self) -> None:
        """SIGKILL: the worker gets no chance to clean up."""
        self.proc.kill()
        self.proc.wait()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, timeout_s: float = 60) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode


@contextlib.contextmanager
def workers_on(
    url: str, log_dir: Path, prefix: str = "w"
) -> Iterator[Callable[..., WorkerProcess]]:
    """``start(queue, *args, fault=None)`` starts a ``genq worker`` on ``url`` (consumers
    PREFIX0, PREFIX1, ...; ``fault``: a fault-injecting engine of tests/faults.py); all are
    stopped (SIGTERM) on leaving."""
    started: list[WorkerProcess] = []

    def start(queue: str, *args: str, fault: str | None = None) -> WorkerProcess:
        n = len(started)
        command = ("tests.faults", fault) if fault else ("genq.worker", "worker")
        w = WorkerProcess(
            ["--redis-url", url, "--queue", queue, "--consumer", f"{prefix}{n}", *args],
            log_dir / f"worker{n}.log",
            command,
        )
        started.append(w)
        return w

    try:
        yield start
    finally:
        for w in started:
            w.stop()


@pytest.fixture()
def start_worker(redis_url: str, tmp_path: Path) -> Iterator[Callable[..., WorkerProcess]]:
    """Start ``genq worker`` processes: ``start_worker(queue, "--engine", "echo", ...)``.
    All are stopped (SIGTERM) at the end of the test."""
    with workers_on(redis_url, tmp_path) as start:
        yield start


@contextmanager
def worker_thread(
    redis_url: str, queue: str, engine: Engine, **settings: object
) -> Iterator[Worker]:
    """The real worker loop in a thread of this process, on ``engine`` (settings: more worker
    settings, as ``genq worker`` flags' names)."""
    from genq.worker.runtime.builder import build_worker

    base = {"redis_url": redis_url, "queue": queue, "consumer": "inproc", "engine": "echo"}
    worker = build_worker(WorkerSettings.build({**base, **settings}, env={}), engine)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        yield worker
    finally:
        worker.stop()
        thread.join(timeout=30)


def genq_stats(redis_url: str, queue: str) -> dict[str, Any]:
    """What ``genq stats --json`` prints for ``queue``, run as a user would run it."""
    where = ("--redis-url", redis_url, "--queue", queue)
    out = subprocess.run(
        [sys.executable, "-m", "genq.worker", "stats", "--json", *where],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    stats: dict[str, Any] = json.loads(out.stdout)
    return stats


def submit_keys(keys: Keys, request_ids: list[str]) -> list[str]:
    """The KEYS of an FCALL genq_submit for these ids (one Redis, not a cluster), in the order
    the functions section of docs/wire-format.md documents."""
    return [keys.config, *keys.streams(), *(keys.result(i) for i in request_ids)]


def cancel_keys(request_id: str) -> list[str]:
    """The KEYS of an FCALL genq_cancel."""
    return [Keys.result(request_id), Keys.events(request_id), Keys.attempts(request_id)]


def varied_prompts(n: int, seed: int = 7) -> list[str]:
    rng = random.Random(seed)
    words = [
        "the",
        "queue",
        "batches",
        "requests",
        "by",
        "length",
        "so",
        "padding",
        "stays",
        "small",
        "and",
        "fast",
    ]
    return [" ".join(rng.choices(words, k=rng.randint(1, 60))) for _ in range(n)]


def pending(r: redis.Redis, queue: str, consumer: str | None = None) -> int:
    """Entries pending in the queue's group (held by ``consumer`` if given)."""
    total = 0
    for stream in Keys(queue).streams():
        try:
            if consumer is None:
                total += int(r.xpending(stream, GROUP)["pending"])
            else:
                total += len(r.xpending_range(stream, GROUP, "-", "+", 1000, consumername=consumer))
        except redis.ResponseError:  # no group yet: nothing pending
            continue
    return total


REAL_MODEL_REQUESTS: list[dict[str, Any]] = [
    {
        "messages": [{"role": "user", "content": "Write one sentence about a cat."}],
        "max_new_tokens": 40,
    },
    {"prompt": "The capital of France is", "max_new_tokens": 6},
    {"messages": [{"role": "user", "content": "What is 12 times 12?"}], "max_new_tokens": 24},
    {"prompt": "Once upon a time, in a small village by the sea,", "max_new_tokens": 16},
    {
        "messages": [{"role": "user", "content": "Name three fruits that are red."}],
        "max_new_tokens": 10,
    },
    {"prompt": "Python is a programming language that", "max_new_tokens": 12},
]
"""Requests for the real model (test_real_model, test_vllm_engine): chats and completions ending
at different lengths."""


# The ACL users docs/security.md documents (tests/test_readme.py checks they are the same): one
# per role with least privilege, and one for every part at once.
_QUEUE_KEYS = "~genq:{* ~genq:res:* ~genq:ev:* ~genq:att:* ~genq:resp:* ~genq:batch:*"
GENQ_ACL_USERS = {
    "genq-producer": (
        f"on >genq-secret {_QUEUE_KEYS} resetchannels -@all +@connection "
        "+get +set +mget +del +exists +expire +hset +hget +hgetall +hincrby +hmget +hsetnx "
        "+eval +evalsha +fcall +time +multi +exec "
        "+xadd +xread +xreadgroup +xdel +xlen +xrange +xpending "
        "+xgroup|create +xinfo|groups +xinfo|consumers "
        "+rpush +llen +lindex +lrange +ltrim +sadd +srem +smembers +sismember +zadd +zscore "
        "+hlen +hkeys +hdel"
    ),
    "genq-worker": (
        f"on >genq-secret {_QUEUE_KEYS} resetchannels -@all +@connection "
        "+get +set +mget +del +exists +expire +hset +hget +hgetall +hdel +hincrby +hincrbyfloat "
        "+hkeys +hmget +hsetnx +eval +evalsha +fcall +function|load +time +multi +exec "
        "+xadd +xread +xreadgroup +xack +xdel +xlen +xrange +xpending +xclaim "
        "+xgroup|create +xinfo|groups +xinfo|consumers "
        "+rpush +lpush +lpop +llen +lindex +lrange +lrem +lset "
        "+sadd +srem +smembers +sismember +zadd +zscore +zincrby"
    ),
    "genq-gateway": (
        "on >genq-secret ~genq:* ~genq-secret:* resetchannels -@all +@connection "
        "+get +set +mget +del +exists +expire +hset +hget +hgetall +hdel +hincrby +hmget +hsetnx "
        "+eval +evalsha +fcall +time +info +multi +exec "
        "+xadd +xread +xreadgroup +xack +xdel +xlen +xrange +xpending +xclaim "
        "+xgroup|create +xinfo|groups +xinfo|consumers "
        "+rpush +llen +lindex +lrange +ltrim +sadd +srem +smembers +sismember "
        "+zadd +zrem +zcard +zrange +zscore +zrevrange +zrevrank +zremrangebyscore +hlen +hkeys"
    ),
    "genq": (
        "on >genq-secret ~genq:* ~genq-secret:* resetchannels -@all +@connection "
        "+get +set +mget +del +exists +expire +hset +hget +hgetall +hdel +hincrby +hincrbyfloat "
        "+hkeys +hmget +hsetnx +eval +evalsha "
        "+fcall +function|load +time +info +multi +exec "
        "+xadd +xread +xreadgroup +xack +xdel +xlen +xrange +xpending +xclaim "
        "+xgroup|create +xinfo|groups +xinfo|consumers "
        "+rpush +lpush +lpop +llen +lindex +lrange +lrem +lset +ltrim "
        "+sadd +srem +smembers +sismember "
        "+zadd +zrem +zcard +zrange +zscore +zincrby +zrevrange +zrevrank +zremrangebyscore"
    ),
}
GENQ_ACL = GENQ_ACL_USERS["genq"]
"""One user for every part of genq (the simplest set-up; every part may then read the webhook
secrets)."""


@pytest.fixture()
def openai_client(redis_url: str, queue: str, tmp_path: Path) -> Iterator[Any]:
    """The unmodified openai SDK on a ``genq serve`` of the test's queue (one API key)."""
    import openai
    from genq.worker.devtools.gateway_process import GatewayProcess

    key = "sk-genq-test"
    gateway = GatewayProcess(redis_url, queue, tmp_path / "gateway.log", ["--api-key", key])
    try:
        yield openai.OpenAI(base_url=gateway.url, api_key=key, max_retries=0, timeout=120)
    finally:
        gateway.stop()


@pytest.fixture()
def sdk_serving(
    openai_client: Any, queue: str, start_worker: Callable[..., WorkerProcess]
) -> Callable[[str], Any]:
    """``sdk_serving(model)``: the ``openai_client`` once a ``--engine continuous`` worker of
    ``model`` serves the test's queue (``echo``: an echo worker)."""

    def serving(model: str) -> Any:
        args = (
            ("--engine", "echo")
            if model == "echo"
            else ("--model", model, "--engine", "continuous")
        )
        start_worker(queue, *args)
        wait_until(lambda: [m.id for m in openai_client.models.list()] == [model], timeout_s=120)
        return openai_client

    return serving


def genq(
    *args: str, timeout_s: float = 60, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    """``genq ARGS`` as a user runs it (``stdin``: what it reads there)."""
    return subprocess.run(
        [sys.executable, "-m", "genq.worker", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        cwd=ROOT,
    )


def refused_at_start(redis_url: str, cases: dict[tuple[str, ...], str]) -> None:
    """Each ``genq worker`` of these arguments exits non-zero at start, a line of its stderr
    saying what it was told, and no traceback."""
    for args, says in cases.items():
        done = genq("worker", "--redis-url", redis_url, *args, timeout_s=120)
        assert done.returncode != 0, args
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        assert any(says in line for line in lines), (args, done.stderr)
        assert "Traceback" not in done.stderr, done.stderr
