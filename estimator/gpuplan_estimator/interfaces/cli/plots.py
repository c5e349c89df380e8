"""`--plot FILE` of `estimate` and `plan`: the documents they print, drawn (`plotting`)."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any


def check(path: str | None) -> None:
    """Before any work: a --plot FILE with an extension we cannot write, or without the
    plotting extra installed, fails now rather than after a long estimate."""
    if path is None:
        return
    from gpuplan_estimator.interfaces.cli import plotting

    plotting.check_target(path)
    plotting.check_available()


def write_estimate(doc: Mapping[str, Any], path: str) -> None:
    """Draw an estimate document (step split and memory per device) to `path`."""
    from gpuplan_estimator.interfaces.cli import plotting

    plotting.save(plotting.estimate_figure(doc), path)
    print(f"gpuplan: wrote {path}", file=sys.stderr)


def write_plan(doc: Mapping[str, Any], path: str) -> None:
    """Draw a plan document (cost against time, Pareto front, the choice) to `path`."""
    from gpuplan_estimator.interfaces.cli import plotting

    plotting.save(plotting.plan_figure(doc), path)
    print(f"gpuplan: wrote {path}", file=sys.stderr)
