"""Settings: environment parsing, validation naming every bad field, backoff."""

from __future__ import annotations

import pytest

from gpuplan_operator.core import errors, settings


def test_from_env_parses_types() -> None:
    s = settings.Settings.from_env({
        "GPUPLAN_ESTIMATOR_URL": "http://est:8080", "GPUPLAN_MODEL_URL_BLOCK_PRIVATE": "false",
        "GPUPLAN_MODEL_URL_ALLOWED_NETWORKS": "127.0.0.1/32, 10.0.0.0/8",
        "GPUPLAN_METRICS_PORT": "0", "GPUPLAN_ESTIMATOR_TIMEOUT_SECONDS": "2.5",
    }).validate()
    assert s.model_url_block_private is False
    assert s.model_url_allowed_networks == ("127.0.0.1/32", "10.0.0.0/8")
    assert s.metrics_port == 0 and s.estimator_timeout_seconds == 2.5


def test_unparseable_env_names_the_variable() -> None:
    with pytest.raises(errors.SettingsError, match="GPUPLAN_METRICS_PORT"):
        settings.Settings.from_env({"GPUPLAN_METRICS_PORT": "http"})


def test_validate_lists_every_problem() -> None:
    bad = settings.Settings(estimator_url="ftp://x", master_port=0, retry_base_delay_seconds=0,
                            model_url_allowed_networks=("nope",))
    with pytest.raises(errors.SettingsError) as info:
        bad.validate()
    for field in ("estimator_url", "master_port", "retry_base_delay_seconds",
                  "model_url_allowed_networks"):
        assert field in str(info.value)


def test_backoff_doubles_and_caps() -> None:
    s = settings.Settings(retry_base_delay_seconds=2, retry_max_delay_seconds=10)
    assert [s.retry_delay_seconds(i) for i in range(5)] == [2, 4, 8, 10, 10]
