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
