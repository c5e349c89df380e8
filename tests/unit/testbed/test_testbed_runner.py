"""The runner's CLI and guards that need no binaries (the real start is in tests/integration)."""

from __future__ import annotations

import json
import pathlib

import gpuplan_testbed as runner
import pytest
from testbed_common import COMPONENTS, Layout, TestbedError


def test_up_without_binaries_says_how_to_build_them(tmp_path: pathlib.Path) -> None:
    settings = runner.Settings(state_dir=tmp_path / "state", bin_dir=tmp_path / "no-bin")
    with pytest.raises(TestbedError, match=r"binaries missing .*make testbed-build"):
        runner.up(settings)
    assert not (tmp_path / "state" / "pids").exists(), "nothing may start without binaries"


def test_status_of_an_empty_state_dir_is_all_down(tmp_path: pathlib.Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    assert runner.main(["status", "--json", "--state-dir", str(tmp_path)]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["state"] is None
    assert set(report["components"]) == set(COMPONENTS)
    assert not any(c["running"] for c in report["components"].values())


def test_down_with_nothing_running_is_harmless(tmp_path: pathlib.Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    assert runner.main(["down", "--state-dir", str(tmp_path)]) == 0
    assert "nothing was running" in capsys.readouterr().out


def test_corrupt_state_json_is_reported_with_its_path(tmp_path: pathlib.Path) -> None:
    layout = Layout(tmp_path)
    layout.state_json.write_text("{not json")
    with pytest.raises(TestbedError, match=r"state\.json: not JSON"):
        runner.load_state(layout)


def test_env_without_a_testbed_fails_clearly(tmp_path: pathlib.Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    assert runner.main(["env", "--state-dir", str(tmp_path)]) == 1
    assert "no testbed state" in capsys.readouterr().err
