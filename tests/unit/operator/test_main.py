"""`gpuplan-operator` builds a `kopf run` command line with the handlers module by file path."""

from __future__ import annotations

import pathlib

from gpuplan_operator import __main__ as entry


def test_defaults_to_all_namespaces_and_file_path() -> None:
    argv = entry.kopf_argv(["--standalone"])
    assert argv[:3] == ["run", "--all-namespaces", "--standalone"]
    assert pathlib.Path(argv[-1]).name == "handlers.py" and pathlib.Path(argv[-1]).is_file()


def test_explicit_namespace_is_kept() -> None:
    assert entry.kopf_argv(["-n", "team-a"])[:3] == ["run", "-n", "team-a"]
