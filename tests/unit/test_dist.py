"""`make dist` (#35): the wheel and sdist carry the shipped data; the wheel runs from a bare venv.

The install runs offline: pip (the dev venv's, `--python`) puts only the wheel into an empty venv
(`--no-deps --no-index`), and a `.pth` line lends it the dev venv's site-packages for the
dependencies (a plain path line: that directory's own `.pth` files, the checkout's editable
install among them, are not processed). So `gpuplan` there imports the wheel's code and data, not
the checkout's. CI's `make dist-check` does the same install from PyPI.
"""

from __future__ import annotations

import subprocess
import sys
import sysconfig
import tarfile
import tomllib
import zipfile
from pathlib import Path

import pytest

import build_dist


@pytest.fixture(scope="module")
def archives(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return build_dist.build(tmp_path_factory.mktemp("dist"))


def test_both_archives_carry_the_catalog_and_the_bundle(archives: tuple[Path, Path]) -> None:
    wheel, sdist = archives
    version = tomllib.loads((build_dist.REPO / "pyproject.toml").read_text())["project"]["version"]
    assert wheel.name == f"gpuplan-{version}-py3-none-any.whl"  # the README's install line
    assert build_dist.missing_data(wheel, sdist) == []
    shipped = build_dist.shipped_data()
    assert "gpuplan_estimator/data/gpus.yaml" in shipped
    assert "gpuplan_estimator/data/bundle/manifest.json" in shipped
    assert len(shipped) > 50  # the bundle's boosters, not just a manifest


def test_a_missing_data_file_is_reported(archives: tuple[Path, Path], tmp_path: Path) -> None:
    wheel, sdist = archives
    cut = tmp_path / wheel.name
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(cut, "w") as dst:
        for item in src.infolist():
            if not item.filename.endswith("data/gpus.yaml"):
                dst.writestr(item, src.read(item))
    assert build_dist.missing_data(cut, sdist) == [
        f"{wheel.name}: gpuplan_estimator/data/gpus.yaml"]
    with tarfile.open(sdist) as t:
        assert any(n.endswith("/estimator/gpuplan_estimator/data/gpus.yaml")
                   for n in t.getnames())


@pytest.mark.slow
def test_the_wheel_installed_in_an_empty_venv_runs_demo(archives: tuple[Path, Path],
                                                       tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=120)
    python = venv / "bin" / "python"
    build_dist.install(archives[0], [sys.executable, "-m", "pip", "--python", str(python)],
                       ["--no-deps", "--no-index"])
    site = subprocess.run([str(python), "-c", "import sysconfig;print(sysconfig.get_path("
                           "'purelib'))"], check=True, capture_output=True, text=True).stdout
    (Path(site.strip()) / "dev-deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    where = subprocess.run([str(python), "-c", "import gpuplan_estimator as g;print(g.__file__)"],
                           check=True, capture_output=True, text=True, cwd=tmp_path,
                           env={"PATH": "/usr/bin:/bin"}).stdout
    assert where.startswith(str(venv)), where  # the wheel's code, not the checkout's
    build_dist.smoke(venv / "bin" / "gpuplan")
