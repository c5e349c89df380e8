"""A throwaway PostgreSQL server for tests: `initdb` + `pg_ctl` in a temporary directory.

Finds `initdb`/`pg_ctl` (Debian: /usr/lib/postgresql/<v>/bin, or /usr/local/bin; package
`postgresql`), initialises a cluster in a temporary directory and starts it on a free port of
127.0.0.1 with its unix socket in that directory. PostgreSQL refuses to run as root, so when the
tests run as root the server runs as the unprivileged user `nobody` via `runuser -u nobody --`
(the temporary directory is chowned to it). Used by tests/integration/test_perfdb_postgres.py
and test_retraining_loop.py.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

CMD_TIMEOUT_S = 60
UNPRIVILEGED_USER = "nobody"


def find_bindir() -> Path | None:
    """The directory holding `initdb` and `pg_ctl`, or None."""
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)
    candidates += ["/usr/local/bin", "/usr/bin"]
    on_path = shutil.which("initdb")
    if on_path:
        candidates.insert(0, str(Path(on_path).resolve().parent))
    for d in candidates:
        if (Path(d) / "initdb").exists() and (Path(d) / "pg_ctl").exists():
            return Path(d)
    return None


def free_port() -> int:
    """A TCP port of 127.0.0.1 free now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _as_server_user(cmd: list[str]) -> list[str]:
    if os.geteuid() != 0:
        return cmd
    return ["runuser", "-u", UNPRIVILEGED_USER, "--", *cmd]


def _run(cmd: list[str]) -> None:
    done = subprocess.run(_as_server_user(cmd), capture_output=True, text=True,
                          timeout=CMD_TIMEOUT_S, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({done.returncode}): {done.stderr[-2000:]}")


def require_bindir() -> Path:
    """`find_bindir()`, else skip (fail under CI=true)."""
    bindir = find_bindir()
    if bindir is None:
        reason = "no PostgreSQL binaries (initdb/pg_ctl); apt-get install postgresql"
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    return bindir


@contextlib.contextmanager
def running_server() -> Iterator[str]:
    """URL (without a database name) of a freshly started server; stopped and removed after."""
    bindir = require_bindir()
    root = Path(tempfile.mkdtemp(prefix="gpuplan-pg-"))
    if os.geteuid() == 0:
        shutil.chown(root, user=UNPRIVILEGED_USER)
    data, port = root / "data", free_port()
    _run([str(bindir / "initdb"), "-D", str(data), "-U", "gpuplan", "-A", "trust",
          "--no-sync", "-E", "UTF8"])
    opts = f"-p {port} -k {root} -h 127.0.0.1 -c fsync=off"
    _run([str(bindir / "pg_ctl"), "-D", str(data), "-o", opts, "-l", str(root / "log"),
          "-w", "-t", str(CMD_TIMEOUT_S), "start"])
    try:
        yield f"postgresql+psycopg://gpuplan:secret@127.0.0.1:{port}"
    finally:
        _run([str(bindir / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop"])
        shutil.rmtree(root, ignore_errors=True)


def create_database(server_url: str, name: str) -> str:
    """(Re)create database `name` on the server; returns its SQLAlchemy URL."""
    import psycopg

    admin = server_url.replace("postgresql+psycopg", "postgresql") + "/postgres"
    with psycopg.connect(admin, autocommit=True, connect_timeout=10) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}"')
    return f"{server_url}/{name}"
