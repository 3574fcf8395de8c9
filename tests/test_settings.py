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
        WorkerSettings.build({"max_batch_size": 0}, env={})


def test_bad_device_and_queue_are_refused() -> None:
    with pytest.raises(ConfigError, match="device"):
        WorkerSettings.build({"device": "gpu"}, env={})
    with pytest.raises(ConfigError, match="queue"):
        WorkerSettings.build({"queue": "a b"}, env={})
