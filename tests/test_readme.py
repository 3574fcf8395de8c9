"""The documentation's promises (the README and the pages of the site in ``docs/``): its
redis-cli example runs, its tables match the code, and the README opens with its two
commands."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import redis
from genq.common.keys import DEFAULT_MODEL_FIELD, Keys
from genq.common.settings import WorkerSettings
from genq.worker.devtools.redis_server import RedisServer

from tests.conftest import SLOWEST_FILES, WorkerProcess

ROOT = Path(__file__).resolve().parent.parent
OPENING = (ROOT / "README.md").read_text()
README = "\n".join([OPENING, *(page.read_text() for page in sorted((ROOT / "docs").glob("*.md")))])
"""The README and every page of the documentation site (the guides moved there from it)."""


def test_readme_redis_cli_example_runs_against_a_worker(
    redis_server: RedisServer, start_worker: Callable[..., WorkerProcess]
) -> None:
    block = re.search(
        r"<!-- redis-cli-example.*?-->\s*```bash\n(.*?)```\s*<!-- /redis-cli-example -->",
        README,
        re.S,
    )
    assert block is not None
    # The README's queue is "default", which other tests of this session's Redis use too: its
    # default model is whichever worker of theirs started first, unless no such worker lives.
    redis.Redis(port=redis_server.port).hdel(Keys("default").config, DEFAULT_MODEL_FIELD)
    start_worker("default", "--model", "tiny")
    script = f'redis-cli() {{ command redis-cli -p {redis_server.port} "$@"; }}\n{block.group(1)}'
    out = subprocess.run(["bash", "-e", "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["id"] == "r1" and result["status"] == "succeeded"
    assert result["usage"]["completion_tokens"] <= 8


def test_readme_redis_functions_example_runs(redis_server: RedisServer) -> None:
    block = re.search(
        r"<!-- redis-functions-example.*?-->\s*```bash\n(.*?)```"
        r"\s*<!-- /redis-functions-example -->",
        README,
        re.S,
    )
    assert block is not None
    script = (
        f'redis-cli() {{ command redis-cli -p {redis_server.port} "$@"; }}\n'
        f'genq() {{ "{sys.executable}" -m genq.worker "$@"; }}\n{block.group(1)}'
    )
    out = subprocess.run(["bash", "-e", "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert lines[0] == "genq"  # FUNCTION LOAD answers the library's name
    assert re.fullmatch(r"\d+-\d+", lines[1])  # the new entry's id
    queued = json.loads(lines[2])
    assert queued.pop("entry") == f"high/{lines[1]}"  # the entry that owns the id
    assert queued == {
        "id": "r2",
        "status": "queued",
        "priority": "high",
        "tenant": "team-a",
        "metadata": {},
    }
    assert lines[3] == "1"  # cancelled


def test_every_setting_is_in_the_readme_configuration_table() -> None:
    for name in WorkerSettings.model_fields:
        flag = "--" + name.replace("_", "-")
        assert f"`{flag}` | `{WorkerSettings.env_var(name)}`" in README, flag


def test_readme_opens_with_the_two_commands() -> None:
    blocks = re.findall(r"```bash\n(.*?)```", OPENING, re.S)
    assert blocks[0].strip() == "bash scripts/setup.sh && .venv/bin/genq demo"
    assert blocks[1].strip() == "bash scripts/setup.sh && .venv/bin/python -m pytest -q -n 2"


def test_the_files_scheduled_first_exist() -> None:
    # The README's -n 2 run starts the slowest files first (conftest: SLOWEST_FILES); a name
    # left behind by a rename would silently put its file back in the alphabet.
    assert all((ROOT / "tests" / name).is_file() for name in SLOWEST_FILES)


@pytest.mark.skipif(shutil.which("docker-compose") is None, reason="docker-compose not installed")
def test_compose_file_is_valid(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parent.parent
    compose = ["docker-compose", "-f", str(root / "compose.yaml")]
    example = ["--env-file", str(root / ".env.example")]
    out = subprocess.run(
        [*compose, *example, "config"], capture_output=True, text=True, timeout=60, cwd=root
    )
    assert out.returncode == 0, out.stderr
    assert "appendonly" in out.stdout and "service_healthy" in out.stdout
    # Safe by default: Redis asks for the password and is not published; the gateway is
    # published on loopback only; without the secrets the file refuses to run.
    assert "--requirepass" in out.stdout and "6379:6379" not in out.stdout
    assert "host_ip: 127.0.0.1" in out.stdout or "127.0.0.1:8000:8000" in out.stdout
    empty = tmp_path / "empty.env"
    empty.write_text("")
    bare = subprocess.run(
        [*compose, "--env-file", str(empty), "config"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=root,
        env={k: v for k, v in os.environ.items() if not k.startswith("GENQ_")},
    )
    assert bare.returncode != 0 and "GENQ_REDIS_PASSWORD" in bare.stderr + bare.stdout


def test_the_documented_acl_users_are_the_tested_ones() -> None:
    from tests.conftest import GENQ_ACL_USERS

    block = re.search(r"<!-- acl-lines.*?-->\s*```\n(.*?)\n\s*```", README, re.S)
    assert block is not None
    documented = {}
    for line in block.group(1).strip().splitlines():
        words = line.split()
        assert words[:2] == ["ACL", "SETUSER"], line
        documented[words[2]] = words[3:]
    tested = {
        name: acl.replace(">genq-secret", ">PASSWORD").split()
        for name, acl in GENQ_ACL_USERS.items()
    }
    assert documented == tested


def test_every_key_in_the_key_module_is_in_the_readme_table() -> None:
    import inspect
    from functools import cached_property

    from genq.common.keys import Keys

    k = Keys("Q")
    # The README's placeholder for each argument a key method takes.
    placeholder = {
        "request_id": "ID",
        "consumer": "C",
        "batch_id": "B",
        "file_id": "F",
        "tenant": "T",
        "priority": "P",
        "bucket": "N",
        "reader": "R",
        "kind": "K",
    }
    found = [*k.streams()]
    lane_methods = {"lane", "lanes", "lane_of", "doorbells", "lane_config"}
    for name, member in inspect.getmembers(Keys):
        if name.startswith("_") or name in {"stream", "streams", "priority_of", *lane_methods}:
            continue
        if isinstance(member, (property, cached_property)):
            found.append(getattr(k, name))
        elif callable(member):
            args = inspect.signature(getattr(k, name)).parameters
            key = getattr(k, name)(*(placeholder[a] for a in args))
            found += key if isinstance(key, tuple) else [key]  # request_keys: four at once
    assert len(found) >= 14
    for key in found:
        assert f"`{key}`" in README, key
    lane = k.lane("M")  # a model's lane: its work keys, listed as suffixes of its base
    base = "genq:{Q}:m<M>"
    assert lane.stream("high") == f"{base}:high" and lane.lane_config == f"{base}:config"
    assert lane.waiting == f"{base}:waiting" and lane.doorbell == f"{base}:doorbell"
    assert lane.tenant_index("P", "T") == f"{base}:idx:P:T"  # type: ignore[arg-type]
    assert lane.active("P") == f"{base}:active:P"  # type: ignore[arg-type]
    assert lane.vtc == k.vtc and lane.tenants == k.tenants and lane.config == k.config
    for suffix in ("high`", ":normal`", ":low`", ":doorbell`", ":config`", ":idx:P:T`"):
        assert suffix in README
    assert f"`{base}:high`" in README


@pytest.mark.skipif(
    importlib.util.find_spec("mkdocs") is None, reason="mkdocs is not installed (the docs extra)"
)
def test_the_documentation_site_builds_strictly(tmp_path: Path) -> None:
    """``mkdocs build --strict``: a page missing from the navigation, a link to a page that is
    not there, or a reference page whose code cannot be read fails it."""
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    cli = (tmp_path / "site" / "cli" / "index.html").read_text()
    assert "--max-batch-tokens" in cli and "GENQ_MAX_BATCH_TOKENS" in cli  # from click itself
    api = (tmp_path / "site" / "python-api" / "index.html").read_text()
    assert "submit_many" in api  # from the docstrings


def test_the_readme_links_to_pages_that_exist() -> None:
    for target in re.findall(r"\]\((docs/[^)#]+|[A-Z]+\.md)", OPENING):
        assert (ROOT / target).exists(), target


def test_a_requests_four_keys_at_once_are_its_four_keys() -> None:
    """``Keys.request_keys`` (a write's four keys in one call) spells each key as its own
    method does: the names live twice in keys.py, and this keeps them equal."""
    from genq.common.keys import Keys

    request_id = "abc-1"
    assert Keys.request_keys(request_id) == (
        Keys.result(request_id),
        Keys.events(request_id),
        Keys.attempts(request_id),
        Keys.response(request_id),
    )
