"""The chart's alert rules, checked and unit-tested by the real promtool."""

import os
import pathlib
import shutil
import subprocess

import pytest

CHART = pathlib.Path(__file__).resolve().parents[3] / "charts" / "gpuplan"


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        if os.environ.get("CI") == "true":
            pytest.fail("promtool missing: .ci/run installs Debian's prometheus package")
        pytest.skip("promtool not installed (apt-get install prometheus)")
    return path


def test_rules_are_valid() -> None:
    out = subprocess.run([promtool(), "check", "rules", str(CHART / "files" / "alerts.yaml")],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


def test_rules_fire_as_specified() -> None:
    out = subprocess.run([promtool(), "test", "rules", "tests/alerts_test.yaml"], cwd=CHART,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout
