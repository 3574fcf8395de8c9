"""Settings: flags, environment twins, defaults written once, unknown names raise."""

from __future__ import annotations

import pytest
from genq.common.errors import ConfigError
from genq.common.settings import WorkerSettings


def test_defaults_apply_when_nothing_is_given() -> None:
    s = WorkerSettings.build({}, env={})
    assert s.max_batch_tokens == WorkerSettings.model_fields["max_batch_tokens"].default


def test_environment_twin_sets_a_setting() -> None:
    s = WorkerSettings.build({}, env={"GENQ_MAX_BATCH_TOKENS": "999"})
    assert s.max_batch_tokens == 999


def test_flag_wins_over_environment() -> None:
    s = WorkerSettings.build({"max_batch_tokens": 5}, env={"GENQ_MAX_BATCH_TOKENS": "999"})
    assert s.max_batch_tokens == 5


def test_unknown_environment_variable_raises() -> None:
    with pytest.raises(ConfigError, match="GENQ_MAX_BATCH_TOKEN"):
        WorkerSettings.build({}, env={"GENQ_MAX_BATCH_TOKEN": "1"})


def test_unknown_setting_raises() -> None:
    with pytest.raises(ConfigError, match="unknown setting"):
        WorkerSettings.build({"max_batch_tokenz": 1}, env={})


def test_invalid_value_names_flag_and_variable() -> None:
    with pytest.raises(ConfigError, match="--max-batch-size / GENQ_MAX_BATCH_SIZE"):
        WorkerSettings.build({"max_batch_size": -1}, env={})


def test_bad_device_and_queue_are_refused() -> None:
    with pytest.raises(ConfigError, match="device"):
        WorkerSettings.build({"device": "gpu"}, env={})
    with pytest.raises(ConfigError, match="queue"):
        WorkerSettings.build({"queue": "a b"}, env={})


def test_genq_serve_flags_are_generated_from_the_gateway_settings() -> None:
    from click.testing import CliRunner
    from genq.producer.commands.serve import serve
    from genq.producer.gateway.settings import GatewaySettings, serve_flags

    shown = CliRunner().invoke(serve, ["--help"], terminal_width=200).output
    flags = serve_flags()
    assert {f.name for f in flags} == {
        "host",
        "port",
        "insecure_open",
        "api_keys",
        "admin_keys",
        "request_timeout_s",
        "max_in_flight",
        "max_in_flight_per_tenant",
        "redis_connections",
        "max_body_bytes",
        "tenant_max_files",
        "tenant_max_stored_bytes",
        "tenant_max_batches",
        "tenant_max_responses",
        "max_file_bytes",
        "files_dir",
        "batch_window",
        "files_timeout_s",
        "storage_max_redis_fraction",
        "webhook_url",
        "webhook_secret",
        "webhook_timeout_s",
        "webhook_first_retry_s",
        "webhook_retry_for_s",
    }
    for f in flags:
        assert f.flag in shown and f.env in shown, f
    # Parsed flags (as click hands them over) and the environment twins of repeated flags.
    given = {
        "redis_url": "redis://r:6379/0",
        "queue": "q",
        "host": "0.0.0.0",
        "port": 9000,
        "api_keys": (),
        "admin_keys": ("root",),
        "request_timeout_s": 5.0,
        "max_file_bytes": 10,
    }
    settings = GatewaySettings.from_flags(
        given, {"GENQ_API_KEYS": "k1=a,k2", "GENQ_ADMIN_KEYS": "x"}
    )
    assert settings.api_keys == ("k1=a", "k2") and settings.admin_keys == ("root",)
    assert (settings.host, settings.port, settings.max_file_bytes) == ("0.0.0.0", 9000, 10)
    assert "k1=a" not in repr(settings) and "root" not in repr(settings)  # keys: no repr


def test_a_worker_accepts_every_variable_of_genqs_other_parts_in_its_environment() -> None:
    """One environment for every genq pod (a ConfigMap, an EnvironmentFile, KEDA reading the
    worker's own container) is normal: a worker refused GENQ_ADMIN_KEYS, GENQ_SERVE_MAX_IN_FLIGHT
    and the deployment guide's GENQ_REDIS_ADDRESS as typos and did not start. Every variable
    another command reads (click's envvar), the gateway's twins, and those compose.yaml, its
    .env.example and the docs name is a worker setting or in OTHER_ENV_VARS."""
    import re
    from pathlib import Path

    import click
    from genq.common.settings import OTHER_ENV_VARS, check_env
    from genq.producer.gateway.settings import serve_flags
    from genq.worker.commands import main

    def envvars(command: click.Command) -> set[str]:
        found = {e for p in command.params for e in _names(p.envvar)}
        for sub in getattr(command, "commands", {}).values():
            found |= envvars(sub)
        return found

    named = envvars(main) | {f.env for f in serve_flags()}
    root = Path(__file__).resolve().parent.parent
    texts = [root / "compose.yaml", root / ".env.example", *sorted((root / "docs").glob("*.md"))]
    for path in texts:
        named |= set(re.findall(r"\bGENQ_[A-Z0-9_]*[A-Z0-9]\b", path.read_text()))
    codes = {"GENQ_INVALID", "GENQ_QUEUE_FULL", "GENQ_TENANT_FULL", "GENQ_PRIORITY_DENIED"}
    worker = {WorkerSettings.env_var(n) for n in WorkerSettings.model_fields}
    missing = sorted(v for v in named - codes - worker if v not in OTHER_ENV_VARS)
    assert missing == []
    check_env(dict.fromkeys(OTHER_ENV_VARS, "x"))  # none of them stops a worker
    with pytest.raises(ConfigError, match="GENQ_MAX_BATCH_TOKEN"):
        check_env({"GENQ_MAX_BATCH_TOKEN": "1"})  # a typo still does


def _names(envvar: str | list[str] | tuple[str, ...] | None) -> list[str]:
    if envvar is None:
        return []
    return [envvar] if isinstance(envvar, str) else list(envvar)


def test_auto_runs_vllm_on_a_gpu_where_it_is_installed_and_says_why() -> None:
    from genq.common.model_settings import auto_engine

    assert auto_engine("cuda:1", vllm=True)[0] == "vllm"
    assert auto_engine("cuda", vllm=True, lora=True)[0] == "vllm"  # vLLM runs adapters
    engine, why = auto_engine("cuda", vllm=False)
    assert engine == "static" and "no vllm installed" in why
    assert auto_engine("cuda", vllm=True, warm=True)[0] == "static"  # warm: transformers only
    assert auto_engine("cpu", vllm=True)[0] == "continuous"  # measured: BENCHMARKS.md
    assert auto_engine("cpu", vllm=True, lora=True)[0] == "static"
    auto = WorkerSettings.build({"queue": "q"}, env={})
    assert auto.engine == "continuous" and auto.engine_why.startswith("auto: a CPU")
    named = WorkerSettings.build({"queue": "q"}, env={"GENQ_ENGINE": "static"})
    assert named.engine_why == "named (--engine static)"
    assert named.model_copy(update={"model": "tiny"}).engine_why == named.engine_why
