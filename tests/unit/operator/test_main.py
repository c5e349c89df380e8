"""`gpuplan-operator`: its own command line, turned into a `kopf run` one kopf itself accepts."""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
import subprocess
import sys
from collections.abc import Iterator, Mapping
from typing import Any

import pytest
from kopf import cli as kopf_cli

from gpuplan_operator import __main__ as entry
from gpuplan_operator.core import settings

SCRIPT = pathlib.Path(sys.executable).with_name("gpuplan-operator")


def test_defaults_to_all_namespaces_and_file_path() -> None:
    argv = entry.kopf_argv(["--standalone"])
    assert argv[:3] == ["run", "--all-namespaces", "--standalone"]
    assert pathlib.Path(argv[-1]).name == "handlers.py" and pathlib.Path(argv[-1]).is_file()


def test_explicit_namespace_is_kept() -> None:
    assert entry.kopf_argv(["-n", "team-a"])[:3] == ["run", "-n", "team-a"]


def kopf_params(argv: list[str]) -> dict[str, Any]:
    """What kopf's own `run` command parses from the command line ours builds (not run)."""
    options = entry.kopf_options(entry.build_parser().parse_args(argv))
    run_argv = entry.kopf_argv(options)
    assert run_argv[0] == "run"
    context = kopf_cli.run.make_context("run", run_argv[1:])
    return dict(context.params)


def test_no_options_watch_every_namespace() -> None:
    params = kopf_params([])
    assert params["clusterwide"] is True and params["namespaces"] == ()
    assert params["paths"] == (str(entry.HANDLERS),)


def test_our_options_reach_kopf() -> None:
    params = kopf_params(["-n", "team-a", "--namespace", "team-*", "--standalone",
                          "-L", "http://0.0.0.0:8080/healthz", "-d", "--log-format", "json",
                          "-P", "gpuplan", "-p", "5"])
    assert params["namespaces"] == ("team-a", "team-*") and params["clusterwide"] is False
    assert params["standalone"] is True and params["debug"] is True
    assert params["liveness_endpoint"] == "http://0.0.0.0:8080/healthz"
    assert params["log_format"].name == "JSON"
    assert (params["peering_name"], params["priority"]) == ("gpuplan", 5)


def test_explicit_all_namespaces_is_passed_once() -> None:
    options = entry.kopf_options(entry.build_parser().parse_args(["-A", "-v"]))
    assert entry.kopf_argv(options).count("--all-namespaces") == 1
    assert kopf_params(["-A", "-v"])["verbose"] is True


@pytest.mark.parametrize("argv", [["--bogus"], ["-n", "a", "-A"], ["-v", "-q"],
                                  ["--log-format", "xml"], ["-p", "high"], ["handlers.py"]])
def test_unknown_or_conflicting_options_are_usage_errors(
        argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stop:
        entry.main(argv)
    assert stop.value.code == 2
    assert "usage: gpuplan-operator" in capsys.readouterr().err


class RecordingEnv(Mapping[str, str]):
    """An empty environment that remembers every name it was asked for."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def __getitem__(self, key: str) -> str:
        self.asked.append(key)
        raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0


def test_the_epilog_names_every_variable_settings_reads() -> None:
    env = RecordingEnv()
    settings.Settings.from_env(env)
    epilog = entry.environment_epilog()
    assert len(env.asked) == len(dataclasses.fields(settings.Settings)) > 10
    assert [name for name in env.asked if f"  {name} (default" not in epilog] == []
    assert "GPUPLAN_ESTIMATOR_URL (default unset)" in epilog
    assert "GPUPLAN_METRICS_PORT (default 9090)" in epilog
    assert "GPUPLAN_BENCHMARKS_ENABLED (default false)" in epilog


def test_every_setting_has_a_docstring_for_the_help() -> None:
    docs = entry.setting_docs()
    fields = [f.name for f in dataclasses.fields(settings.Settings)]
    assert [name for name in fields if not docs.get(name)] == []
    assert docs["master_port"] == "torchrun rendezvous port for multi-node jobs."


def test_setting_docs_reads_the_string_under_each_field() -> None:
    @dataclasses.dataclass
    class Example:
        documented: int = 1
        """Says what it is."""
        bare: str = ""

    assert entry.setting_docs(Example) == {"documented": "Says what it is."}


def options_without_help(parser: argparse.ArgumentParser) -> list[str]:
    """Options of `parser` other than -h with no help text."""
    return ["/".join(a.option_strings) for a in parser._actions
            if not isinstance(a, argparse._HelpAction) and not (a.help or "").strip()]


def test_installed_script_help() -> None:
    assert SCRIPT.is_file(), f"{SCRIPT} missing: pip install -e . into this venv"
    done = subprocess.run([str(SCRIPT), "--help"], capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: gpuplan-operator ")
    parser = entry.build_parser()
    assert options_without_help(parser) == []
    for option in (o for a in parser._actions for o in a.option_strings):
        assert option in done.stdout
    assert "GPUPLAN_ESTIMATOR_URL" in done.stdout and "KUBECONFIG" in done.stdout


def test_installed_script_version_and_usage_error() -> None:
    from importlib import metadata

    version = subprocess.run([str(SCRIPT), "--version"], capture_output=True, text=True,
                             timeout=60, check=False)
    assert (version.returncode, version.stdout.strip()) == (
        0, f"gpuplan-operator {metadata.version('gpuplan')}")
    bad = subprocess.run([str(SCRIPT), "--namespaces", "x"], capture_output=True, text=True,
                         timeout=60, check=False)
    assert bad.returncode == 2
    assert "gpuplan-operator: error: unrecognized arguments: --namespaces" in bad.stderr


def test_gpuplan_namespaces_scopes_the_watch_without_flags() -> None:
    """The chart's operator.namespaces arrives as GPUPLAN_NAMESPACES (issue #16)."""
    args = entry.build_parser().parse_args([])
    options = entry.kopf_options(args, {"GPUPLAN_NAMESPACES": "team-a, team-b,"})
    assert options == ["--namespace=team-a", "--namespace=team-b"]
    assert entry.kopf_options(args, {"GPUPLAN_NAMESPACES": ""}) == []
    explicit = entry.build_parser().parse_args(["-n", "x"])
    assert entry.kopf_options(explicit, {"GPUPLAN_NAMESPACES": "y"}) == ["--namespace=x"]
    everything = entry.build_parser().parse_args(["-A"])
    assert "--namespace=y" not in entry.kopf_options(everything, {"GPUPLAN_NAMESPACES": "y"})
