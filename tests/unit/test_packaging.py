"""Install paths (#20): the core install runs the user's commands; extras bring the rest.

pyproject.toml's extras and `core.extras.EXTRAS` (what the CLI names when a package is missing)
must agree; the core commands must run in a Python where every extra's modules are
unimportable (a `sitecustomize` on PYTHONPATH installs a `sys.meta_path` finder refusing them).
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import textwrap
import tomllib
from collections.abc import Iterable, Sequence
from pathlib import Path

import pytest

from gpuplan_estimator.core import extras
from gpuplan_estimator.core.exit_codes import ExitCode
from gpuplan_estimator.graph import examples

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
OPTIONAL = PYPROJECT["optional-dependencies"]
AGGREGATES = ("all", "dev")  # extras made of the others
# What a CLI user must not need (issue #20), whichever extra brings it.
HEAVY = ("kopf", "kubernetes", "pandas", "onnxruntime", "sqlalchemy", "aiohttp")
EVERY_EXTRA_MODULE = sorted({m for extra in extras.EXTRAS for m in extras.extra_modules(extra)})


def _name(requirement: str) -> str:
    """The canonical distribution name of a requirement ("psycopg[binary]>=3" -> psycopg)."""
    match = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement)
    assert match, requirement
    return re.sub(r"[-_.]+", "-", match.group(0)).lower()


def _self_extras(requirement: str) -> list[str]:
    """The extras of a `gpuplan[...]` self-reference; [] for any other requirement."""
    match = re.fullmatch(r"gpuplan\[([a-z, ]+)\]", requirement)
    return [e.strip() for e in match.group(1).split(",")] if match else []


def _resolved(extra: str) -> set[str]:
    """Every distribution `extra` installs, following `gpuplan[...]` self-references."""
    names: set[str] = set()
    for requirement in OPTIONAL[extra]:
        nested = _self_extras(requirement)
        names |= set().union(*(_resolved(e) for e in nested)) if nested else {_name(requirement)}
    return names


def _canonical(names: Iterable[str]) -> set[str]:
    return {re.sub(r"[-_.]+", "-", n).lower() for n in names}


# -- pyproject.toml and core/extras.py agree -----------------------------------------------


def test_extras_map_lists_exactly_the_extras_of_pyproject() -> None:
    assert set(extras.EXTRAS) == set(OPTIONAL) - set(AGGREGATES)


@pytest.mark.parametrize("extra", sorted(extras.EXTRAS))
def test_each_extra_installs_the_distributions_its_map_names(extra: str) -> None:
    assert _resolved(extra) == _canonical(extras.EXTRAS[extra])


def test_dev_and_all_cover_every_other_extra() -> None:
    every = set().union(*(_resolved(e) for e in OPTIONAL if e not in AGGREGATES))
    assert every <= _resolved("all")
    assert every <= _resolved("dev")
    assert {"pytest", "ruff", "mypy", "import-linter"} <= _resolved("dev")


def test_core_dependencies_leave_the_heavy_packages_to_extras() -> None:
    core = {_name(r) for r in PYPROJECT["dependencies"]}
    assert not core & _canonical(HEAVY)
    assert not core & set().union(*(_canonical(d) for d in extras.EXTRAS.values()))
    # What the CLI's core path imports at its top (cli/output's tables, http/wire's models).
    assert {"onnx", "numpy", "lightgbm", "scipy", "pyyaml", "zstandard", "pydantic",
            "rich"} <= core


@pytest.mark.parametrize("module", EVERY_EXTRA_MODULE)
def test_each_mapped_module_is_what_its_distribution_installs(module: str) -> None:
    # `make install` installs the dev extra, so every extra's module is importable here; a
    # wrong import name in the map (nvidia-ml-py installs pynvml) fails.
    assert importlib.util.find_spec(module) is not None


# -- the helper -------------------------------------------------------------------------------


def test_require_names_the_extra_of_a_missing_module(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pandas", None)  # import raises ModuleNotFoundError
    with pytest.raises(extras.MissingExtraError) as caught:
        extras.require("pandas", "bench", needed_by="gpuplan import")
    assert str(caught.value) == ("gpuplan import needs the 'pandas' package, which is not "
                                 "installed: pip install 'gpuplan[bench]'")
    assert isinstance(caught.value, ImportError)


def test_missing_keeps_an_import_error_of_a_module_no_extra_brings() -> None:
    error = ModuleNotFoundError("No module named 'gpuplan_estimator.nowhere'",
                                name="gpuplan_estimator.nowhere")
    assert extras.missing(error, "bench", needed_by="x") is error


def test_require_refuses_a_module_its_extra_does_not_bring() -> None:
    with pytest.raises(KeyError, match="not installed by the 'plot' extra"):
        extras.require("pandas", "plot", needed_by="x")


# -- the core commands without any extra -------------------------------------------------------

BLOCKER = '''
import sys

BLOCKED = frozenset({blocked!r})


class _Refuse:
    """Refuses the optional packages, as if only the core install were there."""

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {{name!r}} (blocked)", name=name)
        return None


sys.meta_path.insert(0, _Refuse())
'''


def _without(blocked: Iterable[str], tmp_path: Path) -> dict[str, str]:
    """An environment whose Python cannot import `blocked` (nor their submodules)."""
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(
        textwrap.dedent(BLOCKER.format(blocked=sorted(blocked))))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(site), env.get("PYTHONPATH")) if p)
    env["XDG_DATA_HOME"] = str(tmp_path / "data")  # no perf DB or bundle of the user's
    return env


def _gpuplan(args: Sequence[str], env: dict[str, str], cwd: Path
             ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpuplan_estimator.interfaces.cli", *args],
                          env=env, cwd=cwd, capture_output=True, text=True, timeout=120)


def test_the_blocker_blocks(tmp_path: Path) -> None:
    env = _without(EVERY_EXTRA_MODULE, tmp_path)
    probe = subprocess.run([sys.executable, "-c", "import pandas"], env=env,
                           capture_output=True, text=True, timeout=60)
    assert probe.returncode != 0
    assert "No module named 'pandas' (blocked)" in probe.stderr


MODEL = str(examples.light_resnet50_path())
CORE_COMMANDS = {
    "estimate": ["estimate", MODEL, "--device", "t4", "--batch", "8"],
    "strip": ["strip", MODEL, "light.onnx.zst", "--compress", "zstd"],
    "devices": ["devices"],
    "demo": ["demo"],
    "plan": ["plan", MODEL, "--batch", "256", "--dataset-size", "100000", "--pool", "t4=1x8"],
    "completion": ["completion", "bash"],  # the whole parser, stubs for the missing extras
    "help": ["--help"],
}


@pytest.mark.slow
@pytest.mark.parametrize("command", CORE_COMMANDS)
def test_core_commands_run_without_any_extra(command: str, tmp_path: Path) -> None:
    result = _gpuplan(CORE_COMMANDS[command], _without(EVERY_EXTRA_MODULE, tmp_path), tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip()


@pytest.mark.slow
@pytest.mark.parametrize(("args", "extra"), [
    (["bench", "--device", "cpu"], "bench"),
    (["import", "rows.csv"], "bench"),
    (["train"], "bench"),
    (["eval"], "bench"),
    (["serve"], "serve"),
    (["estimate", "--torch", "my_models:build", "--device", "t4"], "torch"),
])
def test_a_command_needing_a_missing_extra_names_it(args: list[str], extra: str,
                                                     tmp_path: Path) -> None:
    result = _gpuplan(args, _without(EVERY_EXTRA_MODULE, tmp_path), tmp_path)
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("gpuplan: error: ")
    assert last.endswith(f"pip install 'gpuplan[{extra}]'")


@pytest.mark.slow
def test_help_lists_the_commands_whose_extra_is_missing(tmp_path: Path) -> None:
    result = _gpuplan(["--help"], _without(EVERY_EXTRA_MODULE, tmp_path), tmp_path)
    assert result.returncode == 0, result.stderr
    assert re.search(r"bench\s+\(not installed: pip install 'gpuplan\[bench\]'\)", result.stdout)
    assert re.search(r"estimate\s+predict", result.stdout)


@pytest.mark.slow
@pytest.mark.parametrize(("script", "args"), [
    ("gpuplan-operator", []), ("gpuplan-extender", ["--port", "0"])])
def test_the_operator_programs_without_their_extra_name_it(script: str, args: list[str],
                                                            tmp_path: Path) -> None:
    program = Path(sys.executable).with_name(script)
    env = _without(extras.extra_modules("operator"), tmp_path)
    result = subprocess.run([str(program), *args], env=env, cwd=tmp_path, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == ExitCode.UNAVAILABLE, result.stderr
    assert result.stderr.strip() == (
        f"{script}: error: {script} needs the 'aiohttp' package, which is not installed: "
        "pip install 'gpuplan[operator]'")
    if script == "gpuplan-operator":  # its help needs none of the extra
        shown = subprocess.run([str(program), "--help"], env=env, capture_output=True,
                               text=True, timeout=120)
        assert shown.returncode == 0 and shown.stdout.startswith("usage: gpuplan-operator")


# What each extra is for: the modules its entry points import. With only that extra's packages
# importable (every other extra blocked), they must import.
EST = "gpuplan_estimator"
ENTRY_MODULES = {
    "bench": [f"{EST}.interfaces.cli.bench", f"{EST}.interfaces.cli.training",
              f"{EST}.interfaces.cli.evaluation", f"{EST}.perfdb.importing"],
    "serve": [f"{EST}.interfaces.cli.serving", f"{EST}.interfaces.http.service",
              f"{EST}.perfdb.store"],
    "operator": ["gpuplan_operator.__main__", "gpuplan_operator.handlers",
                 "gpuplan_operator.extender.cli", "gpuplan_operator.extender.watcher"],
}


@pytest.mark.slow
@pytest.mark.parametrize("extra", sorted(ENTRY_MODULES))
def test_an_extra_alone_brings_what_its_commands_import(extra: str, tmp_path: Path) -> None:
    env = _without(set(EVERY_EXTRA_MODULE) - extras.extra_modules(extra), tmp_path)
    code = "import importlib, sys\nfor m in sys.argv[1:]: importlib.import_module(m)"
    result = subprocess.run([sys.executable, "-c", code, *ENTRY_MODULES[extra]], env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
