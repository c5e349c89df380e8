#!/usr/bin/env python3
"""Build gpuplan's wheel and sdist (`make dist`) and check the shipped data is inside both.

Calls setuptools' PEP 517 hooks in this Python (no `build` package, no network): the build
requirements of pyproject.toml (setuptools, wheel) are the dev venv's own. Then opens each
archive and refuses it when a file the installed CLI reads at run time is missing: the GPU
catalog, the default model bundle (its manifest and every booster file of the checkout), the CPU
measurements and the model configs. `--install-check VENV_PYTHON` then installs the wheel into
that (empty) venv and runs `gpuplan --version` and `gpuplan demo` from it (CI's `make
dist-check`; tests/unit/test_dist.py does the same offline).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "estimator" / "gpuplan_estimator" / "data"
# Build scratch setuptools leaves in the source tree (both are in .gitignore).
SCRATCH = ("build", "gpuplan.egg-info", "estimator/gpuplan.egg-info")


def shipped_data() -> list[str]:
    """Every file under the package's data dir, as a path inside the package."""
    return sorted(f"gpuplan_estimator/data/{p.relative_to(DATA).as_posix()}"
                  for p in DATA.rglob("*") if p.is_file() and "__pycache__" not in p.parts)


def build(out: Path) -> tuple[Path, Path]:
    """The wheel and sdist of the checkout, written into `out`."""
    from setuptools import build_meta  # the build backend pyproject.toml names

    out.mkdir(parents=True, exist_ok=True)
    here = Path.cwd()
    made = [REPO / name for name in SCRATCH if not (REPO / name).exists()]
    log = io.StringIO()  # setuptools lists every file it copies; shown only on failure
    try:
        os.chdir(REPO)
        with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
            wheel = out / build_meta.build_wheel(str(out))
            sdist = out / build_meta.build_sdist(str(out))
    except BaseException:
        sys.stderr.write(log.getvalue())
        raise
    finally:
        os.chdir(here)
        for path in made:  # only what this build created
            shutil.rmtree(path, ignore_errors=True)
    return wheel, sdist


def missing_data(wheel: Path, sdist: Path) -> list[str]:
    """The shipped data files absent from either archive, as '<archive>: <path>' lines."""
    with zipfile.ZipFile(wheel) as z:
        in_wheel = set(z.namelist())
    with tarfile.open(sdist) as t:
        # sdist members are '<name>-<version>/estimator/gpuplan_estimator/...'
        in_sdist = {n.split("/", 1)[1].removeprefix("estimator/") for n in t.getnames()
                    if "/" in n}
    wanted = shipped_data()
    return ([f"{wheel.name}: {p}" for p in wanted if p not in in_wheel]
            + [f"{sdist.name}: {p}" for p in wanted if p not in in_sdist])


def install(wheel: Path, pip: Sequence[str], options: Sequence[str] = ()) -> None:
    """Install `wheel` with the `pip` command line (its target venv's, or `pip --python`)."""
    subprocess.run([*pip, "install", "-q", *options, str(wheel)], check=True, timeout=1800)


def smoke(gpuplan: Path) -> None:
    """Run an installed `gpuplan --version` and `gpuplan demo` away from the checkout."""
    with tempfile.TemporaryDirectory() as cwd:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        for args in (["--version"], ["demo"]):
            subprocess.run([str(gpuplan), *args], check=True, cwd=cwd, env=env, timeout=300)


def main(argv: Sequence[str] | None = None) -> int:
    """Build, check the archives' data, optionally install-check; 1 when data is missing."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "dist")
    parser.add_argument("--install-check", metavar="VENV_PYTHON",
                        help="install the wheel with this Python's pip and run its gpuplan")
    args = parser.parse_args(argv)
    wheel, sdist = build(args.out.resolve())
    missing = missing_data(wheel, sdist)
    if missing:
        print("missing from the archives:\n  " + "\n  ".join(missing), file=sys.stderr)
        return 1
    print(f"{wheel}\n{sdist}")
    if args.install_check:
        install(wheel, [args.install_check, "-m", "pip"])
        smoke(Path(args.install_check).with_name("gpuplan"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
