"""Where gpuplan's files live: package data, the source checkout, the XDG data dir."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

PACKAGE_DATA_DIR = Path(__file__).resolve().parents[1] / "data"
"""Data shipped in the package: GPU catalog, model configs, the default bundle, CPU rows."""
REPO_ROOT = Path(__file__).resolve().parents[3]
"""The source checkout's root; meaningful only when running from one (not from a wheel)."""
DB_URL_ENV = "GPUPLAN_DB_URL"
DB_FILENAME = "perf.db"


def data_dir(environ: Mapping[str, str] | None = None) -> Path:
    """``$XDG_DATA_HOME/gpuplan``, else ``~/.local/share/gpuplan`` (not created here)."""
    env = os.environ if environ is None else environ
    base = env.get("XDG_DATA_HOME") or ""
    # The XDG spec says a relative XDG_DATA_HOME is invalid and must be ignored.
    root = Path(base) if base and os.path.isabs(base) else Path.home() / ".local" / "share"
    return root / "gpuplan"


def default_db_url(environ: Mapping[str, str] | None = None) -> str:
    """``$GPUPLAN_DB_URL`` when set, else a SQLite file in `data_dir`."""
    env = os.environ if environ is None else environ
    explicit = env.get(DB_URL_ENV, "").strip()
    if explicit:
        return explicit
    return f"sqlite:///{data_dir(env) / DB_FILENAME}"


FileStamp = tuple[int, int, int]
"""(st_mtime_ns, st_size, st_ino) of a file, followed through symlinks (a Secret volume swaps
its `..data` link): a file read again only when this changes is read once per rotation."""


def file_stamp(path: str) -> FileStamp:
    """`path`'s FileStamp; OSError when it cannot be read."""
    st = os.stat(path)
    return (st.st_mtime_ns, st.st_size, st.st_ino)
