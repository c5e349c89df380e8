"""Engine creation, SQLite pragmas, retry with backoff, and automatic Alembic upgrade."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from alembic import command
from alembic.config import Config
from sqlalchemy import create_engine, event
from sqlalchemy.engine import URL, Engine, make_url
from sqlalchemy.exc import ArgumentError, OperationalError

from gpuplan_estimator.core import errors
from gpuplan_estimator.perfdb import migrations

T = TypeVar("T")

SQLITE_BUSY_TIMEOUT_SECONDS = 10.0
CONNECT_TIMEOUT_S = 10
MIGRATIONS_DIR = Path(migrations.__file__).resolve().parent


def parse_url(url: str) -> URL:
    """Parse a SQLAlchemy database URL; DatabaseError when it is malformed."""
    try:
        return make_url(url)
    except ArgumentError as exc:
        raise errors.DatabaseError(f"invalid database URL {url!r}: {exc}") from exc


def masked(url: str | URL) -> str:
    """The URL as text with any password replaced by ``***`` (safe for messages and logs)."""
    parsed = parse_url(url) if isinstance(url, str) else url
    return parsed.render_as_string(hide_password=True)


def _sqlite_pragmas(busy_timeout_seconds: float) -> Callable[[Any, Any], None]:
    def on_connect(dbapi_conn: Any, _record: Any) -> None:
        cur = dbapi_conn.cursor()
        # WAL lets readers (the estimator service) run while a benchmark writes.
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute(f"PRAGMA busy_timeout={int(busy_timeout_seconds * 1000)}")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.close()

    return on_connect


def create(url: str, *, busy_timeout_seconds: float = SQLITE_BUSY_TIMEOUT_SECONDS) -> Engine:
    """An engine for `url`; creates the SQLite file's directory. Does not connect."""
    parsed = parse_url(url)
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        db = parsed.database or ""
        if db and db != ":memory:" and not db.startswith("file:"):
            Path(db).expanduser().parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(parsed, connect_args={"timeout": busy_timeout_seconds})
        event.listen(engine, "connect", _sqlite_pragmas(busy_timeout_seconds))
        return engine
    connect_args: dict[str, Any] = {}
    if backend == "postgresql":
        connect_args["connect_timeout"] = CONNECT_TIMEOUT_S
    try:
        return create_engine(parsed, connect_args=connect_args, pool_pre_ping=True)
    except (ArgumentError, ModuleNotFoundError) as exc:
        raise errors.DatabaseError(f"cannot use database {masked(parsed)}: {exc}") from exc


def with_retry(
    fn: Callable[[], T],
    *,
    url: URL | str,
    retries: int,
    retry_delay_seconds: float,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """Run `fn`, retrying OperationalError (locked, unreachable) with exponential backoff."""
    attempt = 0
    while True:
        try:
            return fn()
        except OperationalError as exc:
            if attempt >= retries:
                reason = str(exc.orig) if exc.orig is not None else str(exc)
                raise errors.DatabaseError(
                    f"performance database {masked(url)} unavailable after "
                    f"{attempt + 1} attempt(s): {reason.strip()}"
                ) from exc
            sleep(retry_delay_seconds * (2**attempt))
            attempt += 1


def upgrade(engine: Engine) -> None:
    """Apply the packaged Alembic migrations up to head on `engine`."""
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "head")
