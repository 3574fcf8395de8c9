"""``genq worker --gpus``: one supervised worker per GPU. The supervision is the same with any
engine, so it is tested here on CPU with ``--engine echo`` (which takes explicit indices without
CUDA); the clear refusal on a machine without a GPU is tested with the model engines."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import redis
from genq.common.keys import Keys
from genq.producer import Client

from tests.conftest import ROOT, WorkerProcess, wait_until


def worker_pid(r: redis.Redis, queue: str, consumer: str) -> int | None:
    pid = r.hget(Keys(queue).worker(consumer), "pid")
    return int(pid) if pid else None


def test_launcher_supervises_one_worker_per_gpu_restarts_the_dead_and_drains_on_sigterm(
    redis_url: str, queue: str, r: redis.Redis, tmp_path: Path
) -> None:
    launcher = WorkerProcess(
        [
            "--redis-url",
            redis_url,
            "--queue",
            queue,
            "--consumer",
            "box",
            "--gpus",
            "0,1",
            "--engine",
            "echo",
            "--echo-step-ms",
            "5",
            "--max-batch-size",
            "4",
            "--max-lookahead",
            "4",
        ],
        tmp_path / "launcher.log",
    )
    try:
        wait_until(lambda: worker_pid(r, queue, "box-gpu0") and worker_pid(r, queue, "box-gpu1"))
        client = Client.from_url(redis_url, queue)
        ids = client.submit_many([f"p{i}" for i in range(60)], max_new_tokens=4)
        results = client.results(ids, timeout=60)
        assert {x.status for x in results} == {"succeeded"}
        assert {x.worker for x in results} == {"box-gpu0", "box-gpu1"}, "both children served"

        first_pid = worker_pid(r, queue, "box-gpu0")
        assert first_pid is not None
        os.kill(first_pid, signal.SIGKILL)
        wait_until(lambda: worker_pid(r, queue, "box-gpu0") not in (None, first_pid), timeout_s=30)
        assert launcher.proc.poll() is None, "the launcher outlives a dead child"
        ids = client.submit_many([f"q{i}" for i in range(40)], max_new_tokens=4)
        assert {x.status for x in client.results(ids, timeout=60)} == {"succeeded"}

        pids = [worker_pid(r, queue, f"box-gpu{g}") for g in (0, 1)]
        assert launcher.stop(timeout_s=60) == 0
        log = launcher.log()
        assert "restarting" in log and "restarts=1" in log, log
        for pid in pids:  # the children drained and exited with it
            assert pid is not None and not Path(f"/proc/{pid}").exists()
    finally:
        launcher.stop()


def test_gpus_all_without_a_gpu_says_so_clearly(redis_url: str, queue: str) -> None:
    for spec in ("all", "0"):
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "genq.worker",
                "worker",
                "--redis-url",
                redis_url,
                "--queue",
                queue,
                "--gpus",
                spec,
            ],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=120,
        )
        assert done.returncode != 0
        assert "no CUDA GPU is visible" in done.stderr or "0 visible CUDA GPU" in done.stderr, (
            done.stderr
        )
        assert "without --gpus" in done.stderr


def test_bad_gpu_lists_get_a_clear_error() -> None:
    from genq.common.errors import ConfigError
    from genq.worker.runtime.launcher import parse_gpus, visible_gpus

    assert parse_gpus("0, 1,3", needs_cuda=False) == [0, 1, 3]
    for spec in ("a,b", "0,0", "-1", ",", ""):
        with pytest.raises(ConfigError, match="give 'all' or"):
            parse_gpus(spec, needs_cuda=False)
    with pytest.raises(ConfigError, match="visible CUDA GPU"):
        parse_gpus(str(visible_gpus()), needs_cuda=True)  # one index past the last GPU


def test_genq_gpus_in_the_environment_starts_one_launcher_not_a_chain(
    redis_url: str, queue: str, r: redis.Redis, tmp_path: Path
) -> None:
    """Compose files and Kubernetes set GENQ_GPUS: the children it starts must be workers, not
    launchers that start launchers."""
    import psutil

    env = {**os.environ, "GENQ_GPUS": "0", "GENQ_REDIS_URL": redis_url, "GENQ_QUEUE": queue}
    log = (tmp_path / "launcher.log").open("wb")
    launcher = subprocess.Popen(
        [sys.executable, "-m", "genq.worker", "worker", "--engine", "echo", "--consumer", "env"],
        env=env,
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_until(lambda: worker_pid(r, queue, "env-gpu0"), timeout_s=60)
        client = Client.from_url(redis_url, queue)
        assert client.generate("hello", max_new_tokens=2, timeout=30).status == "succeeded"
        family = psutil.Process(launcher.pid).children(recursive=True)
        assert [p.pid for p in family] == [worker_pid(r, queue, "env-gpu0")]
        assert "GENQ_GPUS" not in family[0].environ()
    finally:
        launcher.send_signal(signal.SIGTERM)
        assert launcher.wait(timeout=60) == 0
        log.close()
