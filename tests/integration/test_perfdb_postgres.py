"""PerfStore on a real PostgreSQL server started here, running the same contract as SQLite.

The fixture finds `initdb`/`pg_ctl` (Debian: /usr/lib/postgresql/<v>/bin, or /usr/local/bin;
package `postgresql`), initialises a cluster in a temporary directory and starts it on a free
port of 127.0.0.1 with its unix socket in that directory. PostgreSQL refuses to run as root,
so when the tests run as root the server runs as the unprivileged user `nobody` via
`runuser -u nobody --` (the temporary directory is chowned to it). Skipped when no PostgreSQL
binaries exist, but failed under CI=true.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuplan_estimator.core import errors
from gpuplan_estimator.perfdb.store import PerfStore
from gpuplan_testing import perfdb_contract as contract

pytestmark = pytest.mark.postgres

CMD_TIMEOUT_S = 60
UNPRIVILEGED_USER = "nobody"


def _find_bindir() -> Path | None:
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)
    candidates += ["/usr/local/bin", "/usr/bin"]
    on_path = shutil.which("initdb")
    if on_path:
        candidates.insert(0, str(Path(on_path).resolve().parent))
    for d in candidates:
        if (Path(d) / "initdb").exists() and (Path(d) / "pg_ctl").exists():
            return Path(d)
    return None


def _free_port() -> int:
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


@pytest.fixture(scope="module")
def pg_server() -> Iterator[str]:
    """URL of the `postgres` maintenance database of a freshly started server."""
    bindir = _find_bindir()
    if bindir is None:
        reason = "no PostgreSQL binaries (initdb/pg_ctl); apt-get install postgresql"
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    root = Path(tempfile.mkdtemp(prefix="gpuplan-pg-"))
    if os.geteuid() == 0:
        shutil.chown(root, user=UNPRIVILEGED_USER)
    data, port = root / "data", _free_port()
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


@pytest.fixture
def pg_store(pg_server: str, request: pytest.FixtureRequest) -> Iterator[PerfStore]:
    import psycopg

    name = "t_" + "".join(c if c.isalnum() else "_" for c in request.node.name)[:50].lower()
    admin = pg_server.replace("postgresql+psycopg", "postgresql") + "/postgres"
    with psycopg.connect(admin, autocommit=True, connect_timeout=10) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}"')
    with PerfStore.open(f"{pg_server}/{name}") as store:
        yield store


@pytest.mark.parametrize("name", sorted(contract.CONTRACT))
def test_store_contract_on_postgres(pg_store: PerfStore, name: str) -> None:
    contract.CONTRACT[name](pg_store)


def test_migrations_applied_once(pg_store: PerfStore) -> None:
    from sqlalchemy import text

    def versions(store: PerfStore) -> list[str]:
        with store.engine.connect() as conn:
            return [row[0] for row in conn.execute(text("select version_num from alembic_version"))]

    assert versions(pg_store) == ["0003"]
    run = pg_store.add_run(device="t4", backend="onnxruntime-1.23.2-cpu")
    assert pg_store.add_measurements(run, contract.frame(2)) == 2
    again = PerfStore.open(pg_store.engine.url.render_as_string(hide_password=False))
    try:  # a second open neither re-runs the migrations nor loses what is stored
        assert versions(again) == ["0003"]
        assert [r.id for r in again.runs()] == [run]
        assert len(again.measurements(run_id=run)) == 2
    finally:
        again.close()


def test_missing_database_is_a_clear_error(pg_server: str) -> None:
    with pytest.raises(errors.DatabaseError, match=r"gpuplan:\*\*\*@.*/nope"):
        PerfStore.open(f"{pg_server}/nope", retries=0)
