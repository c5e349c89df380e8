"""The model-bundle store contract (`gpuplan_testing.bundle_store_contract`) on a real
PostgreSQL server started here, as `tests/integration/test_perfdb_postgres.py` starts it
(initdb/pg_ctl on a free port, as `nobody` when run as root). Skipped when no PostgreSQL
binaries exist, failed under CI=true. Beyond the contract: two stores activating different
versions at the same moment leave one active (the store locks the table on PostgreSQL, where
two READ COMMITTED transactions would otherwise each retire the old row and both activate)."""

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

from gpuplan_estimator.perfdb.store import PerfStore
from gpuplan_testing import bundle_store_contract as contract

pytestmark = pytest.mark.postgres

CMD_TIMEOUT_S = 60
UNPRIVILEGED_USER = "nobody"


def _bindir() -> Path | None:
    on_path = shutil.which("initdb")
    candidates = [str(Path(on_path).resolve().parent)] if on_path else []
    candidates += sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)
    candidates += ["/usr/local/bin", "/usr/bin"]
    return next((Path(d) for d in candidates
                 if (Path(d) / "initdb").exists() and (Path(d) / "pg_ctl").exists()), None)


def _run(cmd: list[str]) -> None:
    full = ["runuser", "-u", UNPRIVILEGED_USER, "--", *cmd] if os.geteuid() == 0 else cmd
    done = subprocess.run(full, capture_output=True, text=True, timeout=CMD_TIMEOUT_S,
                          check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({done.returncode}): {done.stderr[-2000:]}")


@pytest.fixture(scope="module")
def pg_server() -> Iterator[str]:
    bindir = _bindir()
    if bindir is None:
        reason = "no PostgreSQL binaries (initdb/pg_ctl); apt-get install postgresql"
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    root = Path(tempfile.mkdtemp(prefix="gpuplan-pg-"))
    if os.geteuid() == 0:
        shutil.chown(root, user=UNPRIVILEGED_USER)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    data = root / "data"
    _run([str(bindir / "initdb"), "-D", str(data), "-U", "gpuplan", "-A", "trust",
          "--no-sync", "-E", "UTF8"])
    _run([str(bindir / "pg_ctl"), "-D", str(data), "-o",
          f"-p {port} -k {root} -h 127.0.0.1 -c fsync=off", "-l", str(root / "log"),
          "-w", "-t", str(CMD_TIMEOUT_S), "start"])
    try:
        yield f"postgresql+psycopg://gpuplan:secret@127.0.0.1:{port}"
    finally:
        _run([str(bindir / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop"])
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def pg_url(pg_server: str, request: pytest.FixtureRequest) -> str:
    import psycopg

    name = "b_" + "".join(c if c.isalnum() else "_" for c in request.node.name)[:50].lower()
    admin = pg_server.replace("postgresql+psycopg", "postgresql") + "/postgres"
    with psycopg.connect(admin, autocommit=True, connect_timeout=10) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}"')
    return f"{pg_server}/{name}"


@pytest.mark.parametrize("name", sorted(contract.CONTRACT))
def test_bundle_contract_on_postgres(pg_url: str, tmp_path: Path, name: str) -> None:
    with PerfStore.open(pg_url) as store:
        contract.CONTRACT[name](store, tmp_path)


def test_racing_activations_on_postgres(pg_url: str, tmp_path: Path) -> None:
    stores = [PerfStore.open(pg_url), PerfStore.open(pg_url)]
    try:
        contract.contract_racing_activations_leave_one_active(stores, tmp_path, trials=20)
    finally:
        for s in stores:
            s.close()
