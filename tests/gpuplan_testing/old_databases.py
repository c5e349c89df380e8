"""Databases as an older gpuplan left them: migrated only to a given revision, with rows."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from sqlalchemy import text

from gpuplan_estimator.perfdb import connections


def database_at(url: str, revision: str,
                statements: Iterable[tuple[str, Mapping[str, Any]] | str]) -> None:
    """Create `url` at Alembic `revision` and run `statements` (SQL, or SQL with parameters)
    on it in the same transaction; the next `PerfStore.open` upgrades it to the head."""
    from alembic import command
    from alembic.config import Config

    engine = connections.create(url)
    cfg = Config()
    cfg.set_main_option("script_location", str(connections.MIGRATIONS_DIR))
    try:
        with engine.begin() as conn:
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, revision)
            for statement in statements:
                sql, params = (statement, {}) if isinstance(statement, str) else statement
                conn.execute(text(sql), dict(params))
    finally:
        engine.dispose()
