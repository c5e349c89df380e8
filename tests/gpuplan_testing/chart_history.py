"""The chart as it was at its previous version, from git history (for the upgrade test)."""

from __future__ import annotations

import io
import pathlib
import subprocess
import tarfile
from dataclasses import dataclass

import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
CHART_PATH = "charts/gpuplan"
GIT_TIMEOUT_S = 60


@dataclass(frozen=True)
class PreviousChart:
    """The chart's last state before its current version: where it was unpacked, from what."""

    version: str
    commit: str
    path: pathlib.Path


def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True,
                          check=True, timeout=GIT_TIMEOUT_S).stdout


def chart_version(ref: str) -> str:
    """Chart.yaml's `version` at `ref` (a commit, or "" for the working tree)."""
    text = ((ROOT / CHART_PATH / "Chart.yaml").read_text() if not ref
            else _git("show", f"{ref}:{CHART_PATH}/Chart.yaml"))
    return str(yaml.safe_load(text)["version"])


def previous_commit() -> str:
    """The newest commit whose chart is the previous version: the parent of the commit that set
    the current version (HEAD itself when the working tree's bump is not committed yet)."""
    current = chart_version("")
    bump = None
    for commit in _git("rev-list", "HEAD", "--", f"{CHART_PATH}/Chart.yaml").split():
        if chart_version(commit) != current:
            return f"{bump}^" if bump else "HEAD"
        bump = commit
    raise LookupError(f"no earlier chart version than {current} in this clone's history "
                      "(a shallow clone? fetch with full history)")


def unpack_previous(dest: pathlib.Path) -> PreviousChart:
    """`git archive` of the previous version's chart, unpacked to dest/gpuplan."""
    ref = previous_commit()
    commit = _git("rev-parse", ref).strip()
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", commit,
                              CHART_PATH], capture_output=True, check=True,
                             timeout=GIT_TIMEOUT_S).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(dest, filter="data")
    (dest / CHART_PATH).rename(dest / "gpuplan")
    return PreviousChart(version=chart_version(commit), commit=commit, path=dest / "gpuplan")
