"""Engine creation, SQLite pragmas, retry with backoff, insert-or-ignore, and Alembic upgrade."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from alembic import command
from alembic.config import Config
from sqlalchemy import create_engine, event
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import URL, Engine, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, OperationalError

from gpuplan_estimator.core import errors
from gpuplan_estimator.perfdb import migrations

T = TypeVar("T")

SQLITE_BUSY_TIMEOUT_SECONDS = 10.0
CONNECT_TIMEOUT_S = 10
MIGRATIONS_DIR = Path(migrations.__file__).resolve().parent
# The two backends whose INSERT ... ON CONFLICT the store relies on for idempotent writes.
SUPPORTED_BACKENDS = ("sqlite", "postgresql")


def parse_url(url: str) -> URL:
    """Parse a SQLAlchemy database URL; DatabaseError when it is malformed."""
    try:
        return make_url(url)
    except (ArgumentError, ValueError) as exc:  # ValueError: a port that is not a number
        raise errors.DatabaseError(f"invalid database URL {_redacted(url)!r}: {exc}") from exc


def _redacted(url: str) -> str:
    """`url` with the password of ``scheme://user:password@host`` replaced by ``***``.

    For URLs that do not parse (so `masked` cannot be used) but may still hold a secret.
    """
    scheme, sep, rest = url.partition("://")
    creds, at, host = rest.rpartition("@")
    if not (sep and at and ":" in creds):
        return url
    user = creds.split(":", 1)[0]
    return f"{scheme}://{user}:***@{host}"


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
    if backend not in SUPPORTED_BACKENDS:
        raise errors.DatabaseError(
            f"cannot use database {masked(parsed)}: backend {backend!r} is not one of "
            f"{', '.join(SUPPORTED_BACKENDS)}"
        )
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
    """Run `fn`, retrying OperationalError (locked, unreachable) with exponential backoff.

    Every other error the database driver raises (a refused statement, a lost connection the
    driver calls an interface error) becomes `DatabaseError` at once: callers, such as the HTTP
    service answering 503, handle one error type for "the database failed".
    """
    attempt = 0
    while True:
        try:
            return fn()
        except OperationalError as exc:
            if attempt >= retries:
                raise errors.DatabaseError(
                    f"performance database {masked(url)} unavailable after "
                    f"{attempt + 1} attempt(s): {_reason(exc)}"
                ) from exc
            sleep(retry_delay_seconds * (2**attempt))
            attempt += 1
        except DBAPIError as exc:
            raise errors.DatabaseError(
                f"performance database {masked(url)} refused the operation: {_reason(exc)}"
            ) from exc


def _reason(exc: DBAPIError) -> str:
    return (str(exc.orig) if exc.orig is not None else str(exc)).strip()


def insert_ignoring_duplicates(
    engine: Engine, table: Any, *, index_elements: Sequence[str] | None = None
) -> postgresql.Insert | sqlite.Insert:
    """``INSERT ... ON CONFLICT DO NOTHING`` for `table` in the engine's dialect.

    Two writers adding the same row race between "is it there?" and the insert; letting the
    database skip the conflicting row makes the second writer a no-op instead of an
    IntegrityError. `index_elements` names the unique key when only that one may conflict.
    """
    return _dialect_insert(engine, table).on_conflict_do_nothing(index_elements=index_elements)


def upsert(
    engine: Engine, table: Any, *, index_elements: Sequence[str], values: Mapping[str, Any],
    update: Mapping[str, Any],
) -> postgresql.Insert | sqlite.Insert:
    """``INSERT values ... ON CONFLICT (index_elements) DO UPDATE SET update`` in one statement."""
    stmt = _dialect_insert(engine, table).values(**values)
    return stmt.on_conflict_do_update(index_elements=index_elements, set_=dict(update))


def _dialect_insert(engine: Engine, table: Any) -> postgresql.Insert | sqlite.Insert:
    name = engine.dialect.name
    if name == "postgresql":
        return postgresql.insert(table)
    if name == "sqlite":
        return sqlite.insert(table)
    raise errors.DatabaseError(
        f"database backend {name!r} is not one of {', '.join(SUPPORTED_BACKENDS)}"
    )


def upgrade(engine: Engine) -> None:
    """Apply the packaged Alembic migrations up to head on `engine`."""
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "head")
