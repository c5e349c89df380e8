"""Where a number came from: the commit of the code that produced it."""

from __future__ import annotations

import subprocess
from pathlib import Path

from gpuplan_estimator.core import paths

GIT_TIMEOUT_S = 5


def git_commit(cwd: Path = paths.REPO_ROOT, *, short: bool = False) -> str:
    """HEAD of the checkout at `cwd`, or "" outside a git checkout (an installed wheel)."""
    command = ["git", "-C", str(cwd), "rev-parse", *(["--short"] if short else []), "HEAD"]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=GIT_TIMEOUT_S,
                              check=False)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout.strip() if done.returncode == 0 else ""


def installed_version() -> str:
    """The installed `gpuplan` distribution's version, for every entry point's --version (a
    source tree without package metadata says so)."""
    from importlib import metadata

    try:
        return metadata.version("gpuplan")
    except metadata.PackageNotFoundError:
        return "(not installed)"
