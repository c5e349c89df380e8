"""PerfStore on SQLite: the shared store contract plus SQLite-, migration- and retry-specifics."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import text
from sqlalchemy.exc import OperationalError

from gpuplan_estimator.core import errors, paths
from gpuplan_estimator.perfdb import connections, default_db_url, tables
from gpuplan_estimator.perfdb.store import PerfStore
from gpuplan_testing import perfdb_contract as contract
from gpuplan_testing.old_databases import database_at


@pytest.fixture
def store(tmp_path: Path) -> Iterator[PerfStore]:
    with PerfStore.open(f"sqlite:///{tmp_path / 'sub' / 'perf.db'}") as s:
        yield s


@pytest.mark.parametrize("name", sorted(contract.CONTRACT))
def test_store_contract_on_sqlite(store: PerfStore, name: str) -> None:
    contract.CONTRACT[name](store)


def test_open_creates_dir_applies_migrations_and_wal(tmp_path: Path) -> None:
    db = tmp_path / "a" / "b" / "perf.db"
    with PerfStore.open(f"sqlite:///{db}") as store, store.engine.connect() as conn:
        assert conn.execute(text("select version_num from alembic_version")).scalar() == "0009"
        assert conn.execute(text("pragma journal_mode")).scalar() == "wal"
        assert conn.execute(text("pragma busy_timeout")).scalar() == 10_000
    assert db.exists()
    # Reopening an up-to-date database is a no-op, and data survives.
    with PerfStore.open(f"sqlite:///{db}") as again:
        assert again.runs() == []


def test_upgrade_from_0001_keeps_rows(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'old.db'}"
    database_at(url, "0001", [
        "insert into benchmark_runs (device, backend, backend_version, host, git_commit, "
            "command, started_at, status, sweep_digest, source, plan_json, settings_json) "
            "values ('cpu', 'b', '', '', '', '', '2025-01-01', 'done', '', '', '', '{}')",
        "insert into measurements (run_id, device, backend, kernel, op, dtype, dims, seq, "
            "feature_schema_version, latency_ms, repeats, source) values "
            "(1, 'cpu', 'b', 'gemm', 'matmul', 'float32', '{}', 0, 1, 2.5, 5, 'old')",
    ])
    with PerfStore.open(url) as store:
        got = store.measurements()
    assert got["latency_ms"].tolist() == [2.5]
    assert got["sm_clock_mhz"].isna().all()


def test_orm_models_match_the_migrations(store: PerfStore) -> None:
    with store.engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), tables.Base.metadata)
    assert diff == []


def test_default_url_honours_env_and_xdg(tmp_path: Path) -> None:
    assert default_db_url({"GPUPLAN_DB_URL": "postgresql+psycopg://h/db"}) == (
        "postgresql+psycopg://h/db"
    )
    assert default_db_url({"XDG_DATA_HOME": str(tmp_path)}) == (
        f"sqlite:///{tmp_path}/gpuplan/perf.db"
    )
    # A relative XDG_DATA_HOME is invalid per the XDG spec and ignored.
    assert paths.data_dir({"XDG_DATA_HOME": "rel"}) == Path.home() / ".local/share/gpuplan"


def test_open_without_url_uses_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPUPLAN_DB_URL", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    with PerfStore.open() as store:
        store.add_run(device="cpu", backend="b")
    assert (tmp_path / "gpuplan" / "perf.db").exists()


def test_with_retry_backs_off_then_succeeds() -> None:
    calls: list[int] = []
    sleeps: list[float] = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise OperationalError("stmt", {}, sqlite3.OperationalError("database is locked"))
        return "ok"

    got = connections.with_retry(flaky, url="sqlite://", retries=5, retry_delay_seconds=0.1,
                            sleep=sleeps.append)
    assert got == "ok"
    assert sleeps == [0.1, 0.2]


def test_locked_sqlite_gives_database_error_after_retries(tmp_path: Path) -> None:
    db = tmp_path / "perf.db"
    PerfStore.open(f"sqlite:///{db}").close()
    locker = sqlite3.connect(db, isolation_level=None)
    locker.execute("begin exclusive")
    try:
        store = PerfStore.open(f"sqlite:///{db}", retries=2, retry_delay_seconds=0.01,
                               busy_timeout_seconds=0.05)
        with pytest.raises(errors.DatabaseError, match=r"after 3 attempt\(s\).*locked"):
            store.add_run(device="cpu", backend="b")
    finally:
        locker.execute("rollback")
        locker.close()


def test_unreachable_server_error_masks_password() -> None:
    url = "postgresql+psycopg://gpuplan:s3cret@127.0.0.1:1/perf"
    with pytest.raises(errors.DatabaseError) as info:
        PerfStore.open(url, retries=1, retry_delay_seconds=0.01)
    message = str(info.value)
    assert "s3cret" not in message
    assert "gpuplan:***@127.0.0.1:1/perf" in message
    assert "after 2 attempt(s)" in message


@pytest.mark.parametrize(
    ("url", "match"),
    [("not a url", "invalid database URL"), ("nosuchdialect://x/y", "cannot use database")],
)
def test_bad_urls_are_clear(url: str, match: str) -> None:
    with pytest.raises(errors.DatabaseError, match=match):
        PerfStore.open(url, retries=0)


def test_injected_clock_stamps_rows(tmp_path: Path) -> None:
    import datetime as dt

    fixed = dt.datetime(2025, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
    clock: Callable[[], dt.datetime] = lambda: fixed  # noqa: E731
    with PerfStore.open(f"sqlite:///{tmp_path / 'p.db'}", clock=clock) as store:
        store.add_run(device="cpu", backend="b")
        assert store.runs()[0].started_at.replace(tzinfo=dt.UTC) == fixed
