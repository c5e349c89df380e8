"""Where a number came from: the commit of the code that produced it."""

from __future__ import annotations

import os
import re
import subprocess
import tomllib
from collections.abc import Mapping
from pathlib import Path

from gpuplan_estimator.core import errors, paths

GIT_TIMEOUT_S = 5
COMMIT_ENV = "GPUPLAN_COMMIT"
"""Names the commit measured where the checkout travelled without `.git` (a lent GPU machine)."""
PROJECT_NAME = "gpuplan"
"""`[project] name` of the pyproject at the root of gpuplan's own checkout."""
UNKNOWN_COMMIT = "unknown"
"""What a person reads where no commit is known (a JSON field holds null instead)."""
_COMMIT_RE = re.compile(r"[0-9a-f]{7,64}")
_MAX_PYPROJECT_BYTES = 1 << 20


def git_commit(cwd: Path | None = None, *, short: bool = False) -> str:
    """HEAD of gpuplan's own checkout at `cwd` (default: `paths.REPO_ROOT`), or "" when `cwd`
    is not one: outside git (an installed wheel) and, what matters on a device copy without
    `.git`, inside some other repository that merely encloses `cwd` (its HEAD says nothing
    about this code)."""
    cwd = paths.REPO_ROOT if cwd is None else cwd
    if not is_project_root(cwd):
        return ""
    top = _git(cwd, "rev-parse", "--show-toplevel")
    if not top or Path(top).resolve() != cwd.resolve():
        return ""
    return _git(cwd, "rev-parse", *(["--short"] if short else []), "HEAD")


def code_commit(explicit: str | None = None, *, cwd: Path | None = None,
                environ: Mapping[str, str] | None = None) -> str | None:
    """The commit of the code producing a number: `explicit` (a ``--commit`` flag), else
    ``$GPUPLAN_COMMIT``, else git's HEAD of gpuplan's own checkout (`git_commit`); None when
    none of them knows. A given commit must be 7-64 lowercase hex digits."""
    env = os.environ if environ is None else environ
    for field, value in (("--commit", explicit), (COMMIT_ENV, env.get(COMMIT_ENV))):
        text = (value or "").strip()
        if text:
            if not _COMMIT_RE.fullmatch(text):
                raise errors.InvalidRequestError(
                    field, f"{text[:80]!r} is not a commit (7 to 64 lowercase hex digits)")
            return text
    return git_commit(cwd) or None


def is_project_root(directory: Path) -> bool:
    """Whether `directory` holds gpuplan's own pyproject.toml (``[project] name = "gpuplan"``)."""
    pyproject = directory / "pyproject.toml"
    try:
        if pyproject.stat().st_size > _MAX_PYPROJECT_BYTES:
            return False
        data = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return False
    project = data.get("project")
    return isinstance(project, dict) and project.get("name") == PROJECT_NAME


def _git(cwd: Path, *arguments: str) -> str:
    """git's stdout in `cwd`, stripped; "" when git is missing, fails or hangs."""
    try:
        done = subprocess.run(["git", "-C", str(cwd), *arguments], capture_output=True,
                              text=True, timeout=GIT_TIMEOUT_S, check=False)
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
