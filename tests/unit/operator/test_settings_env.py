"""`Settings.from_env` refuses GPUPLAN_* names it does not know (#16): the chart once set
GPUPLAN_MODEL_URL_MAX_BYTES and GPUPLAN_ALLOW_PRIVATE_URLS, which were silently ignored."""

from __future__ import annotations

import pytest

from gpuplan_operator.core import errors, settings

BASE = {"GPUPLAN_ESTIMATOR_URL": "http://e:8080"}


@pytest.mark.parametrize("name", ["GPUPLAN_MODEL_URL_MAX_BYTES", "GPUPLAN_ALLOW_PRIVATE_URLS",
                                  "GPUPLAN_MODEL_URL_TIMEOUT_SECONDS", "GPUPLAN_METRIC_PORT"])
def test_an_unknown_variable_is_refused_by_name(name: str) -> None:
    with pytest.raises(errors.SettingsError, match=name) as caught:
        settings.Settings.from_env({**BASE, name: "1"})
    assert "GPUPLAN_MODEL_MAX_BYTES" in str(caught.value)  # the message lists the known names


def test_every_field_has_a_variable_and_they_are_read() -> None:
    env = {**BASE, "GPUPLAN_MODEL_MAX_BYTES": "1000", "GPUPLAN_MODEL_URL_BLOCK_PRIVATE": "false",
           "GPUPLAN_MODEL_URL_ALLOWED_NETWORKS": "10.0.0.0/8, 192.168.0.0/16"}
    assert set(env) <= settings.variable_names()
    cfg = settings.Settings.from_env(env).validate()
    assert (cfg.model_max_bytes, cfg.model_url_block_private) == (1000, False)
    assert cfg.model_url_allowed_networks == ("10.0.0.0/8", "192.168.0.0/16")


@pytest.mark.parametrize("name", ["GPUPLAN_NAMESPACES", "GPUPLAN_DB_URL", "GPUPLAN_TESTBED_STATE",
                                  "GPUPLAN_SHARED_DATA", "OTHER_VARIABLE", "gpuplan_lower"])
def test_names_other_readers_own_pass(name: str) -> None:
    assert settings.Settings.from_env({**BASE, name: "x"}).estimator_url == "http://e:8080"
